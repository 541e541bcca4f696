"""Who is calling: a plain value that routers build and services take (no FastAPI here).

Services receive a :class:`Principal` instead of reading a request, so the same service
functions serve HTTP requests, background workers and the command line.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    """The authenticated key: its id, role, optional dataset scope and public prefix."""

    key_id: uuid.UUID
    role: str
    scope: uuid.UUID | None
    #: The key's public prefix (``dpq_`` + 8 characters), recorded in the audit log.
    prefix: str | None = None
    #: Whether the key has a spending cap (PostgreSQL enforces caps on every debit whatever
    #: this says, see migration 0005).
    capped: bool = True
    #: An OpenID Connect token's datasets claim (None: not scoped that way).
    datasets: frozenset[uuid.UUID] | None = None
    #: An OpenID Connect token's subject (None for API keys).
    subject: str | None = None

    def can_see(self, dataset_id: uuid.UUID) -> bool:
        """True when the dataset lies inside this principal's scope."""
        if self.datasets is not None:
            return dataset_id in self.datasets
        return self.scope is None or self.scope == dataset_id
