"""Bodies of the dataset endpoints."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.amounts import AmountPublic, BudgetDecimal, DecimalText
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


ColumnName = Annotated[StorableText, Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")]
MAX_COLUMNS = 100
MAX_KEYS = 10_000


class NumericColumn(BaseModel):
    """A numeric column: public bounds and output grid, as a one-column dataset's.
    ``integer`` declares whole numbers: its grid step defaults to 1 and must be whole."""

    model_config = ConfigDict(extra="forbid")

    name: ColumnName
    type: Literal["numeric", "integer"]
    lower: float = Field(allow_inf_nan=False, description="Public lower bound (not from data).")
    upper: float = Field(allow_inf_nan=False, description="Public upper bound, > lower.")
    granularity: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Output grid step; default: 1 for integer columns, else the largest "
        "power of ten <= (upper - lower) / 10^6.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> NumericColumn:
        if not self.lower < self.upper:
            raise ValueError("lower must be smaller than upper")
        if not math.isfinite(self.upper - self.lower):
            raise ValueError("upper - lower must be a finite double")
        if self.type == "integer":
            if self.granularity is None:
                self.granularity = 1.0
            if self.granularity != math.floor(self.granularity):
                raise ValueError("an integer column's granularity must be a whole number")
        return self


class CategoricalColumn(BaseModel):
    """A categorical column: its key list is optional, and public when given."""

    model_config = ConfigDict(extra="forbid")

    name: ColumnName
    type: Literal["categorical"]
    keys: list[Annotated[StorableText, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=MAX_KEYS, description="The public keys (optional)."
    )

    @model_validator(mode="after")
    def _keys(self) -> CategoricalColumn:
        if self.keys is not None and len(set(self.keys)) != len(self.keys):
            raise ValueError("keys must be distinct")
        return self


ColumnSpec = Annotated[NumericColumn | CategoricalColumn, Field(discriminator="type")]


class ColumnPublic(BaseModel):
    """A column of a dataset's public schema."""

    name: str
    type: Literal["numeric", "integer", "categorical"]
    lower: float | None = None
    upper: float | None = None
    granularity: float | None = None
    keys: list[str] | None = None


ACCOUNTING_DOC = (
    "How releases compose: pure (epsilon and delta sum, basic composition) or zcdp (each "
    "release debits rho: epsilon^2/8 for an epsilon-DP exponential mechanism; the total is "
    "converted to (epsilon, delta) at the table's delta). zcdp buys 2-12x more releases of "
    "small epsilon for a delta > 0; methods proven only in (epsilon, delta)-DP (appindexp, "
    "smooth) are refused there."
)


class DatasetCreate(BaseModel):
    """A new dataset: a table of public schema (``columns``; or, the one-column shape,
    ``lower``, ``upper`` and ``granularity``, meaning one numeric column named ``value``),
    neighbour relation, privacy unit, initial budget."""

    model_config = ConfigDict(extra="forbid")

    name: StorableText = Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: StorableText = Field(default="", max_length=2000)
    columns: list[ColumnSpec] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_COLUMNS,
        description="The table's columns: numeric ({name, type: numeric|integer, lower, upper, "
        "granularity}) and categorical ({name, type: categorical, keys}). Give either columns "
        "or lower/upper (one numeric column named value).",
    )
    lower: float | None = Field(
        default=None, allow_inf_nan=False, description="Public lower bound (not from data)."
    )
    upper: float | None = Field(
        default=None, allow_inf_nan=False, description="Public upper bound, > lower."
    )
    neighbors: Neighbors = Field(
        default="swap", description="Neighbour relation: swap (n public) or add_remove."
    )
    epsilon: BudgetDecimal = Field(
        default=Decimal(0),
        description="Initial epsilon budget (zcdp: the total epsilon the table may reach).",
    )
    delta: BudgetDecimal = Field(
        default=Decimal(0),
        description="Initial delta budget (zcdp: required, > 0 and < 1: the delta at which "
        "the table's guarantee is stated, fixed).",
    )
    accounting: Literal["pure", "zcdp"] = Field(
        default="pure",
        description=ACCOUNTING_DOC,
    )
    rho: BudgetDecimal | None = Field(
        default=None,
        description="zcdp only: the initial budget given directly as rho (instead of epsilon).",
    )
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
        if self.columns is None:
            if self.lower is None or self.upper is None:
                raise ValueError("give columns, or lower and upper")
            if not self.lower < self.upper:
                raise ValueError("lower must be smaller than upper")
            if not math.isfinite(self.upper - self.lower):
                raise ValueError("upper - lower must be a finite double")
        else:
            if self.lower is not None or self.upper is not None or self.granularity is not None:
                raise ValueError("give either columns or lower/upper/granularity, not both")
            names = [c.name for c in self.columns]
            if len(set(names)) != len(names):
                raise ValueError("column names must be distinct")
            if not any(isinstance(c, NumericColumn) for c in self.columns):
                raise ValueError("a table needs at least one numeric column")
            if self.privacy_unit is not None and self.privacy_unit in names:
                raise ValueError("the privacy_unit column is not released: it cannot be declared")
        if self.accounting == "zcdp":
            if not 0 < self.delta < 1:
                raise ValueError(
                    "a zcdp table needs delta > 0 and < 1: the delta its guarantee is stated at"
                )
            if self.rho is not None and self.epsilon > 0:
                raise ValueError("give the zcdp budget as epsilon or as rho, not both")
        elif self.rho is not None:
            raise ValueError("rho is a zcdp table's budget: set accounting to zcdp")
        if self.privacy_unit is None and (
            self.max_rows_per_unit > 1 or self.max_groups_per_unit > 1
        ):
            raise ValueError(
                "max_rows_per_unit and max_groups_per_unit above 1 need a privacy_unit column"
            )
        return self

    def table(self) -> list[NumericColumn | CategoricalColumn]:
        """The declared columns (the one-column shape: a numeric column named ``value``)."""
        if self.columns is not None:
            return list(self.columns)
        assert self.lower is not None and self.upper is not None
        return [
            NumericColumn(
                name="value",
                type="numeric",
                lower=self.lower,
                upper=self.upper,
                granularity=self.granularity,
            )
        ]


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
    columns: list[ColumnPublic] = Field(
        default_factory=list, description="The table's public schema, in declared order."
    )
    privacy_unit: str | None = Field(default=None, description=UNIT_DOC)
    max_rows_per_unit: int = Field(default=1, description=ROWS_DOC)
    max_groups_per_unit: int = Field(default=1, description=GROUPS_DOC)
    accounting: Literal["pure", "zcdp"] = Field(default="pure", description=ACCOUNTING_DOC)
    accounting_delta: DecimalText | None = Field(
        default=None, description="zcdp: the delta the table's guarantee is stated at."
    )
    budget_remaining: AmountPublic
    restore_hold_since: datetime | None = Field(
        default=None,
        description="Set after the database was restored from a backup taken at this time: "
        "releases are refused (409 budget_on_hold) until an admin confirms what was spent "
        "since (POST /v1/datasets/{id}/restore-confirmation).",
    )
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
