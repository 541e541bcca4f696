"""Waiting for releases to finish, in the web process, holding nothing while waiting.

One ``LISTEN`` connection per web process (an asyncio task started by the lifespan) receives
the workers' ``NOTIFY`` of finished releases and wakes the requests waiting for them. A
waiting request holds no thread, no pooled connection, no lock and no admission slot; it
re-reads the release when woken, and at least every :data:`RECHECK_S` seconds, so a lost
notification (or a listener reconnecting) only delays an answer, never loses it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

import anyio
import psycopg
from sqlalchemy.engine import make_url

from app.releases.service import FINISHED_CHANNEL

logger = logging.getLogger(__name__)

#: A waiting request re-reads its release at least this often.
RECHECK_S = 1.0

T = TypeVar("T")


def libpq_conninfo(url: str) -> str:
    """A libpq URI for ``url`` (SQLAlchemy's driver suffix removed, options kept)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class CompletionHub:
    """Wakes waiters when their release id is announced on :data:`FINISHED_CHANNEL`."""

    def __init__(self, url: str) -> None:
        self._conninfo = libpq_conninfo(url)
        self._events: dict[uuid.UUID, set[asyncio.Event]] = {}
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
        try:
            release_id = uuid.UUID(payload)
        except ValueError:
            return
        for event in self._events.get(release_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for events in self._events.values():
            for event in events:
                event.set()

    @contextmanager
    def watch(self, release_id: uuid.UUID) -> Iterator[asyncio.Event]:
        """An event set whenever ``release_id`` may have finished (registered while open)."""
        event = asyncio.Event()
        self._events.setdefault(release_id, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._events.get(release_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._events[release_id]


async def wait_until(
    hub: CompletionHub,
    release_id: uuid.UUID,
    *,
    read: Callable[[], T],
    finished: Callable[[T], bool],
    timeout_s: float,
    watching: asyncio.Event | None = None,
) -> T:
    """Re-read the release until ``finished`` or ``timeout_s``; returns the last read.

    ``watching``: an event from :meth:`CompletionHub.watch` registered *before* the release
    was committed as pending. Nothing can have finished unheard then, so the first read
    waits for a notification (or :data:`RECHECK_S`) instead of reading a row known to be
    pending.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    if watching is not None:
        return await _wait_loop(watching, deadline, read, finished, skip_first_read=True)
    with hub.watch(release_id) as event:
        return await _wait_loop(event, deadline, read, finished, skip_first_read=False)


async def _wait_loop(
    event: asyncio.Event,
    deadline: float,
    read: Callable[[], T],
    finished: Callable[[T], bool],
    *,
    skip_first_read: bool,
) -> T:
    loop = asyncio.get_running_loop()
    if skip_first_read:
        with suppress(TimeoutError):
            await asyncio.wait_for(
                event.wait(), timeout=max(0.0, min(RECHECK_S, deadline - loop.time()))
            )
    while True:
        event.clear()
        current = await anyio.to_thread.run_sync(read)
        remaining = deadline - loop.time()
        if finished(current) or remaining <= 0:
            return current
        with suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=min(RECHECK_S, remaining))
