"""Typed views of the service's JSON (tolerant: unknown fields are kept, not refused)."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["admin", "analyst", "viewer"]
Status = Literal["pending", "done", "failed"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False)


class Amount(_Model):
    """An (epsilon, delta) pair; exact decimals."""

    epsilon: Decimal
    delta: Decimal


class RhoFigures(_Model):
    """A zCDP table's balance in rho."""

    granted: Decimal
    spent: Decimal
    remaining: Decimal


class ReleasesLeft(_Model):
    """How many more releases of a typical query (JointExp at ``epsilon``) the budget pays."""

    epsilon: Decimal
    method: str = "jointexp"
    count: int | None = None


class Budget(_Model):
    """Granted, spent (sum of debits) and remaining; in a zCDP table (``accounting`` zcdp)
    the balance is ``rho`` and ``guarantee`` the (epsilon, delta) the rho spent gives."""

    dataset_id: uuid.UUID
    granted: Amount
    spent: Amount
    remaining: Amount
    accounting: Literal["pure", "zcdp"] = "pure"
    rho: RhoFigures | None = None
    guarantee: Amount | None = None
    releases_left: ReleasesLeft | None = None


class Dataset(_Model):
    """A dataset; ``n`` and the upload fields are only filled for admin keys."""

    id: uuid.UUID
    name: str
    description: str = ""
    lower: float
    upper: float
    neighbors: Literal["swap", "add_remove"]
    granularity: float
    budget_remaining: Amount
    created_at: datetime
    n: int | None = None
    n_outside_bounds: int | None = None
    values_uploaded_at: datetime | None = None
    frozen_at: datetime | None = None
    archived_at: datetime | None = None
    columns: list[dict[str, Any]] = []
    privacy_unit: str | None = None
    max_rows_per_unit: int = 1
    max_groups_per_unit: int = 1
    accounting: Literal["pure", "zcdp"] = "pure"
    accounting_delta: Decimal | None = None
    rows_dropped: int | None = None
    units: int | None = None


class ExpectedError(_Model):
    """A-priori error of one quantile, in missed points (public figures only)."""

    quantile: float
    mean: float
    bound90: float  # bounds the mean over the release's quantiles in 90 % of trials
    size: int | None = None  # the public size the figures assume (n, or the size hint)
    bound90_each: float | None = None  # bounds any one estimate (the error bars' span)
    # the same where the data hold an atom at a public bound (bars span it when the release
    # puts an estimate at a bound)
    bound90_each_atom: float | None = None


class EstimateInterval(_Model):
    """An error bar in the data's units for one estimate (90 % nominal; an approximation
    computed from public figures and the release's own estimates, at no extra budget)."""

    quantile: float
    low: float
    high: float


class SizeError(_Model):
    """Expected missed points per quantile for a group of ``size`` rows."""

    size: int
    mean: float
    bound90: float
    bound90_each: float | None = None
    bound90_each_atom: float | None = None


class KeySizeError(SizeError):
    """A hinted key's expected error at its size hint (``size``: the hint, never its rows)."""

    key: str


class Group(_Model):
    """One group of a grouped release: its key, its estimates (None until done) and, for a
    key the query gave a size hint, the expected error and error bars at that hint."""

    key: str
    estimates: list[float] | None = None
    expected_error: SizeError | None = None
    intervals: list[EstimateInterval] | None = None


class GroupError(_Model):
    """A grouped release's expected error by group size, and the size below which an
    answer is mostly noise."""

    by_size: list[SizeError] | None = None
    min_size: int | None = None
    by_key: list[KeySizeError] | None = None


