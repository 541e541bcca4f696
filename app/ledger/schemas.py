"""Bodies of the budget, grant and ledger endpoints. Decimals serialise as exact strings."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from app.ledger.service import Amount, Budget
from app.text import StorableText

#: A non-negative budget figure: at most 40 digits, 30 of them after the point.
BudgetDecimal = Annotated[Decimal, Field(ge=0, max_digits=40, decimal_places=30)]


def plain_decimal(value: Decimal) -> str:
    """The one way budget figures are written: plain decimal, no exponent, no trailing zeros.

    ``Decimal("0E-12")`` -> ``"0"``, ``Decimal("5.000000000000")`` -> ``"5"``,
    ``Decimal("0.10")`` -> ``"0.1"``, ``Decimal("1E-7")`` -> ``"0.0000001"``,
    ``Decimal("5E+2")`` -> ``"500"``. Exact: only the notation changes, never the value.
    """
    if value == 0:
        return "0"  # also for -0 and 0E-12
    return format(value.normalize(), "f")


#: A budget figure in a response (epsilon, delta, costs, ledger rows): an exact decimal
#: written as a JSON string by :func:`plain_decimal`.
DecimalText = Annotated[
    Decimal,
    PlainSerializer(plain_decimal, return_type=str, when_used="json"),
    Field(json_schema_extra={"pattern": r"^(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$"}),
]


class AmountPublic(BaseModel):
    """An (epsilon, delta) pair; both are exact decimals written as plain decimal strings."""

    epsilon: DecimalText
    delta: DecimalText

    @classmethod
    def of(cls, amount: Amount) -> AmountPublic:
        """From the service-level amount."""
        return cls(epsilon=amount.epsilon, delta=amount.delta)


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
