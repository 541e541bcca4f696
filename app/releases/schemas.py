"""Bodies of the quantile query and release endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from app.core.amounts import AmountPublic, DecimalText
from app.core.text import StorableText
from app.mechanisms import MECHANISMS

#: ``method: "auto"``: the planner picks the fastest eligible method (run-time bounds in
#: quarter-second steps) whose expected error is within 10 % of the lowest
#: (app.planner.recommend).
AUTO = "auto"
#: The method names of the OpenAPI enum: the mechanism registry, whatever it holds, and auto.
METHOD_NAMES = (*MECHANISMS, AUTO)

PositiveDecimal = Annotated[Decimal, Field(gt=0, max_digits=40, decimal_places=30)]
#: The most keys one grouped release may answer, and the most estimates (keys x quantiles)
#: it may hold: the bound that keeps a release readable in one response.
MAX_GROUP_KEYS = 10_000
MAX_GROUPED_ESTIMATES = 100_000
GroupKey = Annotated[StorableText, Field(min_length=1, max_length=200)]
#: A group's public approximate size (rows), typed by the caller.
GroupSizeHint = Annotated[int, Field(ge=1, le=10**12)]


def _keys_kind(value: object) -> str:
    return "discover" if isinstance(value, str) else "list"


#: ``keys``: a list of keys or ``"discover"``; the tag picks the member from the JSON type,
#: so an error names the problem (``body.keys.list.3: ...``), not every member's failure.
GroupKeys = Annotated[
    Annotated[list[GroupKey], Field(min_length=1, max_length=MAX_GROUP_KEYS), Tag("list")]
    | Annotated[Literal["discover"], Tag("discover")],
    Discriminator(_keys_kind),
]


class Selection(BaseModel):
    """Partition selection for ``"keys": "discover"``: its own (epsilon, delta), debited
    with the release, and the most keys it may answer (public: it sets the release's
    publication time)."""

    model_config = ConfigDict(extra="forbid")

    epsilon: PositiveDecimal = Field(description="Epsilon of the selection.")
    delta: PositiveDecimal = Field(
        lt=1,
        description="Delta of the selection (keys one unit adds are kept with at most "
        "this probability).",
    )
    max_keys: int = Field(
        default=1000,
        ge=1,
        le=MAX_GROUP_KEYS,
        description="Answer at most this many of the selected keys (the first in key order).",
    )


class SelectionPublic(BaseModel):
    """A release's partition selection, as stored."""

    epsilon: DecimalText
    delta: DecimalText
    max_keys: int


class QuantileQuery(BaseModel):
    """An analyst's question: which quantiles, with which method, at what privacy cost."""

    model_config = ConfigDict(extra="forbid")

    quantiles: list[float] = Field(
        min_length=1, description="Strictly increasing, each strictly inside (0, 1)."
    )
    epsilon: PositiveDecimal = Field(description="Epsilon for the whole m-quantile release.")
    method: str = Field(
        default="jointexp",
        min_length=1,
        max_length=64,
        json_schema_extra={"enum": list(METHOD_NAMES)},
        description="A registered mechanism (GET /v1/methods), or `auto`: among the methods "
        "the query allows (pure epsilon-DP ones always, approximate ones only when delta is "
        "given) whose public run-time bound fits the release time limit, the planner picks "
        "the one least behind the best in every regime it cannot see (distinct values, "
        "ties, a clamped share; ties may cost up to 3x before they count), the fastest of "
        "those within 10 % (run-time bounds compared in 0.25 s steps), with "
        "jointexp_smooth in jointexp's place; where the public figures force ties (more "
        "records than grid points) jointexp_smooth unless it is expected to be 3x behind; "
        "the release records the method chosen.",
    )
    delta: PositiveDecimal | None = Field(
        default=None, description="Only for methods that need one (approximate DP / zCDP)."
    )
    column: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The numeric column to read; may be left out where the dataset has only "
        "one numeric column (required, else 422).",
    )
    group_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A categorical column: answer the quantiles once per key, in one release "
        "that costs the epsilon asked (the groups are disjoint; docs/mechanisms.md, "
        "'Grouped releases'). The keys answered are `keys`, else the column's declared keys.",
    )
    keys: GroupKeys | None = Field(
        default=None,
        description="With group_by: the keys to answer (public: typed by the caller). Every "
        "key gets an answer, including keys with no rows (then the answer is noise: leaving "
        "it out would reveal that the group is empty). Default: the column's declared keys. "
        '`"discover"`: the keys come from the data through differentially private partition '
        "selection (`selection`, debited on top of epsilon); only the selected keys are "
        "answered and named.",
    )
    selection: Selection | None = Field(
        default=None, description='With "keys": "discover": the selection\'s parameters.'
    )
    size_hints: dict[GroupKey, GroupSizeHint] | None = Field(
        default=None,
        max_length=MAX_GROUP_KEYS,
        description="With group_by: public approximate sizes (rows) of some or all keys, "
        "typed by the caller (never checked against the data, never read from it). Each "
        "hinted group gets an expected error (`groups[].expected_error`) and error bars "
        "(`groups[].intervals`) at its hint; with a hint for every key, `auto` ranks the "
        "methods at the median hint. Keys must be among `keys` (any key with "
        '`"discover"`; a hinted key the selection drops is not named).',
        examples=[{"north": 12000, "south": 800}],
    )

    @field_validator("quantiles")
    @classmethod
    def _increasing(cls, value: list[float]) -> list[float]:
        for i, q in enumerate(value):
            if not 0.0 < q < 1.0:
                raise ValueError(f"quantiles[{i}] must lie strictly inside (0, 1)")
            if i and not value[i - 1] < q:
                raise ValueError(
                    f"quantiles[{i}] must be greater than quantiles[{i - 1}] (strictly increasing)"
                )
        return value

    @field_validator("keys")
    @classmethod
    def _distinct(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, list) and len(set(value)) != len(value):
            raise ValueError("keys must be distinct")
        return value


