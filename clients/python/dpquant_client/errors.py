"""Typed errors: one class per error ``type`` the service answers with."""

from __future__ import annotations

from decimal import Decimal
from typing import Any


class DpquantError(Exception):
    """An error answer of the service: HTTP status, stable ``type``, human ``detail``."""

    def __init__(self, status: int, type: str, detail: str, body: dict[str, Any] | None = None):
        super().__init__(f"{status} {type}: {detail}")
        self.status = status
        self.type = type
        self.detail = detail
        self.body = body or {}


class Unauthorized(DpquantError):
    """401: missing, unknown or revoked key."""


class Forbidden(DpquantError):
    """403: the key's role may not do this."""


class NotFound(DpquantError):
    """404: unknown object, or outside the key's scope."""


class Conflict(DpquantError):
    """409: the request conflicts with the current state."""


class BudgetExhausted(Conflict):
    """409 ``budget_exhausted``: the query costs more than remains (figures only)."""

    @property
    def requested_epsilon(self) -> Decimal | None:
        return _figure(self.body, "requested", "epsilon")

    @property
    def remaining_epsilon(self) -> Decimal | None:
        return _figure(self.body, "remaining", "epsilon")


class KeyBudgetExhausted(Conflict):
    """409 ``key_budget_exhausted``: the query would take this key over its cap."""

    @property
    def cap_epsilon(self) -> Decimal | None:
        return _figure(self.body, "cap", "epsilon")

    @property
    def spent_epsilon(self) -> Decimal | None:
        return _figure(self.body, "spent", "epsilon")

    @property
    def requested_epsilon(self) -> Decimal | None:
        return _figure(self.body, "requested", "epsilon")


class DatasetArchived(Conflict):
    """409 ``dataset_archived``: the dataset is archived (read-only history)."""


class KeyNotRotatable(Conflict):
    """409 ``key_not_rotatable``: revoked, expired and bootstrap keys cannot be rotated."""


class DatasetFrozen(Conflict):
    """409 ``dataset_frozen``: values cannot change after the first release."""


class IdempotencyConflict(Conflict):
    """409 ``idempotency_conflict``: the Idempotency-Key was used with another body."""


class NoValues(Conflict):
    """409 ``no_values``: nothing uploaded yet."""


class NameTaken(Conflict):
    """409 ``name_taken``: a dataset with that name exists."""


class PayloadTooLarge(DpquantError):
    """413: the upload or body is above the server's limits."""


class UnsupportedMediaType(DpquantError):
    """415: upload content type not JSON, CSV or octet-stream."""


class ValidationError(DpquantError):
    """422: invalid input; ``detail`` names the field."""


class RateLimited(DpquantError):
    """429: the key exceeded its rate limit; ``retry_after`` seconds."""

    retry_after: float | None = None


class ServiceUnavailable(DpquantError):
    """503: nothing was charged; retry (the client does, with the same Idempotency-Key)."""


class ReleaseFailed(DpquantError):
    """An asynchronous release ended ``failed``; its cost stays charged."""

    def __init__(self, release: Any) -> None:
        super().__init__(200, "release_failed", f"release {release.id} failed (cost charged)")
        self.release = release


class NotSupported(DpquantError):
    """The server does not offer this endpoint (yet)."""


class ConnectionFailed(DpquantError):
    """The server could not be reached (after the retries)."""


_BY_TYPE: dict[str, type[DpquantError]] = {
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "budget_exhausted": BudgetExhausted,
    "key_budget_exhausted": KeyBudgetExhausted,
    "dataset_archived": DatasetArchived,
    "key_not_rotatable": KeyNotRotatable,
    "dataset_frozen": DatasetFrozen,
    "idempotency_conflict": IdempotencyConflict,
    "no_values": NoValues,
    "name_taken": NameTaken,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "validation_error": ValidationError,
    "rate_limited": RateLimited,
}
_BY_STATUS: dict[int, type[DpquantError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationError,
    429: RateLimited,
    503: ServiceUnavailable,
}


def error_from(status: int, body: Any, headers: Any = None) -> DpquantError:
    """The typed error for an error answer."""
    if not isinstance(body, dict):
        body = {}
    type_ = str(body.get("type") or "http_error")
    detail = str(body.get("detail") or f"HTTP {status}")
    cls = _BY_TYPE.get(type_) or _BY_STATUS.get(status) or DpquantError
    err = cls(status, type_, detail, body)
    if isinstance(err, RateLimited) and headers is not None:
        try:
            err.retry_after = float(headers.get("retry-after"))
        except (TypeError, ValueError):
            err.retry_after = None
    return err


def _figure(body: dict[str, Any], part: str, name: str) -> Decimal | None:
    value = (body.get(part) or {}).get(name)
    return None if value is None else Decimal(str(value))
