"""The client's logic without I/O, shared by :class:`Client` and :class:`AsyncClient`.

Each endpoint is a *flow*: a generator that yields :class:`Call` (an HTTP request) or
:class:`Sleep` and receives the decoded answer, then returns the typed result. The sync and
async clients only differ in how they run a flow (``httpx.Client`` and ``time.sleep``, or
``httpx.AsyncClient`` and ``asyncio.sleep``), so retries, ETags and typing live here once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dpquant_client.errors import (
    ConnectionFailed,
    DpquantError,
    NotSupported,
    RateLimited,
    ReleaseFailed,
    ServiceUnavailable,
    error_from,
)
from dpquant_client.models import (
    AuditEvent,
    Budget,
    Dataset,
    Key,
    KeyCreated,
    LedgerEntry,
    Me,
    Method,
    Quote,
    Release,
)

T = TypeVar("T")
Number = int | float | str | Decimal
Id = uuid.UUID | str


@dataclass
class Call:
    """One HTTP request of a flow."""

    method: str
    path: str
    safe_to_repeat: bool
    conditional: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sleep:
    """A pause inside a flow (polling)."""

    seconds: float


@dataclass
class Answer:
    """A successful answer: status, headers and the decoded JSON body (``None`` if empty)."""

    status: int
    headers: httpx.Headers
    body: Any


Flow = Generator[Call | Sleep, Any, T]


def decimal_text(value: Number) -> str:
    """Budgets travel as JSON strings, so 0.1 stays exactly 0.1."""
    return repr(value) if isinstance(value, float) else str(value)


class Core:
    """Configuration, ETag cache and retry policy; the flows of every endpoint."""

    def __init__(self, base_url: str, api_key: str, *, retries: int, backoff: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._etags: dict[str, tuple[str, Any]] = {}
        self._paths: dict[str, Any] | None = None
        #: HTTP status of the last answer (201 or 202 after ``quantiles``, 304 after a hit).
        self.last_status: int | None = None

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.base_url!r})"

    # ------------------------------------------------------------------ one attempt

    def _cache_key(self, call: Call) -> str:
        params = call.kwargs.get("params")
        return call.path + "?" + json.dumps(params, sort_keys=True, default=str)

    def prepare(self, call: Call) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` for this call."""
        kwargs = dict(call.kwargs)
        headers: dict[str, str] = dict(kwargs.pop("headers", None) or {})
        if call.conditional and (cached := self._etags.get(self._cache_key(call))):
            headers["If-None-Match"] = cached[0]
        return {"method": call.method, "url": call.path, "headers": headers, **kwargs}

    def outcome(
        self, call: Call, attempt: int, response: httpx.Response | None, exc: Exception | None
    ) -> Answer | float:
        """An :class:`Answer`, or the seconds to wait before the next attempt; raises the
        typed error when no attempt is left or the error is final."""
        last = attempt >= self.retries
        delay = self.backoff * float(2**attempt)
        if response is None:
            # The request may have reached the server: repeat only what is safe to repeat.
            if last or not call.safe_to_repeat:
                name = type(exc).__name__ if exc else "error"
                raise ConnectionFailed(0, "connection_failed", name) from exc
            return delay
        self.last_status = response.status_code
        key = self._cache_key(call)
        if response.status_code == 304 and call.conditional and key in self._etags:
            return Answer(304, response.headers, self._etags[key][1])
        if response.status_code < 400:
            body = _json_or_none(response)
            if call.conditional and "etag" in response.headers:
                self._etags[key] = (response.headers["etag"], body)
            return Answer(response.status_code, response.headers, body)
        error = error_from(response.status_code, _json_or_none(response), response.headers)
        # 503: the server rolled back, nothing was charged; 429: not even looked at.
        if last or not isinstance(error, ServiceUnavailable | RateLimited):
            raise error
        hint = error.retry_after if isinstance(error, RateLimited) else None
        header = response.headers.get("retry-after", "")
        if hint is None and header.isdigit():
            hint = float(header)
        return min(max(delay, hint or 0.0), 30.0)

    # ------------------------------------------------------------------ helpers

    def _pages(self, path: str, *, limit: int = 200) -> Flow[list[dict[str, Any]]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if cursor:
                params["cursor"] = cursor
            page: Answer = yield Call("GET", path, True, kwargs={"params": params})
            items.extend(page.body["items"])
            cursor = page.body.get("next_cursor")
            if not cursor:
                return items

    def _has(self, path: str, method: str) -> Flow[bool]:
        """Whether the server's OpenAPI document lists this operation."""
        if self._paths is None:
            try:
                doc: Answer = yield Call("GET", "/openapi.json", True)
                self._paths = doc.body.get("paths", {})
            except DpquantError:
                self._paths = {}
        return method in (self._paths or {}).get(path, {})

    @staticmethod
    def _query_body(
        quantiles: Sequence[float],
        epsilon: Number,
        method: str,
        delta: Number | None,
        column: str | None = None,
        group_by: str | None = None,
        keys: Sequence[str] | None = None,
        size_hints: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "quantiles": [float(q) for q in quantiles],
            "epsilon": decimal_text(epsilon),
            "method": method,
        }
        if delta is not None:
            body["delta"] = decimal_text(delta)
        if column is not None:
            body["column"] = column
        if group_by is not None:
            body["group_by"] = group_by
        if keys is not None:
            body["keys"] = list(keys)
        if size_hints is not None:
            body["size_hints"] = {str(k): int(v) for k, v in size_hints.items()}
        return body

    # ------------------------------------------------------------------ flows

    def _me(self) -> Flow[Me]:
        a: Answer = yield Call("GET", "/v1/keys/me", True)
        return Me.model_validate(a.body)

    def _health(self) -> Flow[bool]:
        a: Answer = yield Call("GET", "/healthz", True)
        return bool(a.body.get("status") == "ok")

    def _ready(self) -> Flow[bool]:
        try:
            yield Call("GET", "/readyz", False)
        except DpquantError:
            return False
        return True

    def _datasets(self) -> Flow[list[Dataset]]:
        rows = yield from self._pages("/v1/datasets")
        return [Dataset.model_validate(d) for d in rows]

    def _dataset(self, dataset_id: Id) -> Flow[Dataset]:
        a: Answer = yield Call("GET", f"/v1/datasets/{dataset_id}", True)
        return Dataset.model_validate(a.body)

    def _create_dataset(
        self,
        name: str,
        lower: float | None,
        upper: float | None,
        epsilon: Number,
        delta: Number,
        neighbors: str,
        description: str,
        granularity: float | None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int = 1,
        max_groups_per_unit: int = 1,
        columns: Sequence[Mapping[str, Any]] | None = None,
        accounting: str = "pure",
        rho: Number | None = None,
    ) -> Flow[Dataset]:
        body: dict[str, Any] = {
            "name": name,
            "description": description,
            "neighbors": neighbors,
            "epsilon": decimal_text(epsilon),
            "delta": decimal_text(delta),
        }
        if lower is not None or upper is not None:
            body["lower"], body["upper"] = lower, upper
        if columns is not None:
            body["columns"] = [dict(c) for c in columns]
        if granularity is not None:
            body["granularity"] = granularity
        if accounting != "pure":
            body["accounting"] = accounting
        if rho is not None:
            body["rho"] = decimal_text(rho)
        if privacy_unit is not None:
            body["privacy_unit"] = privacy_unit
            body["max_rows_per_unit"] = max_rows_per_unit
            body["max_groups_per_unit"] = max_groups_per_unit
        a: Answer = yield Call("POST", "/v1/datasets", False, kwargs={"json": body})
        return Dataset.model_validate(a.body)

    def _upload(
        self,
        dataset_id: Id,
        values: Sequence[float] | None,
        path: str | Path | None,
        column: str | None,
    ) -> Flow[Dataset]:
        if (values is None) == (path is None):
            raise TypeError("pass exactly one of values= or path=")
        kwargs: dict[str, Any] = {"params": {"column": column}} if column else {}
        if values is not None:
            kwargs["json"] = [float(v) for v in values]
        else:
            file = Path(str(path))
            media = {
                ".csv": "text/csv",
                ".json": "application/json",
                ".parquet": "application/vnd.apache.parquet",
                ".parq": "application/vnd.apache.parquet",
                ".pq": "application/vnd.apache.parquet",
            }.get(file.suffix.lower(), "application/octet-stream")
            kwargs["content"] = file.read_bytes()
            kwargs["headers"] = {"Content-Type": media}
        # Uploading replaces the values atomically: repeating it is safe.
        a: Answer = yield Call("PUT", f"/v1/datasets/{dataset_id}/values", True, kwargs=kwargs)
        return Dataset.model_validate(a.body)

    def _budget(self, dataset_id: Id, typical: Number | None = None) -> Flow[Budget]:
        path = f"/v1/datasets/{dataset_id}/budget"
        if typical is not None:
            path += f"?epsilon={decimal_text(typical)}"
        a: Answer = yield Call("GET", path, True, conditional=True)
        return Budget.model_validate(a.body)

    def _grant(
        self, dataset_id: Id, reason: str, epsilon: Number, delta: Number, rho: Number = 0
    ) -> Flow[LedgerEntry]:
        body = {"epsilon": decimal_text(epsilon), "delta": decimal_text(delta), "reason": reason}
        if rho:
            body["rho"] = decimal_text(rho)
        a: Answer = yield Call(
            "POST", f"/v1/datasets/{dataset_id}/grants", False, kwargs={"json": body}
        )
        return LedgerEntry.model_validate(a.body)

    def _ledger(self, dataset_id: Id) -> Flow[list[LedgerEntry]]:
        rows = yield from self._pages(f"/v1/datasets/{dataset_id}/ledger", limit=500)
        return [LedgerEntry.model_validate(e) for e in rows]

    def _quantiles(
        self,
        dataset_id: Id,
        quantiles: Sequence[float],
        epsilon: Number,
        method: str,
        delta: Number | None,
        wait: bool,
        idempotency_key: str | None,
        timeout: float,
        column: str | None = None,
        group_by: str | None = None,
        keys: Sequence[str] | None = None,
        size_hints: Mapping[str, int] | None = None,
    ) -> Flow[Release]:
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if not wait:
            headers["Prefer"] = "respond-async"
        body = self._query_body(
            quantiles, epsilon, method, delta, column, group_by, keys, size_hints
        )
        # The Idempotency-Key makes a retry a replay: safe to repeat.
        a: Answer = yield Call(
            "POST",
            f"/v1/datasets/{dataset_id}/quantiles",
            True,
            kwargs={"json": body, "headers": headers},
        )
        release = Release.model_validate(a.body)
        release.replayed = a.headers.get("idempotent-replayed") == "true"
        if wait and release.pending:
            return (yield from self._wait(release, timeout, 0.2))
        return release

    def _quote(
        self,
        dataset_id: Id,
        quantiles: Sequence[float],
        epsilon: Number,
        method: str,
        delta: Number | None,
        column: str | None = None,
        group_by: str | None = None,
        keys: Sequence[str] | None = None,
        size_hints: Mapping[str, int] | None = None,
    ) -> Flow[Quote]:
        if not (yield from self._has("/v1/datasets/{dataset_id}/quote", "post")):
            raise NotSupported(404, "not_supported", "this server has no quote endpoint")
        body = self._query_body(
            quantiles, epsilon, method, delta, column, group_by, keys, size_hints
        )
        a: Answer = yield Call(
            "POST", f"/v1/datasets/{dataset_id}/quote", True, kwargs={"json": body}
        )
        return Quote.model_validate(a.body)

    def _methods(self) -> Flow[list[Method]]:
        if not (yield from self._has("/v1/methods", "get")):
            raise NotSupported(404, "not_supported", "this server has no methods endpoint")
        a: Answer = yield Call("GET", "/v1/methods", True)
        items = a.body.get("items", a.body) if isinstance(a.body, dict) else a.body
        return [Method.model_validate(item) for item in items]

    def _release(self, release_id: Id) -> Flow[Release]:
        a: Answer = yield Call("GET", f"/v1/releases/{release_id}", True, conditional=True)
        return Release.model_validate(a.body)

    def _releases(self, dataset_id: Id) -> Flow[list[Release]]:
        rows = yield from self._pages(f"/v1/datasets/{dataset_id}/releases", limit=500)
        return [Release.model_validate(r) for r in rows]

    def _wait(self, release: Release | Id, timeout: float, interval: float) -> Flow[Release]:
        release_id = release.id if isinstance(release, Release) else release
        waited = 0.0
        while True:
            current = yield from self._release(release_id)
            if current.failed:
                raise ReleaseFailed(current)
            if not current.pending:
                return current
            if waited > timeout:
                raise TimeoutError(f"release {release_id} still pending after {timeout} s")
            yield Sleep(interval)
            waited += interval
            interval = min(interval * 1.5, 2.0)

    def _api_keys(self) -> Flow[list[Key]]:
        a: Answer = yield Call("GET", "/v1/keys", True)
        return [Key.model_validate(k) for k in a.body["items"]]

    def _create_key(
        self,
        role: str,
        dataset_id: Id | None,
        name: str,
        max_epsilon: Number | None = None,
        max_delta: Number | None = None,
        expires_at: datetime | None = None,
    ) -> Flow[KeyCreated]:
        body: dict[str, Any] = {"role": role, "name": name}
        if dataset_id is not None:
            body["dataset_id"] = str(dataset_id)
        if max_epsilon is not None:
            body["max_epsilon"] = decimal_text(max_epsilon)
        if max_delta is not None:
            body["max_delta"] = decimal_text(max_delta)
        if expires_at is not None:
            body["expires_at"] = expires_at.isoformat()
        a: Answer = yield Call("POST", "/v1/keys", False, kwargs={"json": body})
        return KeyCreated.model_validate(a.body)

    def _rotate_key(self, key_id: Id) -> Flow[KeyCreated]:
        a: Answer = yield Call("POST", f"/v1/keys/{key_id}/rotate", False)
        return KeyCreated.model_validate(a.body)

    def _update_dataset(
        self, dataset_id: Id, name: str | None, description: str | None
    ) -> Flow[Dataset]:
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if description is not None:
            body["description"] = description
        a: Answer = yield Call("PATCH", f"/v1/datasets/{dataset_id}", True, kwargs={"json": body})
        return Dataset.model_validate(a.body)

    def _archive_dataset(self, dataset_id: Id) -> Flow[None]:
        yield Call("DELETE", f"/v1/datasets/{dataset_id}", True)
        return None

    def _audit(self) -> Flow[list[AuditEvent]]:
        rows = yield from self._pages("/v1/audit", limit=500)
        return [AuditEvent.model_validate(e) for e in rows]

    def _revoke_key(self, key_id: Id) -> Flow[None]:
        yield Call("DELETE", f"/v1/keys/{key_id}", True)
        return None


def _json_or_none(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None
