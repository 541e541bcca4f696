"""One error family, ``{"type", "detail"}`` bodies, and their OpenAPI descriptions.

The HTTP handlers that turn every failure into such a body are in :mod:`app.api.errors`.

Bodies never carry a stack trace or an input value: validation messages name the field and
the rule only, because a rejected input may be a data value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

#: Every ``type`` an error body can carry (an enum in the OpenAPI document).
ERROR_TYPES = (
    "unauthorized",
    "forbidden",
    "not_found",
    "budget_exhausted",
    "key_budget_exhausted",
    "key_not_rotatable",
    "dataset_archived",
    "dataset_frozen",
    "privacy_unit_needs_rows",
    "unit_counts_unknown",
    "idempotency_conflict",
    "no_values",
    "no_group_values",
    "values_changed",
    "budget_on_hold",
    "not_on_hold",
    "name_taken",
    "payload_too_large",
    "unsupported_media_type",
    "validation_error",
    "method_not_allowed",
    "rate_limited",
    "too_many_pending",
    "database_unavailable",
    "identity_provider_unavailable",
    "outcome_unknown",
    "internal_error",
    "overloaded",
    "not_ready",
    "http_error",
)


class ErrorBody(BaseModel):
    """The body of every error response."""

    type: str = Field(json_schema_extra={"enum": list(ERROR_TYPES)})
    detail: str


class DpquantError(Exception):
    """An error with an HTTP status, a stable machine-readable ``type`` and a human ``detail``.

    Args:
        status_code: HTTP status of the response.
        type: stable identifier, e.g. ``"budget_exhausted"``.
        detail: human-readable explanation; must never contain a data value.
        extra: additional JSON members of the body (e.g. budget figures).
        headers: additional response headers.
    """

    def __init__(
        self,
        status_code: int,
        type: str,
        detail: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.type = type
        self.detail = detail
        self.extra = extra or {}
        self.headers = headers


def unauthorized(detail: str = "missing or unknown API key") -> DpquantError:
    """401 with the ``WWW-Authenticate`` challenge."""
    return DpquantError(401, "unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


def forbidden(detail: str = "this key's role may not do that") -> DpquantError:
    """403: the key is valid but its role does not allow the operation."""
    return DpquantError(403, "forbidden", detail)


def not_found(what: str) -> DpquantError:
    """404 for unknown objects and for objects outside the key's scope alike."""
    return DpquantError(404, "not_found", f"{what} not found")


def invalid(field: str, problem: str) -> DpquantError:
    """422 naming the offending field, e.g. ``invalid("body.epsilon", "must be > 0")``."""
    return DpquantError(422, "validation_error", f"{field}: {problem}")


def outcome_unknown(has_idempotency_key: bool = True) -> DpquantError:
    """503 when a commit was sent but its result was lost: it may or may not have happened."""
    advice = (
        "retry with the same Idempotency-Key: it returns the release if it exists and creates "
        "none twice"
        if has_idempotency_key
        else "list the dataset's releases before retrying (send an Idempotency-Key to make "
        "retries safe)"
    )
    return DpquantError(
        503,
        "outcome_unknown",
        f"the database connection was lost while committing; the outcome is unknown: {advice}",
        headers={"Retry-After": "1"},
    )


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting error statuses with :class:`ErrorBody`."""
    descriptions = {
        304: "Not modified (ETag matches If-None-Match)",
        401: "Missing, unknown or revoked API key",
        403: "The key's role may not do this",
        404: "Unknown object, or outside the key's scope",
        409: "Conflict (budget exhausted, dataset frozen, idempotency-key reuse, ...)",
        413: "Upload too large",
        415: "Unsupported Content-Type",
        422: "Invalid input; the detail names the field",
        503: "Database unavailable or overloaded; the detail says whether anything was "
        "charged (outcome_unknown: retry with the same Idempotency-Key)",
    }
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        if status == 304:
            out[status] = {"description": descriptions[status]}
        else:
            out[status] = {"model": ErrorBody, "description": descriptions[status]}
    return out


def error_body(type_: str, detail: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of a refusal or failure (counted by type in the refusal metric)."""
    from app.core.metrics import REFUSALS  # late: prometheus_client reads its mode at import

    REFUSALS.labels(type_).inc()
    body: dict[str, Any] = {"type": type_, "detail": detail}
    if extra:
        body.update(extra)
    return body
