"""Exact (epsilon, delta) amounts and budgets, and how their decimals are read and written.

Shared by every domain that states a budget figure (keys' caps, datasets' grants, releases'
costs) and by the ledger that keeps the accounts.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Annotated

from pydantic import BaseModel, Field, PlainSerializer


@dataclass(frozen=True)
class Amount:
    """An (epsilon, delta) pair of exact decimals, and the rho of a zCDP table's accounts
    (0 in a pure table)."""

    epsilon: Decimal
    delta: Decimal
    rho: Decimal = Decimal(0)

    def plus(self, other: Amount) -> Amount:
        """Exact sum."""
        with localcontext() as ctx:
            ctx.prec = 200
            return Amount(
                self.epsilon + other.epsilon, self.delta + other.delta, self.rho + other.rho
            )

    def minus(self, other: Amount) -> Amount:
        """Exact difference (no rounding, whatever the number of digits)."""
        with localcontext() as ctx:
            ctx.prec = 200
            return Amount(
                self.epsilon - other.epsilon, self.delta - other.delta, self.rho - other.rho
            )


@dataclass(frozen=True)
class Budget:
    """Granted, spent and remaining budget of one dataset. In a zCDP table (``accounting``
    ``zcdp``) rho is the balance and ``guarantee_delta`` the delta its guarantee is stated
    at; epsilon and delta are the targets granted and the sums of what queries asked."""

    granted: Amount
    spent: Amount
    accounting: str = "pure"
    guarantee_delta: Decimal | None = None

    def affords(self, cost: Amount) -> bool:
        """Whether ``cost`` fits in what is left, by the table's accounting."""
        left = self.remaining
        if self.accounting == "zcdp":
            return cost.rho <= left.rho
        return cost.epsilon <= left.epsilon and cost.delta <= left.delta

    @property
    def remaining(self) -> Amount:
        """``granted - spent`` for epsilon and delta."""
        return self.granted.minus(self.spent)


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