#: The description of ``bound90_each_atom`` (three models carry it).
ATOM_BOUND = (
    "`bound90_each` where the data hold an atom at a public bound (values clamped there): "
    "the error model fitted on such data, never below `bound90_each`. Whether the data do "
    "is private, but a release that puts an estimate at a bound shows it: its error bars "
    "then span this bound instead (post-processing of the release). Null on releases "
    "stored before it was computed."
)


class ExpectedError(BaseModel):
    """A-priori error of one quantile, in missed points (data points between the true
    quantile and the estimate), from public figures only (see GET /v1/methods, README)."""

    quantile: float
    mean: float = Field(description="Expected missed points.")
    bound90: float = Field(description="Missed points stayed below this in 90 % of trials.")
    bound90_each: float | None = Field(
        default=None,
        description="One estimate's missed points stayed below this in 90 % of trials (the "
        "span of its error bar); `bound90` bounds their mean over the release's quantiles, "
        "which varies less. Null on releases stored before it was computed.",
    )
    bound90_each_atom: float | None = Field(default=None, description=ATOM_BOUND)
    size: int | None = Field(
        default=None,
        description="The public size (rows) the figures are computed at: n under swap "
        "neighbours, the dataset's size hint under add_remove (where n is private).",
    )


class EstimateInterval(BaseModel):
    """An error bar in the data's units for one estimate: post-processing of public figures
    and the release's own estimates, no extra budget. An approximation, not a guarantee."""

    quantile: float
    low: float = Field(description="Lower end (a grid point at or below the estimate).")
    high: float = Field(description="Upper end (a grid point at or above the estimate).")


class SizeError(BaseModel):
    """The expected error of a group of a given size (missed points per quantile)."""

    size: int = Field(description="Rows in the group.")
    mean: float = Field(description="Expected missed points per quantile.")
    bound90: float = Field(description="Missed points stayed below this in 90 % of trials.")
    bound90_each: float | None = Field(
        default=None,
        description="One estimate's missed points stayed below this in 90 % of trials (the "
        "span of its error bar); `bound90` bounds their mean over the release's quantiles, "
        "which varies less. Null on releases stored before it was computed.",
    )
    bound90_each_atom: float | None = Field(default=None, description=ATOM_BOUND)


class KeySizeError(BaseModel):
    """The expected error of one hinted group, at the size hint the query gave it."""

    key: str
    size: int = Field(description="The query's size hint for the key (public), never its rows.")
    mean: float = Field(description="Expected missed points per quantile at that size.")
    bound90: float = Field(description="Missed points stayed below this in 90 % of trials.")
    bound90_each: float | None = Field(
        default=None,
        description="One estimate's missed points stayed below this in 90 % of trials (the "
        "span of its error bar); `bound90` bounds their mean over the release's quantiles, "
        "which varies less. Null on releases stored before it was computed.",
    )
    bound90_each_atom: float | None = Field(default=None, description=ATOM_BOUND)


