"""Bodies of the budget, grant and ledger endpoints. Decimals serialise as exact strings."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.amounts import AmountPublic, Budget, BudgetDecimal, DecimalText
from app.core.text import StorableText


class BudgetPublic(BaseModel):
    """A dataset's budget: granted, spent (sum of debits) and remaining."""

    dataset_id: uuid.UUID
    granted: AmountPublic
    spent: AmountPublic
    remaining: AmountPublic

    @classmethod
    def of(cls, dataset_id: uuid.UUID, budget: Budget) -> BudgetPublic:
        """From the service-level budget."""
        return cls(
            dataset_id=dataset_id,
            granted=AmountPublic.of(budget.granted),
            spent=AmountPublic.of(budget.spent),
            remaining=AmountPublic.of(budget.remaining),
        )


class GrantCreate(BaseModel):
    """Add epsilon and/or delta to a dataset's budget."""

    model_config = ConfigDict(extra="forbid")

    epsilon: BudgetDecimal = Decimal(0)
    delta: BudgetDecimal = Decimal(0)
    reason: StorableText = Field(min_length=1, max_length=1000, description="Why the budget grows.")

    @model_validator(mode="after")
    def _something(self) -> GrantCreate:
        if self.epsilon == 0 and self.delta == 0:
            raise ValueError("a grant must add a positive epsilon or delta")
        return self


class LedgerEntryPublic(BaseModel):
    """One ledger row."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    dataset_id: uuid.UUID
    kind: Literal["grant", "debit"]
    epsilon: DecimalText
    delta: DecimalText
    reason: str | None
    release_id: uuid.UUID | None
    api_key_id: uuid.UUID | None
    created_at: datetime


class LedgerPage(BaseModel):
    """A page of ledger rows, newest first; pass ``next_cursor`` to get older rows."""

    items: list[LedgerEntryPublic]
    next_cursor: str | None
