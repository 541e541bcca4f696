"""Waiting for releases to finish, in the web process, holding nothing while waiting.

One ``LISTEN`` connection per web process (an asyncio task started by the lifespan) receives
the workers' ``NOTIFY`` of finished releases and wakes the requests waiting for them. A
waiting request holds no thread, no pooled connection, no lock and no admission slot. A
finished announcement carries the outcome (status, failure, finish time, estimates; see
migration 0007), so a request that reserved the release completes it in memory; otherwise
(a replayed release, or an outcome too large for a notification) it re-reads the release
when woken. It re-reads at least every :data:`RECHECK_S` seconds, so a lost notification
(or a listener reconnecting) only delays an answer, never loses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg

from app.core.pg import conninfo
from app.releases.service import FINISHED_CHANNEL

logger = logging.getLogger(__name__)

#: A waiting request re-reads its release at least this often.
RECHECK_S = 1.0

T = TypeVar("T")


class Watch:
    """One waiter's wake-up: ``event`` is set whenever the release may have finished;
    ``outcome`` holds the announced outcome once one arrived (None: read the row)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.outcome: dict[str, Any] | None = None
        self._loop = asyncio.get_running_loop()

    def wake(self) -> None:
        """Set ``event`` from the hub's loop; thread-safely when the waiter runs on another
        (test clients serve each request on an event loop of its own)."""
        if asyncio.get_running_loop() is self._loop:
            self.event.set()
        else:
            with suppress(RuntimeError):  # that loop may have closed since (request over)
                self._loop.call_soon_threadsafe(self.event.set)


def parse_announcement(payload: str) -> tuple[uuid.UUID, dict[str, Any] | None] | None:
    """A finished announcement: the release id and, when the payload carries it, the outcome
    (a JSON object with ``id``, ``status``, ``failure``, ``finished_at``, ``estimates``)."""
    try:
        if not payload.startswith("{"):
            return uuid.UUID(payload), None
        outcome = json.loads(payload)
        return uuid.UUID(outcome["id"]), outcome
    except (ValueError, KeyError, TypeError):
        return None


class CompletionHub:
    """Wakes waiters when their release id is announced on :data:`FINISHED_CHANNEL`."""

    def __init__(self, url: str) -> None:
        self._conninfo = conninfo(url)
        self._watches: dict[uuid.UUID, set[Watch]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening (call inside the event loop that serves the requests)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _listen(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {FINISHED_CHANNEL}")
                    self._wake_all()  # anything finished while we were not listening
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("release listener lost its connection (%s)", type(exc).__name__)
                self._wake_all()
                await asyncio.sleep(1.0)

    def _wake(self, payload: str) -> None:
        parsed = parse_announcement(payload)
        if parsed is None:
            return
        release_id, outcome = parsed
        for watch in list(self._watches.get(release_id, ())):
            watch.outcome = outcome
            watch.wake()

    def _wake_all(self) -> None:
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.wake()

    @contextmanager
    def watch(self, release_id: uuid.UUID) -> Iterator[Watch]:
        """A :class:`Watch` woken whenever ``release_id`` may have finished (while open)."""
        watch = Watch()
        self._watches.setdefault(release_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(release_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[release_id]


async def wait_until(
    hub: CompletionHub,
    release_id: uuid.UUID,
    *,
    read: Callable[[], Awaitable[T]],
    finished: Callable[[T], bool],
    timeout_s: float,
    watching: Watch | None = None,
    complete: Callable[[dict[str, Any]], T | None] | None = None,
) -> T:
    """Wait until the release is ``finished`` or ``timeout_s`` has passed; returns the last
    state seen.

    ``watching``: a :class:`Watch` from :meth:`CompletionHub.watch` registered *before* the
    release was committed as pending. Nothing can have finished unheard then, so the first
    read waits for a notification (or :data:`RECHECK_S`) instead of reading a row known to
    be pending. ``complete``: builds the finished state from an announced outcome (None if it
    cannot), which saves the read.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    if watching is not None:
        return await _wait_loop(watching, deadline, read, finished, complete, skip_first=True)
    with hub.watch(release_id) as watch:
        return await _wait_loop(watch, deadline, read, finished, complete, skip_first=False)


async def _wait_loop(
    watch: Watch,
    deadline: float,
    read: Callable[[], Awaitable[T]],
    finished: Callable[[T], bool],
    complete: Callable[[dict[str, Any]], T | None] | None,
    *,
    skip_first: bool,
) -> T:
    loop = asyncio.get_running_loop()
    if skip_first:
        with suppress(TimeoutError):
            await asyncio.wait_for(
                watch.event.wait(), timeout=max(0.0, min(RECHECK_S, deadline - loop.time()))
            )
    while True:
        watch.event.clear()
        current = None
        if complete is not None and watch.outcome is not None:
            current = complete(watch.outcome)
        if current is None:
            current = await read()
        remaining = deadline - loop.time()
        if finished(current) or remaining <= 0:
            return current
        with suppress(TimeoutError):
            await asyncio.wait_for(watch.event.wait(), timeout=min(RECHECK_S, remaining))