class Release(_Model):
    """A release. ``estimates`` is None until ``status`` is ``done``; a grouped release
    (``group_by``) has ``groups`` instead, one per key."""

    id: uuid.UUID
    dataset_id: uuid.UUID
    method: str
    column: str = "value"
    data_version: int | None = None
    quantiles: list[float]
    estimates: list[float] | None = None
    epsilon: Decimal
    delta: Decimal | None = None
    cost: Amount
    remaining: Amount | None = None
    rho: dict[str, Decimal] | None = None  # zCDP tables: {"cost", "remaining"}
    expected_error: list[ExpectedError] | None = None
    intervals: list[EstimateInterval] | None = None
    warnings: list[str] = Field(default_factory=list)
    created_at: datetime
    status: Status = "done"  # servers before asynchronous releases only store done ones
    group_by: str | None = None
    groups: list[Group] | None = None
    group_error: GroupError | None = None
    replayed: bool = Field(default=False, exclude=True)

    def to_pandas(self) -> Any:
        """The release as a ``pandas.DataFrame``: one row per quantile (``quantile``,
        ``estimate`` and, where the server gave them, the expected error's figures and the
        error bar's ``low`` and ``high``), or for
        a grouped release one row per (group, quantile) with the key in a column named
        after ``group_by``. pandas is not a dependency of the client: install it to use
        this."""
        try:
            import pandas as pd  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise ImportError("Release.to_pandas() needs pandas: pip install pandas") from None
        if self.groups is not None:
            name = self.group_by or "group"
            grouped: list[dict[str, Any]] = []
            for group in self.groups:
                for i, q in enumerate(self.quantiles):
                    entry: dict[str, Any] = {
                        name: group.key,
                        "quantile": q,
                        "estimate": None if group.estimates is None else group.estimates[i],
                    }
                    if group.expected_error is not None:
                        entry.update(expected_mean=group.expected_error.mean,
                                   expected_bound90=group.expected_error.bound90)  # fmt: skip
                    if group.intervals is not None and i < len(group.intervals):
                        entry.update(low=group.intervals[i].low, high=group.intervals[i].high)
                    grouped.append(entry)
            return pd.DataFrame(grouped)
        rows: list[dict[str, Any]] = []
        expected = self.expected_error or []
        for i, q in enumerate(self.quantiles):
            row: dict[str, Any] = {
                "quantile": q,
                "estimate": None if self.estimates is None else self.estimates[i],
            }
            if i < len(expected):
                row.update(expected_mean=expected[i].mean, expected_bound90=expected[i].bound90)
            if self.intervals is not None and i < len(self.intervals):
                row.update(low=self.intervals[i].low, high=self.intervals[i].high)
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def failed(self) -> bool:
        return self.status == "failed"


class LedgerEntry(_Model):
    """One ledger row (grant or debit)."""

    id: int
    dataset_id: uuid.UUID
    kind: Literal["grant", "debit"]
    epsilon: Decimal
    delta: Decimal
    rho: Decimal = Decimal(0)
    reason: str | None = None
    release_id: uuid.UUID | None = None
    api_key_id: uuid.UUID | None = None
    created_at: datetime


class Key(_Model):
    """An API key as listed (never the secret)."""

    id: uuid.UUID
    prefix: str
    role: Role
    dataset_id: uuid.UUID | None = None
    name: str = ""
    created_at: datetime
    revoked_at: datetime | None = None
    max_epsilon: Decimal | None = None
    max_delta: Decimal | None = None
    spent_epsilon: Decimal | None = None
    spent_delta: Decimal | None = None
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    rotated_at: datetime | None = None


class KeyCreated(Key):
    """A new key with its secret, shown once."""

    key: str


class Me(_Model):
    """The calling key: id, role, dataset scope."""

    id: uuid.UUID
    role: Role
    dataset_id: uuid.UUID | None = None


class Quote(_Model):
    """What a query would cost, before spending (servers with the quote endpoint)."""

    method: str | None = None
    cost: Amount | None = None
    remaining_after: Amount | None = None
    affordable: bool | None = None
    rho: Decimal | None = None
    releases_left: int | None = None
    expected_error: list[ExpectedError] | None = None
    group_error: GroupError | None = None
    warnings: list[str] = Field(default_factory=list)
    alternatives: list[Any] = Field(default_factory=list)


class Method(_Model):
    """A registered method, as ``GET /v1/methods`` lists it."""

    name: str
    guarantee: Literal["pure_dp", "approx_dp", "zcdp"]
    neighbors: list[str] = Field(default_factory=list)
    needs_delta: bool = False
    description: str = ""
    zcdp: str | None = None


class AuditEvent(_Model):
    """One admin action from the audit log (public figures only)."""

    id: int
    created_at: datetime
    actor_key_id: uuid.UUID | None = None
    actor_prefix: str | None = None
    action: str
    target_type: str
    target_id: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
