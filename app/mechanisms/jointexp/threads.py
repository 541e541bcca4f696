"""Threads of the certificate of a tilted pass (:mod:`~app.mechanisms.jointexp.certificate`):
its first error pass beside the forward rows (:class:`Stream`), the rest beside the sweep
(:class:`Background`), and the signal that a pass was given up (:class:`Cancelled`)."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.mechanisms.fpmode import flush_subnormals

if TYPE_CHECKING:
    from app.mechanisms.jointexp.certificate import Level


class Cancelled(RuntimeError):
    """The certificate's pass was given up while an error pass ran (nothing reads it)."""


class Background:
    """The certificate, ``fn()``, computed in a thread of its own: started at the sweep's
    first draw, which sets its target (a function of the data alone), it joins the first
    error pass and runs any further ones while the sweep draws its other blocks on the
    other core. Subnormals are flushed as in the caller's thread. :meth:`join` returns the
    value, or raises what ``fn`` raised."""

    def __init__(self, fn: Callable[[], float]) -> None:
        self._fn: Callable[[], float] | None = fn
        self._value: float | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            with flush_subnormals():
                fn, self._fn = self._fn, None
                if fn is not None:
                    self._value = fn()
        except BaseException as exc:  # handed to the caller in :meth:`join`
            self._error = exc

    def join(self) -> float:
        """The certificate's value (waits for the thread)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._value is None:  # (fn always returns a float or raises)
            raise RuntimeError("the certificate's thread returned nothing")
        return self._value


class Stream:
    """A :class:`Level` run in a thread of its own, row j as soon as the forward pass has
    recorded it (:meth:`push`): the forward rows and the first error pass then take the
    time of the slower of the two on two cores (each row's kernel releases the GIL). The
    level is built in the thread too (``make``: its row 1 is a pass over every interval).
    The thread flushes subnormals as the forward pass does (the bits are per thread).
    A pass that is given up (:meth:`cancel`) stops its thread at the next row."""

    def __init__(self, make: Callable[[], Level], follow: int = 0) -> None:
        """``follow``: that many further streams, each running the next error pass on the
        previous one's rows as they come (a Level's
        :attr:`~app.mechanisms.jointexp.certificate.Level.follower`)."""
        self._make: Callable[[], Level] | None = make
        self._follow = follow
        self.level: Level | None = None
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            with flush_subnormals():
                make, self._make = self._make, None  # (drop what it held: the forward pass)
                if make is None:
                    return
                level = self.level = make()
                follower = None
                if self._follow > 0:
                    follower = level.follower = Stream(
                        functools.partial(level.cert.level, level.out, False), self._follow - 1
                    )
                    if self._cancelled:
                        follower.cancel()
                try:
                    while not self._cancelled:
                        j = self._queue.get()
                        if j <= 0 or self._cancelled:
                            return
                        level.row(j)
                        if follower is not None:
                            follower.push(j)
                finally:
                    if follower is not None:
                        follower.close()
        except BaseException as exc:  # handed to the caller in :meth:`join`
            self._error = exc

    def cancel(self) -> None:
        """The pass is given up: the thread stops before its next row (never joined), and
        so does its follower."""
        self._cancelled = True
        self._queue.put(0)
        level = self.level
        if level is not None and level.follower is not None:
            level.follower.cancel()

    def push(self, j: int) -> None:
        """The forward pass has recorded row j."""
        self._queue.put(j)

    def close(self) -> None:
        """No more rows (the pass ended, or failed: then the result is not read)."""
        self._queue.put(0)

    def join(self) -> Level | None:
        """The finished pass (after :meth:`close`); None after :meth:`cancel`."""
        self._thread.join()
        if self._cancelled or isinstance(self._error, Cancelled):
            return None
        if self._error is not None:
            raise self._error
        return self.level
