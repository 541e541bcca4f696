"""Bodies of the budget, grant and ledger endpoints. Decimals serialise as exact strings."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.amounts import AmountPublic, Budget, BudgetDecimal, DecimalText
from app.core.text import StorableText
from app.ledger import zcdp


class RhoFigures(BaseModel):
    """A zCDP table's balance in rho."""

    granted: DecimalText
    spent: DecimalText
    remaining: DecimalText


class ReleasesLeft(BaseModel):
    """How many more releases of one typical query the balance pays for."""

    epsilon: DecimalText = Field(description="The query's epsilon (`?epsilon=`, default 0.1).")
    method: str = Field(description="The query's method (JointExp).")
    count: int | None = Field(description="Releases left (null: the query costs nothing).")


#: The typical query ``releases_left`` is counted for, unless ``?epsilon=`` says otherwise.
TYPICAL_EPSILON = Decimal("0.1")


class BudgetPublic(BaseModel):
    """A dataset's budget by its accounting.

    ``pure``: granted, spent (sum of debits) and remaining (epsilon, delta); the guarantee is
    the spent sum. ``zcdp``: the balance is ``rho``; ``granted`` is the target (epsilon,
    delta), ``spent`` the sums of what the queries asked (what basic composition would have
    charged), ``guarantee`` the (epsilon, delta) the rho spent gives at the table's delta
    (dp-accounting's RDP conversion, rounded up) and ``remaining`` the target epsilon not yet
    reached by the guarantee."""

    dataset_id: uuid.UUID
    accounting: Literal["pure", "zcdp"] = "pure"
    granted: AmountPublic
    spent: AmountPublic
    remaining: AmountPublic
    rho: RhoFigures | None = None
    guarantee: AmountPublic
    releases_left: ReleasesLeft

    @classmethod
    def of(
        cls, dataset_id: uuid.UUID, budget: Budget, *, typical: Decimal = TYPICAL_EPSILON
    ) -> BudgetPublic:
        """From the service-level budget (zCDP figures through :mod:`app.ledger.zcdp`)."""
        rho = None
        if budget.accounting == "zcdp":
            left = budget.remaining
            rho = RhoFigures(granted=budget.granted.rho, spent=budget.spent.rho, remaining=left.rho)
            guarantee = zcdp.guarantee(budget)
            remaining = zcdp.remaining(budget)
            count = zcdp.releases_left(left.rho, typical * typical / 8)
        else:
            guarantee = budget.spent
            remaining = budget.remaining
            count = zcdp.releases_left(remaining.epsilon, typical)
        return cls(
            dataset_id=dataset_id,
            accounting="zcdp" if budget.accounting == "zcdp" else "pure",
            granted=AmountPublic.of(budget.granted),
            spent=AmountPublic.of(budget.spent),
            remaining=AmountPublic.of(remaining),
            rho=rho,
            guarantee=AmountPublic.of(guarantee),
            releases_left=ReleasesLeft(epsilon=typical, method="jointexp", count=count),
        )


class GrantCreate(BaseModel):
    """Add epsilon and/or delta to a dataset's budget."""

    model_config = ConfigDict(extra="forbid")

    epsilon: BudgetDecimal = Decimal(0)
    delta: BudgetDecimal = Decimal(0)
    rho: BudgetDecimal = Field(
        default=Decimal(0),
        description="zcdp tables: rho added directly (else epsilon is converted to rho at the "
        "table's delta, each grant on its own, which is conservative).",
    )
    reason: StorableText = Field(min_length=1, max_length=1000, description="Why the budget grows.")

    @model_validator(mode="after")
    def _something(self) -> GrantCreate:
        if self.epsilon == 0 and self.delta == 0 and self.rho == 0:
            raise ValueError("a grant must add a positive epsilon, delta or rho")
        return self


class RestoreConfirmation(BaseModel):
    """What was spent on a dataset after the backup a restore came from (the releases the
    restored ledger does not hold): recorded as an ``adjustment``, then the hold is lifted.
    All zero when nothing was released after the backup."""

    model_config = ConfigDict(extra="forbid")

    epsilon: BudgetDecimal = Decimal(0)
    delta: BudgetDecimal = Decimal(0)
    rho: BudgetDecimal = Field(default=Decimal(0), description="zcdp tables: the rho spent.")
    reason: StorableText = Field(
        min_length=1, max_length=1000, description="How the spending since was established."
    )


class LedgerEntryPublic(BaseModel):
    """One ledger row."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    dataset_id: uuid.UUID
    kind: Literal["grant", "debit", "adjustment"]
    epsilon: DecimalText
    delta: DecimalText
    rho: DecimalText = Field(
        default=Decimal(0),
        description="zcdp tables: the rho added or debited (a debit's epsilon and delta are "
        "the query's, as asked); 0 in pure tables.",
    )
    reason: str | None
    release_id: uuid.UUID | None
    api_key_id: uuid.UUID | None
    created_at: datetime


class LedgerPage(BaseModel):
    """A page of ledger rows, newest first; pass ``next_cursor`` to get older rows."""

    items: list[LedgerEntryPublic]
    next_cursor: str | None
