"""Bodies of the dataset endpoints."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.amounts import AmountPublic, BudgetDecimal
from app.core.text import StorableText

Neighbors = Literal["swap", "add_remove"]
SizeHint = Annotated[int, Field(gt=0, le=10**15)]
UnitBound = Annotated[int, Field(ge=1, le=10_000)]
UNIT_DOC = (
    "The column that identifies a person (the privacy unit) in value uploads: the guarantee "
    "of every release is for one unit (all its rows added, removed or changed). Unit ids are "
    "never released, logged or stored in clear. Null: each row is its own unit."
)
ROWS_DOC = (
    "k: rows one unit may contribute. Uploads keep at most k rows per unit (chosen uniformly "
    "at random; the rest are dropped and counted for admins) and every release is calibrated "
    "for a unit of k rows (epsilon/k per row for the pure methods). Needs privacy_unit if > 1."
)
GROUPS_DOC = "L: groups one unit may touch (group-by). Needs privacy_unit if > 1."
SIZE_HINT_DOC = (
    "A public, admin-declared approximate number of values (never computed from the data). "
    "Under add_remove neighbours n is private, so quotes, expected errors and method "
    '"auto" use this figure instead (unknown without it); under swap n is public and used.'
)


class DatasetCreate(BaseModel):
    """A new dataset: public bounds, neighbour relation, initial budget, output grid."""

    model_config = ConfigDict(extra="forbid")

    name: StorableText = Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: StorableText = Field(default="", max_length=2000)
    lower: float = Field(allow_inf_nan=False, description="Public lower bound (not from data).")
    upper: float = Field(allow_inf_nan=False, description="Public upper bound, > lower.")
    neighbors: Neighbors = Field(
        default="swap", description="Neighbour relation: swap (n public) or add_remove."
    )
    epsilon: BudgetDecimal = Field(default=Decimal(0), description="Initial epsilon budget.")
    delta: BudgetDecimal = Field(default=Decimal(0), description="Initial delta budget.")
    granularity: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Spacing of the public output grid lower + k*granularity; default: the "
        "largest power of ten <= (upper - lower) / 10^6.",
    )
    size_hint: SizeHint | None = Field(
        default=None,
        description=SIZE_HINT_DOC,
    )
    privacy_unit: StorableText | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^\S(.*\S)?$", description=UNIT_DOC
    )
    max_rows_per_unit: UnitBound = Field(default=1, description=ROWS_DOC)
    max_groups_per_unit: UnitBound = Field(default=1, description=GROUPS_DOC)

    @model_validator(mode="after")
    def _bounds(self) -> DatasetCreate:
        if not self.lower < self.upper:
            raise ValueError("lower must be smaller than upper")
        if not math.isfinite(self.upper - self.lower):
            raise ValueError("upper - lower must be a finite double")
        if self.privacy_unit is None and (
            self.max_rows_per_unit > 1 or self.max_groups_per_unit > 1
        ):
            raise ValueError(
                "max_rows_per_unit and max_groups_per_unit above 1 need a privacy_unit column"
            )
        return self


class DatasetUpdate(BaseModel):
    """Rename, re-describe and/or set the public size hint of a dataset (at least one field;
    ``"size_hint": null`` removes the hint)."""

    model_config = ConfigDict(extra="forbid")

    name: StorableText | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^\S(.*\S)?$"
    )
    description: StorableText | None = Field(default=None, max_length=2000)
    size_hint: SizeHint | None = Field(
        default=None, description=SIZE_HINT_DOC + " Send null to remove it."
    )

    @model_validator(mode="after")
    def _something(self) -> DatasetUpdate:
        if (
            self.name is None
            and self.description is None
            and "size_hint" not in self.model_fields_set
        ):
            raise ValueError("give a name, a description and/or a size_hint")
        return self


class DatasetPublic(BaseModel):
    """What every role may see of a dataset: its size only under ``swap``, where it is public."""

    id: uuid.UUID
    name: str
    description: str
    lower: float
    upper: float
    neighbors: Neighbors
    granularity: float
    size_hint: int | None = Field(default=None, description=SIZE_HINT_DOC)
    n: int | None = Field(
        default=None,
        description="Number of values. Under `swap` it is public (neighbouring datasets have "
        "the same n, the mechanisms use it, and a quote's expected error in missed points is "
        "read against it) and every role sees it; under `add_remove` it is private and only "
        "admins see it (null for other roles). Null before the first upload.",
    )
    privacy_unit: str | None = Field(default=None, description=UNIT_DOC)
    max_rows_per_unit: int = Field(default=1, description=ROWS_DOC)
    max_groups_per_unit: int = Field(default=1, description=GROUPS_DOC)
    budget_remaining: AmountPublic
    created_at: datetime
    archived_at: datetime | None = Field(
        default=None,
        description="Set once archived: values deleted, ledger and releases kept, no queries.",
    )


class DatasetAdmin(DatasetPublic):
    """The admin view: adds the size under either relation, the count outside the bounds and
    the upload state."""

    n_outside_bounds: int | None = Field(
        description="Values outside [lower, upper] before clamping (null: unknown, e.g. after "
        "a histogram upload that did not report it)."
    )
    n_cells: int | None = Field(default=None, description="Distinct grid cells stored.")
    values_skipped: int | None = Field(
        default=None, description="Missing cells skipped at upload (?missing=skip)."
    )
    rows_dropped: int | None = Field(
        default=None,
        description="Rows dropped to keep every unit at max_rows_per_unit (private: admins "
        "only; null without a privacy_unit).",
    )
    units: int | None = Field(
        default=None,
        description="Distinct privacy units in the stored values (private: admins only).",
    )
    values_uploaded_at: datetime | None
    frozen_at: datetime | None


class DatasetPage(BaseModel):
    """A page of datasets visible to the key, newest first."""

    items: list[DatasetAdmin | DatasetPublic]
    next_cursor: str | None
