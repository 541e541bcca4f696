"""The synchronous client: one method per endpoint, retries, ETags, typed errors."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

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
    Budget,
    Dataset,
    Key,
    KeyCreated,
    LedgerEntry,
    Me,
    Quote,
    Release,
)

M = TypeVar("M", bound=BaseModel)
Number = int | float | str | Decimal


def _decimal_text(value: Number) -> str:
    """Budgets travel as JSON strings, so 0.1 stays exactly 0.1."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class Client:
    """A client for one dpquant server and one API key.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"``.
        api_key: the ``dpq_...`` key (sent as ``Authorization: Bearer``; never logged).
        timeout: seconds per HTTP request.
        retries: extra attempts after a 503, a 429 or a connection error. Requests that
            could spend or change something twice are only retried when the server cannot
            have acted on them (503) or when an ``Idempotency-Key`` makes them safe
            (``quantiles``, which always sends one).
        backoff: seconds before the first retry (doubles each time).
        transport: an ``httpx`` transport (tests use it to inject failures).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )
        self._etags: dict[str, tuple[str, Any]] = {}
        self._paths: dict[str, Any] | None = None
        #: HTTP status of the last answer (201 or 202 after ``quantiles``, 304 after a hit).
        self.last_status: int | None = None

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never the key
        return f"Client({self.base_url!r})"

    def _send(
        self,
        method: str,
        path: str,
        *,
        safe_to_repeat: bool,
        conditional: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One call with retries; raises the typed error for any 4xx/5xx answer."""
        headers: dict[str, str] = dict(kwargs.pop("headers", None) or {})
        cache_key = path + "?" + json.dumps(kwargs.get("params"), sort_keys=True, default=str)
        cached = self._etags.get(cache_key) if conditional else None
        if cached is not None:
            headers["If-None-Match"] = cached[0]
        delay = self.backoff
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as exc:
                # The request may have reached the server: repeat only what is safe to.
                if last or not safe_to_repeat:
                    raise ConnectionFailed(0, "connection_failed", type(exc).__name__) from exc
                time.sleep(delay)
                delay *= 2
                continue
            self.last_status = response.status_code
            if response.status_code == 304 and cached is not None:
                response._dpquant_body = cached[1]  # type: ignore[attr-defined]
                return response
            if response.status_code < 400:
                if conditional and "etag" in response.headers:
                    self._etags[cache_key] = (response.headers["etag"], response.json())
                return response
            error = error_from(response.status_code, _json_or_none(response), response.headers)
            # 503: the server rolled back, nothing was charged; 429: not even looked at.
            if not last and isinstance(error, ServiceUnavailable | RateLimited):
                wait = delay
                if isinstance(error, RateLimited) and error.retry_after:
                    wait = max(wait, error.retry_after)
                else:
                    retry_after = response.headers.get("retry-after")
                    if retry_after and retry_after.isdigit():
                        wait = max(wait, float(retry_after))
                time.sleep(min(wait, 30.0))
                delay *= 2
                continue
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def _get(self, path: str, model: type[M], *, conditional: bool = False, **kw: Any) -> M:
        response = self._send("GET", path, safe_to_repeat=True, conditional=conditional, **kw)
        return model.model_validate(_body(response))

    def _pages(self, path: str, *, limit: int = 200) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if cursor:
                params["cursor"] = cursor
            page = _body(self._send("GET", path, safe_to_repeat=True, params=params))
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def _has(self, path: str, method: str) -> bool:
        """Whether the server's OpenAPI document lists this operation."""
        if self._paths is None:
            try:
                doc = _body(self._send("GET", "/openapi.json", safe_to_repeat=True))
                self._paths = doc.get("paths", {})
            except DpquantError:
                self._paths = {}
        return method in (self._paths or {}).get(path, {})

    # ------------------------------------------------------------------ identity, health

    def me(self) -> Me:
        """The calling key's id, role and dataset scope."""
        return self._get("/v1/keys/me", Me)

    def health(self) -> bool:
        """Liveness (``/healthz``)."""
        return bool(_body(self._send("GET", "/healthz", safe_to_repeat=True))["status"] == "ok")

    def ready(self) -> bool:
        """Readiness (``/readyz``): database reachable and migrated."""
        try:
            self._send("GET", "/readyz", safe_to_repeat=False)
        except DpquantError:
            return False
        return True

    # ------------------------------------------------------------------ datasets

    def datasets(self) -> list[Dataset]:
        """Every dataset the key may see, newest first (follows the pages)."""
        return [Dataset.model_validate(d) for d in self._pages("/v1/datasets")]

    def dataset(self, dataset_id: uuid.UUID | str) -> Dataset:
        """One dataset."""
        return self._get(f"/v1/datasets/{dataset_id}", Dataset)

    def create_dataset(
        self,
        name: str,
        *,
        lower: float,
        upper: float,
        epsilon: Number = 0,
        delta: Number = 0,
        neighbors: str = "swap",
        description: str = "",
        granularity: float | None = None,
    ) -> Dataset:
        """Create a dataset (admin): public bounds, neighbour relation, initial budget."""
        body: dict[str, Any] = {
            "name": name,
            "description": description,
            "lower": lower,
            "upper": upper,
            "neighbors": neighbors,
            "epsilon": _decimal_text(epsilon),
            "delta": _decimal_text(delta),
        }
        if granularity is not None:
            body["granularity"] = granularity
        r = self._send("POST", "/v1/datasets", safe_to_repeat=False, json=body)
        return Dataset.model_validate(_body(r))

    def upload(
        self,
        dataset_id: uuid.UUID | str,
        values: Sequence[float] | None = None,
        *,
        path: str | Path | None = None,
        column: str | None = None,
    ) -> Dataset:
        """Replace a dataset's values (admin) from numbers or a file.

        Files: ``.csv`` (pick the column with ``column=``), ``.json`` (an array of numbers),
        anything else is sent as little-endian float64 bytes. Uploading replaces the values
        atomically, so repeating it is safe.
        """
        if (values is None) == (path is None):
            raise TypeError("pass exactly one of values= or path=")
        params = {"column": column} if column else None
        url = f"/v1/datasets/{dataset_id}/values"
        if values is not None:
            kwargs: dict[str, Any] = {"json": [float(v) for v in values]}
        else:
            file = Path(str(path))
            suffix = file.suffix.lower()
            media = {".csv": "text/csv", ".json": "application/json"}.get(
                suffix, "application/octet-stream"
            )
            kwargs = {"content": file.read_bytes(), "headers": {"Content-Type": media}}
        r = self._send("PUT", url, safe_to_repeat=True, params=params, **kwargs)
        return Dataset.model_validate(_body(r))

    # ------------------------------------------------------------------ budget and ledger

    def budget(self, dataset_id: uuid.UUID | str) -> Budget:
        """Granted, spent and remaining (free; cached with the ETag)."""
        return self._get(f"/v1/datasets/{dataset_id}/budget", Budget, conditional=True)

    def grant(
        self, dataset_id: uuid.UUID | str, *, reason: str, epsilon: Number = 0, delta: Number = 0
    ) -> LedgerEntry:
        """Add epsilon and/or delta to a dataset's budget (admin)."""
        body = {"epsilon": _decimal_text(epsilon), "delta": _decimal_text(delta), "reason": reason}
        r = self._send("POST", f"/v1/datasets/{dataset_id}/grants", safe_to_repeat=False, json=body)
        return LedgerEntry.model_validate(_body(r))

    def ledger(self, dataset_id: uuid.UUID | str) -> list[LedgerEntry]:
        """Every ledger row, newest first (admin)."""
        rows = self._pages(f"/v1/datasets/{dataset_id}/ledger", limit=500)
        return [LedgerEntry.model_validate(e) for e in rows]

    # ------------------------------------------------------------------ releases

    def quantiles(
        self,
        dataset_id: uuid.UUID | str,
        quantiles: Sequence[float],
        *,
        epsilon: Number,
        method: str = "jointexp",
        delta: Number | None = None,
        wait: bool = True,
        idempotency_key: str | None = None,
        timeout: float = 300.0,
    ) -> Release:
        """Release differentially private quantiles (spends the budget).

        An ``Idempotency-Key`` is always sent (a fresh one unless given) and reused for the
        client's own retries, so a lost answer is never paid twice. ``wait=False`` asks the
        server to answer at once (``Prefer: respond-async``): the release may come back
        ``pending``; :meth:`wait` polls it. With ``wait=True`` a pending release is awaited.
        """
        body: dict[str, Any] = {
            "quantiles": [float(q) for q in quantiles],
            "epsilon": _decimal_text(epsilon),
            "method": method,
        }
        if delta is not None:
            body["delta"] = _decimal_text(delta)
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if not wait:
            headers["Prefer"] = "respond-async"
        r = self._send(
            "POST",
            f"/v1/datasets/{dataset_id}/quantiles",
            safe_to_repeat=True,  # the Idempotency-Key makes the retry a replay
            json=body,
            headers=headers,
        )
        release = Release.model_validate(_body(r))
        release.replayed = r.headers.get("idempotent-replayed") == "true"
        if wait and release.pending:
            return self.wait(release, timeout=timeout)
        return release

    def quote(
        self,
        dataset_id: uuid.UUID | str,
        quantiles: Sequence[float],
        *,
        epsilon: Number,
        method: str = "jointexp",
        delta: Number | None = None,
    ) -> Quote:
        """What the query would cost, without spending (raises NotSupported on servers
        without the quote endpoint)."""
        if not self._has("/v1/datasets/{dataset_id}/quote", "post"):
            raise NotSupported(404, "not_supported", "this server has no quote endpoint")
        body: dict[str, Any] = {
            "quantiles": [float(q) for q in quantiles],
            "epsilon": _decimal_text(epsilon),
            "method": method,
        }
        if delta is not None:
            body["delta"] = _decimal_text(delta)
        r = self._send("POST", f"/v1/datasets/{dataset_id}/quote", safe_to_repeat=True, json=body)
        return Quote.model_validate(_body(r))

    def methods(self) -> list[Any]:
        """The server's methods (raises NotSupported on servers without ``/v1/methods``)."""
        if not self._has("/v1/methods", "get"):
            raise NotSupported(404, "not_supported", "this server has no methods endpoint")
        body = _body(self._send("GET", "/v1/methods", safe_to_repeat=True))
        items = body.get("items", body) if isinstance(body, dict) else body
        return list(items)

    def release(self, release_id: uuid.UUID | str) -> Release:
        """A stored release (free; cached with the ETag, so polling costs 304s)."""
        return self._get(f"/v1/releases/{release_id}", Release, conditional=True)

    def releases(self, dataset_id: uuid.UUID | str) -> list[Release]:
        """Every release of a dataset, newest first."""
        rows = self._pages(f"/v1/datasets/{dataset_id}/releases", limit=500)
        return [Release.model_validate(r) for r in rows]

    def wait(
        self, release: Release | uuid.UUID | str, *, timeout: float = 300.0, interval: float = 0.2
    ) -> Release:
        """Poll a release until it is no longer ``pending``.

        Returns the ``done`` release; raises :class:`ReleaseFailed` when it ``failed`` (its
        cost stays charged) and ``TimeoutError`` after ``timeout`` seconds.
        """
        release_id = release.id if isinstance(release, Release) else release
        deadline = time.monotonic() + timeout
        while True:
            current = self.release(release_id)
            if current.failed:
                raise ReleaseFailed(current)
            if not current.pending:
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"release {release_id} still pending after {timeout} s")
            time.sleep(interval)
            interval = min(interval * 1.5, 2.0)

    # ------------------------------------------------------------------ keys

    def api_keys(self) -> list[Key]:
        """Every API key (admin); never a secret."""
        body = _body(self._send("GET", "/v1/keys", safe_to_repeat=True))
        return [Key.model_validate(k) for k in body["items"]]

    def create_key(
        self, role: str, *, dataset_id: uuid.UUID | str | None = None, name: str = ""
    ) -> KeyCreated:
        """Create a key (admin); ``.key`` holds the secret, shown this once."""
        body: dict[str, Any] = {"role": role, "name": name}
        if dataset_id is not None:
            body["dataset_id"] = str(dataset_id)
        r = self._send("POST", "/v1/keys", safe_to_repeat=False, json=body)
        return KeyCreated.model_validate(_body(r))

    def revoke_key(self, key_id: uuid.UUID | str) -> None:
        """Revoke a key (admin); idempotent."""
        self._send("DELETE", f"/v1/keys/{key_id}", safe_to_repeat=True)


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _body(response: httpx.Response) -> Any:
    cached = getattr(response, "_dpquant_body", None)
    if cached is not None:
        return cached
    return response.json()
