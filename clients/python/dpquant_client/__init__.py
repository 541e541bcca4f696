"""Python client for dpquant, the differentially private quantiles service.

>>> from dpquant_client import Client
>>> with Client("http://127.0.0.1:8000", api_key) as dpq:            # doctest: +SKIP
...     release = dpq.quantiles(dataset_id, [0.25, 0.5, 0.75], epsilon="0.1")
...     release.estimates, dpq.budget(dataset_id).remaining.epsilon
"""

from dpquant_client.aio import AsyncClient
from dpquant_client.client import Client
from dpquant_client.errors import (
    BudgetExhausted,
    Conflict,
    ConnectionFailed,
    DatasetArchived,
    DatasetFrozen,
    DpquantError,
    Forbidden,
    IdempotencyConflict,
    KeyBudgetExhausted,
    KeyNotRotatable,
    NameTaken,
    NotFound,
    NotSupported,
    NoValues,
    PayloadTooLarge,
    RateLimited,
    ReleaseFailed,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
    ValidationError,
)
from dpquant_client.models import (
    Amount,
    AuditEvent,
    Budget,
    Dataset,
    EstimateInterval,
    ExpectedError,
    Group,
    GroupError,
    Key,
    KeyCreated,
    KeySizeError,
    LedgerEntry,
    Me,
    Method,
    Quote,
    Release,
    SizeError,
)

__version__ = "0.1.0"

__all__ = [
    "Amount",
    "AsyncClient",
    "AuditEvent",
    "Budget",
    "BudgetExhausted",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Dataset",
    "DatasetArchived",
    "DatasetFrozen",
    "DpquantError",
    "EstimateInterval",
    "ExpectedError",
    "Forbidden",
    "Group",
    "GroupError",
    "IdempotencyConflict",
    "Key",
    "KeyBudgetExhausted",
    "KeyCreated",
    "KeyNotRotatable",
    "KeySizeError",
    "LedgerEntry",
    "Me",
    "Method",
    "NameTaken",
    "NoValues",
    "NotFound",
    "NotSupported",
    "PayloadTooLarge",
    "Quote",
    "RateLimited",
    "Release",
    "ReleaseFailed",
    "ServiceUnavailable",
    "SizeError",
    "Unauthorized",
    "UnsupportedMediaType",
    "ValidationError",
]