class GroupError(BaseModel):
    """A grouped release's expected error as a function of group size: group sizes are
    private, so no figure is given per group from the data; read a group's line at the size
    you expect, or give ``size_hints`` in the query (``by_key``)."""

    by_size: list[SizeError] | None = Field(
        description="Expected error at group sizes 10 to 10^6 (null: the method has no model)."
    )
    min_size: int | None = Field(
        description="Groups with fewer rows than this get answers that are mostly noise "
        "(expected error at least 5 % of the group's ranks); null: unknown."
    )
    by_key: list[KeySizeError] | None = Field(
        default=None,
        description="The hinted keys' expected error at their hints (the query's "
        "`size_hints`), in the order given; null without hints or model.",
    )


class GroupEstimates(BaseModel):
    """One group of a grouped release."""

    key: str
    estimates: list[float] | None = Field(description="The answer; null unless done.")
    expected_error: SizeError | None = Field(
        default=None,
        description="The expected error at the key's size hint (`size_hints` in the query); "
        "null for a key without one.",
    )
    intervals: list[EstimateInterval] | None = Field(
        default=None,
        description="Error bars in the data's units, as the release's `intervals`, at the "
        "key's size hint (post-processing, no extra budget; an approximation that is only as "
        "good as the hint); null until done and for a key without a hint.",
    )


ReleaseStatus = Literal["pending", "done", "failed"]
FailureReason = Literal["timeout", "mechanism_error", "worker_lost", "dataset_archived", "restored"]


class RhoCost(BaseModel):
    """A release's rho in a zCDP table."""

    cost: DecimalText
    remaining: DecimalText


class ReleasePublic(BaseModel):
    """A stored release. Reading it again is free; a finished release reads as the same bytes.

    ``status`` is ``pending`` (paid, the mechanism has not answered yet), ``done``
    (``estimates`` holds the answer) or ``failed`` (``failure`` says why; the cost stays
    debited, because whether and when a run fails may depend on the data). ``cost`` was
    debited when the release was reserved; ``remaining`` is the budget right after that.
    """

    id: uuid.UUID
    dataset_id: uuid.UUID
    status: ReleaseStatus
    method: str
    column: str = Field(default="value", description="The numeric column the release read.")
    quantiles: list[float]
    estimates: list[float] | None = Field(description="The answer; null unless status is done.")
    failure: FailureReason | None = Field(description="Why the release failed; null otherwise.")
    epsilon: DecimalText
    delta: DecimalText | None
    cost: AmountPublic = Field(
        description="What was debited: (epsilon, delta) in a pure table; in a zCDP table the "
        "query's (epsilon, delta) as asked, and `rho` what was debited."
    )
    remaining: AmountPublic | None = Field(
        description="The (epsilon, delta) left right after this release (pure tables); null "
        "in a zCDP table, whose balance is `rho`."
    )
    rho: RhoCost | None = Field(
        default=None, description="zCDP tables: the rho debited and the rho left after it."
    )
    created_at: datetime = Field(description="When the release was reserved (and paid).")
    finished_at: datetime | None = Field(
        description="When the release was published: its run's start plus a run-time bound "
        "computed from public figures (or its finish, if the run took longer); until then "
        "non-admin readers see the release as pending. Admins see the run's finish time."
    )
    expected_error: list[ExpectedError] | None = Field(
        default=None,
        description="A-priori expected error of the method (computed at reservation from "
        "public figures); null when unknown (add_remove dataset without a size_hint).",
    )
    intervals: list[EstimateInterval] | None = Field(
        default=None,
        description="Error bars in the data's units, one per estimate, for 90 % nominal "
        "coverage: the values between the levels q -/+ (bound90_each + 1)/size on the "
        "piecewise-linear curve through the release's own estimates (continued beyond the "
        "outermost ones at twice the nearest slope, within the public bounds), widened to "
        "the grid; `bound90_each_atom` in place of `bound90_each` where an estimate lies at "
        "a public bound (values clamped there). Post-processing: no extra budget. An "
        "approximation, not a guarantee: it inherits the planner's fitted bound and assumes "
        "the quantile function is near linear between released levels (measured coverage "
        "per data shape: docs/experiments.md). Null until done, where the expected error "
        "is unknown, and for grouped releases (whose hinted groups carry their own: "
        "`groups[].intervals`).",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="E.g. the expected error is a large share of the ranks: noise.",
    )
    data_version: int | None = Field(
        default=None,
        description="The dataset's data version the release ran on (every upload or append "
        "adds one); null until it is done, and for failed releases.",
    )
    group_by: str | None = Field(
        default=None, description="A grouped release: the categorical column it groups by."
    )
    groups: list[GroupEstimates] | None = Field(
        default=None,
        description="A grouped release: one entry per key, in the order asked (`estimates` "
        "is then null). At most 10,000 keys and 100,000 estimates per release.",
    )
    group_error: GroupError | None = Field(
        default=None, description="A grouped release: the expected error by group size."
    )
    selection: SelectionPublic | None = Field(
        default=None,
        description="Keys discovered by partition selection: its parameters (its epsilon and "
        "delta are included in `cost`); `groups` then lists only the keys it kept, once done.",
    )


