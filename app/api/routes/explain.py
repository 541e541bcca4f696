"""``GET /v1/releases/{id}/explanation``: what a release is, in words and public figures."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

from fastapi import APIRouter, Request

from app.api.deps import ReaderDep, SessionDep
from app.api.http import DecimalJSONRoute
from app.api.routes.releases import present
from app.core.errors import DpquantError, error_responses, not_found
from app.datasets.models import Dataset
from app.mechanisms import MECHANISMS
from app.releases import planning, service
from app.releases.models import Release
from app.releases.schemas import QuantileQuery, ReleaseExplanation, Selection

router = APIRouter(prefix="/v1", tags=["releases"], route_class=DecimalJSONRoute)

READING = [
    "Expected error is in missed points: the number of data points between the true "
    "quantile and the estimate. `mean` is its a-priori mean per quantile, `bound90` a value "
    "that mean over the release's quantiles stayed below in 90 % of trials and "
    "`bound90_each` the same for any one estimate (wider: one estimate varies more than a "
    "mean), all computed before the release from public figures only.",
    "Estimates lie on the column's public grid (lower + k·granularity); values outside "
    "[lower, upper] were moved to the nearest bound before the release (how many is "
    "admin-only, since it depends on the data).",
    "The cost was debited when the release was reserved, whatever its outcome; reading the "
    "release and this explanation is free.",
    "Error bars (intervals) are in the data's units: for each estimate, the values between "
    "the levels q -/+ (bound90_each + 1)/size on the curve through the release's own "
    "estimates (steeper beyond the outermost ones, within the bounds), widened to the grid. "
    "Where the release puts an estimate at a public bound, which shows values clamped "
    "there, they span `bound90_each_atom` instead (the error model fitted on such data). "
    "They cost nothing (post-processing) and are approximate: they aim at 90 % coverage, "
    "inherit the expected error's model and assume the data's quantile function is near "
    "linear between released levels; tied data and small epsilon can be covered "
    "more or less often (measured per data shape in docs/experiments.md).",
]
GROUPED_READING = (
    "A grouped release answers every key with the method run on that key's rows alone; the "
    "whole release costs the epsilon shown, however many keys (the groups are disjoint and "
    "each is calibrated for the row changes one unit can make across them). A key with no "
    "rows is answered too, with noise: leaving it out would reveal that it is empty. Group "
    "sizes are private, so the expected error is given by group size (group_error), and "
    "per key only at the size hints the query gave (public; never checked against the data): "
    "those keys' error bars are only as good as their hints."
)


@router.get(
    "/releases/{release_id}/explanation",
    response_model=ReleaseExplanation,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Explain a release: its method and guarantee, the data's public description, "
    "and what the planner would choose today",
)
def explain_release(
    release_id: uuid.UUID, request: Request, session: SessionDep, principal: ReaderDep
) -> ReleaseExplanation:
    """Everything here is public: the release as its reader sees it, the method's registry
    entry, the column's bounds and grid, the table's neighbour relation and accounting, and
    the quote of the same query on today's public figures (which method `auto` would pick
    and every eligible method's expected error). Free; reads no data value."""
    row = session.get(Release, release_id)
    if row is None or not principal.can_see(row.dataset_id):
        raise not_found("release")
    release = service.ReleaseRecord.of(row)
    view = present(release, principal)
    dataset = session.get(Dataset, release.dataset_id)
    if dataset is None:  # pragma: no cover - a release's dataset is never deleted
        raise DpquantError(404, "not_found", "release not found")
    column = next(c for c in dataset.columns if c.name == release.column_name)
    mech = MECHANISMS[release.method]
    stored = release.group_keys
    keys: list[str] | Literal["discover"] | None = None
    selection = None
    if isinstance(stored, dict):  # a discovery: stored as its selection's parameters
        keys, selection = "discover", Selection(**stored["discover"])
    else:
        keys = stored
    hints = {
        str(row["key"]): int(row["size"]) for row in (release.group_error or {}).get("by_key") or []
    }
    query = QuantileQuery(
        quantiles=release.quantiles,
        epsilon=release.epsilon,
        delta=release.delta,
        method="auto",
        column=None if len([c for c in dataset.columns if c.numeric]) == 1 else column.name,
        group_by=release.group_by,
        keys=keys,
        selection=selection,
        size_hints=hints or None,
    )
    alternatives: list[dict[str, object]] = []
    auto_today: str | None = None
    if dataset.archived_at is None:
        try:
            quote = planning.quote_query(
                session,
                principal=principal,
                dataset_id=dataset.id,
                query=query,
                max_quantiles=request.app.state.settings.max_quantiles,
                limits=planning.RunLimits.of(request.app.state.settings),
            )
            auto_today = quote.chosen.method
            alternatives = [
                {"method": line.method, "expected_error": line.expected,
                 "affordable_now": line.affordable}
                for line in quote.alternatives
            ]  # fmt: skip
        except DpquantError:
            pass  # e.g. parameters no method accepts today: the stored release stands
    return ReleaseExplanation.model_validate(
        {
            "release": view.model_dump(mode="json"),
            "method": {
                "name": mech.name,
                "description": mech.summary,
                "guarantee": mech.notion.value,
                "neighbors": list(mech.neighbors),
                "zcdp": mech.zcdp_basis if mech.zcdp_fn is not None else None,
            },
            "data": {
                "column": column.name,
                "lower": column.lower,
                "upper": column.upper,
                "granularity": column.granularity,
                "neighbors": dataset.neighbors,
                "accounting": dataset.accounting,
                "accounting_delta": None
                if dataset.accounting_delta is None
                else str(Decimal(dataset.accounting_delta)),
                "privacy_unit": dataset.privacy_unit,
                "max_rows_per_unit": dataset.max_rows_per_unit,
            },
            "auto_today": auto_today,
            "alternatives": alternatives,
            "reading": READING if release.group_by is None else [*READING, GROUPED_READING],
            "explained_at": datetime.now(UTC),
        }
    )
