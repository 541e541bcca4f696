"""The asynchronous client: the same methods as :class:`Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dpquant_client._core import Answer, Call, Core, Flow, Id, Number, Sleep
from dpquant_client.errors import DpquantError, NameTaken, NotFound
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


class AsyncClient(Core):
    """Like :class:`dpquant_client.Client`, for ``asyncio`` (``async with AsyncClient(...)``).

    Same arguments, same retries, ETag cache and typed errors; ``transport`` is an
    ``httpx.AsyncBaseTransport``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, retries=retries, backoff=backoff)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call) -> Answer:
        attempt = 0
        while True:
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = await self._http.request(**self.prepare(call))
            except httpx.TransportError as exc:
                error = exc
            result = self.outcome(call, attempt, response, error)
            if isinstance(result, Answer):
                return result
            await asyncio.sleep(result)
            attempt += 1

    async def _arun(self, flow: Flow[T]) -> T:
        """Drive a flow: send its calls, sleep its pauses, hand errors back into it."""
        try:
            step = next(flow)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = flow.send(None)
                    continue
                try:
                    answer = await self._send(step)
                except DpquantError as exc:  # the flow may handle it (or it propagates)
                    step = flow.throw(exc)
                else:
                    step = flow.send(answer)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def me(self) -> Me:
        """The calling key's id, role and dataset scope."""
        return await self._arun(self._me())

    async def health(self) -> bool:
        """Liveness (``/healthz``)."""
        return await self._arun(self._health())

    async def ready(self) -> bool:
        """Readiness (``/readyz``): database reachable and migrated."""
        return await self._arun(self._ready())

    async def get_or_create_dataset(self, name: str, **settings: Any) -> Dataset:
        """The live dataset called ``name``, created with ``settings`` (the arguments of
        :meth:`create_dataset`) when there is none. An existing dataset is returned as it is:
        its bounds and budget are not compared with ``settings``. Safe against a concurrent
        creator (its dataset is returned)."""
        for attempt in range(2):
            for ds in await self.datasets():
                if ds.name == name and ds.archived_at is None:
                    return ds
            if attempt:
                break
            try:
                return await self.create_dataset(name, **settings)
            except NameTaken:
                continue  # created meanwhile: read it
        raise NotFound(404, "not_found", f"dataset {name!r} was neither found nor created")

    async def datasets(self) -> list[Dataset]:
        """Every dataset the key may see, newest first (follows the pages)."""
        return await self._arun(self._datasets())

    async def dataset(
        self,
        dataset_id: Id,
    ) -> Dataset:
        """One dataset (admins also get ``n`` and the upload state)."""
        return await self._arun(self._dataset(dataset_id))

    async def create_dataset(
        self,
        name: str,
        *,
        lower: float | None = None,
        upper: float | None = None,
        epsilon: Number = 0,
        delta: Number = 0,
        neighbors: str = "swap",
        description: str = "",
        granularity: float | None = None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int = 1,
        max_groups_per_unit: int = 1,
        columns: Sequence[Mapping[str, Any]] | None = None,
        accounting: str = "pure",
        rho: Number | None = None,
    ) -> Dataset:
        """Create a dataset (admin): public bounds, neighbour relation, initial budget;
        ``privacy_unit`` names the column identifying a person in uploads, whose rows are
        kept to ``max_rows_per_unit`` (releases are then private per person). ``columns``
        declares a table instead of ``lower``/``upper``: ``{"name", "type": "numeric" |
        "integer", "lower", "upper", "granularity"}`` or ``{"name", "type": "categorical",
        "keys"}``. ``accounting="zcdp"`` composes releases in zCDP (give ``delta`` > 0, the
        delta the guarantee is stated at, and the budget as ``epsilon`` or ``rho``)."""
        return await self._arun(
            self._create_dataset(
                name,
                lower,
                upper,
                epsilon,
                delta,
                neighbors,
                description,
                granularity,
                privacy_unit,
                max_rows_per_unit,
                max_groups_per_unit,
                columns,
                accounting,
                rho,
            )
        )

    async def upload(
        self,
        dataset_id: Id,
        values: Sequence[float] | None = None,
        *,
        path: str | Path | None = None,
        column: str | None = None,
    ) -> Dataset:
        """Replace a dataset's values (admin) from numbers or a file.

        Files: ``.csv`` (pick the column with ``column=``; a table's CSV names its columns in
        its header), ``.json`` (an array of numbers, or of objects for a table), ``.parquet``
        (``column=`` for one column), anything else as little-endian float64 bytes."""
        return await self._arun(self._upload(dataset_id, values, path, column))

    async def budget(
        self,
        dataset_id: Id,
        *,
        typical: Number | None = None,
    ) -> Budget:
        """Granted, spent and remaining, the guarantee so far (zCDP tables: rho and its
        conversion) and releases left of JointExp at ``typical`` (default 0.1). Free;
        cached with the ETag, polls cost a 304."""
        return await self._arun(self._budget(dataset_id, typical))

    async def grant(
        self,
        dataset_id: Id,
        *,
        reason: str,
        epsilon: Number = 0,
        delta: Number = 0,
        rho: Number = 0,
    ) -> LedgerEntry:
        """Add epsilon and/or delta to a dataset's budget (admin); a zCDP table takes epsilon
        (converted to rho at its delta) or ``rho``."""
        return await self._arun(self._grant(dataset_id, reason, epsilon, delta, rho))

    async def ledger(
        self,
        dataset_id: Id,
    ) -> list[LedgerEntry]:
        """Every ledger row, newest first (admin)."""
        return await self._arun(self._ledger(dataset_id))

    async def quantiles(
        self,
        dataset_id: Id,
        quantiles: Sequence[float],
        *,
        epsilon: Number,
        method: str = "jointexp",
        delta: Number | None = None,
        wait: bool = True,
        idempotency_key: str | None = None,
        timeout: float = 300.0,
        column: str | None = None,
        group_by: str | None = None,
        keys: Sequence[str] | None = None,
        size_hints: Mapping[str, int] | None = None,
    ) -> Release:
        """Release differentially private quantiles (spends the budget).

        An ``Idempotency-Key`` is always sent (a fresh one unless given) and reused for the
        client's own retries, so a lost answer is never paid twice. ``wait=False`` asks the
        server to answer at once (``Prefer: respond-async``): the release may come back
        ``pending`` and :meth:`wait` polls it. With ``wait=True`` a pending release is awaited.
        ``group_by`` (a categorical column) answers the quantiles once per key (``keys``, else
        the column's declared keys) in one release: ``release.groups``; ``size_hints``
        (public approximate rows per key, typed by you) give those groups an expected error
        and error bars (``group.expected_error``, ``group.intervals``)."""
        return await self._arun(
            self._quantiles(
                dataset_id,
                quantiles,
                epsilon,
                method,
                delta,
                wait,
                idempotency_key,
                timeout,
                column,
                group_by,
                keys,
                size_hints,
            )
        )

    async def quote(
        self,
        dataset_id: Id,
        quantiles: Sequence[float],
        *,
        epsilon: Number,
        method: str = "jointexp",
        delta: Number | None = None,
        column: str | None = None,
        group_by: str | None = None,
        keys: Sequence[str] | None = None,
        size_hints: Mapping[str, int] | None = None,
    ) -> Quote:
        """What the query would cost, without spending; ``NotSupported`` on servers without it."""
        return await self._arun(
            self._quote(
                dataset_id, quantiles, epsilon, method, delta, column, group_by, keys, size_hints
            )
        )

    async def methods(self) -> list[Method]:
        """The server's methods; ``NotSupported`` on servers without ``/v1/methods``."""
        return await self._arun(self._methods())

    async def release(
        self,
        release_id: Id,
    ) -> Release:
        """A stored release (free; cached with the ETag, so polling costs 304s)."""
        return await self._arun(self._release(release_id))

    async def releases(
        self,
        dataset_id: Id,
    ) -> list[Release]:
        """Every release of a dataset, newest first."""
        return await self._arun(self._releases(dataset_id))

    async def wait(
        self,
        release: Release | Id,
        *,
        timeout: float = 300.0,
        interval: float = 0.2,
    ) -> Release:
        """Poll a release until it is no longer ``pending``.

        Returns the ``done`` release; raises :class:`ReleaseFailed` when it ``failed`` (its
        cost stays charged) and ``TimeoutError`` after ``timeout`` seconds."""
        return await self._arun(self._wait(release, timeout, interval))

    async def api_keys(self) -> list[Key]:
        """Every API key (admin); never a secret."""
        return await self._arun(self._api_keys())

    async def create_key(
        self,
        role: str,
        *,
        dataset_id: Id | None = None,
        name: str = "",
        max_epsilon: Number | None = None,
        max_delta: Number | None = None,
        expires_at: datetime | None = None,
    ) -> KeyCreated:
        """Create a key (admin); ``.key`` holds the secret, shown this once. ``max_epsilon``
        / ``max_delta`` cap what it may spend in total; ``expires_at`` (aware) ends it."""
        return await self._arun(
            self._create_key(role, dataset_id, name, max_epsilon, max_delta, expires_at)
        )

    async def rotate_key(self, key_id: Id) -> KeyCreated:
        """A new secret for the key (admin); the old one stops working at once."""
        return await self._arun(self._rotate_key(key_id))

    async def update_dataset(
        self, dataset_id: Id, *, name: str | None = None, description: str | None = None
    ) -> Dataset:
        """Rename and/or re-describe a dataset (admin)."""
        return await self._arun(self._update_dataset(dataset_id, name, description))

    async def archive_dataset(self, dataset_id: Id) -> None:
        """Archive a dataset (admin): values deleted, ledger and releases kept, name freed."""
        return await self._arun(self._archive_dataset(dataset_id))

    async def audit(self) -> list[AuditEvent]:
        """The audit log of admin actions, newest first (admin)."""
        return await self._arun(self._audit())

    async def revoke_key(
        self,
        key_id: Id,
    ) -> None:
        """Revoke a key (admin); idempotent."""
        return await self._arun(self._revoke_key(key_id))