class QuoteFigures(BaseModel):
    """What one method would cost and how accurate it is expected to be."""

    method: str
    cost: AmountPublic = Field(description="Exactly what the release would debit.")
    remaining_after: AmountPublic | None = Field(
        description="The dataset's budget after that debit; null when unaffordable."
    )
    affordable: bool = Field(
        description="The dataset's remaining budget (and the key's cap, if any) covers it."
    )
    rho: DecimalText | None = Field(
        default=None, description="zCDP tables: the rho the release would debit."
    )
    releases_left: int | None = Field(
        default=None,
        description="How many releases of exactly this query the dataset's balance pays for "
        "(null: it costs nothing).",
    )
    expected_error: list[ExpectedError] | None = Field(
        description="Per quantile, in missed points; null when unknown (add_remove dataset "
        "without a size_hint, or a method the planner has no model for)."
    )
    group_error: GroupError | None = Field(
        default=None, description="A grouped query: the expected error by group size."
    )


class QuotePublic(QuoteFigures):
    """The quote of a query: free, moves no budget, reads no value, public figures only."""

    warnings: list[str]
    alternatives: list[QuoteFigures] = Field(
        description="The same figures for every method eligible for this query."
    )


class MethodPublic(BaseModel):
    """A registered method."""

    name: str
    guarantee: Literal["pure_dp", "approx_dp", "zcdp"] = Field(
        description="The notion the method is proven in (zcdp is priced as (epsilon, delta)-DP)."
    )
    neighbors: list[str] = Field(description="Neighbour relations its analysis covers.")
    needs_delta: bool
    description: str
    zcdp: str | None = Field(
        default=None,
        description="In a zCDP table: the rho one release debits and why; null where the "
        "method is refused there (proven only in (epsilon, delta)-DP).",
    )


class ReleasePage(BaseModel):
    """A page of releases, newest first."""

    items: list[ReleasePublic]
    next_cursor: str | None


class BudgetExhausted(BaseModel):
    """409 body when a query costs more than remains: the figures and nothing else."""

    type: Literal["budget_exhausted"] = "budget_exhausted"
    detail: str
    requested: AmountPublic
    remaining: AmountPublic


class KeyCap(BaseModel):
    """A key's spending cap; a null component is not capped."""

    epsilon: DecimalText | None
    delta: DecimalText | None


class KeyBudgetExhausted(BaseModel):
    """409 body when a query would take the calling key over its cap: the key's figures only."""

    type: Literal["key_budget_exhausted"] = "key_budget_exhausted"
    detail: str
    cap: KeyCap
    spent: AmountPublic
    requested: AmountPublic


class MethodFacts(BaseModel):
    """A method's registry entry."""

    name: str
    description: str
    guarantee: Literal["pure_dp", "approx_dp", "zcdp"]
    neighbors: list[str]
    zcdp: str | None = Field(description="Its rho in a zCDP table and why (null: refused there).")


class DataFacts(BaseModel):
    """The public description of the data a release read."""

    column: str
    lower: float
    upper: float
    granularity: float
    neighbors: str
    accounting: Literal["pure", "zcdp"]
    accounting_delta: str | None
    privacy_unit: str | None
    max_rows_per_unit: int


class Alternative(BaseModel):
    """Another eligible method for the same query, on today's public figures."""

    method: str
    expected_error: list[ExpectedError] | None
    affordable_now: bool


class ReleaseExplanation(BaseModel):
    """A release explained: its method and guarantee, the data's public description, and
    the planner's view of the same query today (public figures only)."""

    release: ReleasePublic
    method: MethodFacts
    data: DataFacts
    auto_today: str | None = Field(
        description="The method `auto` would pick for this query today (null: none would)."
    )
    alternatives: list[Alternative]
    reading: list[str] = Field(description="How to read the figures.")
    explained_at: datetime
