"""Release workers: a supervisor and its worker processes (``dpquant worker``).

Each worker process loops: claim the oldest runnable release (``FOR UPDATE SKIP LOCKED`` on
the ``release`` table, :mod:`app.releases.runner`), run its mechanism outside any
transaction, store ``done`` or ``failed``; when idle it sleeps on ``LISTEN`` for new
reservations (and polls every ``worker_poll_s`` for expired leases).

The supervisor enforces the hard time limit, which a thread cannot: each worker publishes
the release it is running and its deadline in shared memory; past the deadline the
supervisor kills the worker (SIGKILL), marks the release ``failed`` (``timeout``, the debit
stays) and starts a new worker. A worker that dies by itself gives its release back to the
queue at once. If the whole machine dies, the releases' leases expire and workers elsewhere
claim them again; ``max_runs`` bounds the runs one release can start.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.sharedctypes import Synchronized
from types import FrameType
from typing import Any, TypeVar

import numpy as np
import psycopg

from app.core import tracing
from app.core.config import Settings
from app.core.db import CommitOutcomeUnknown
from app.core.metrics import (
    MECHANISM_SECONDS,
    PUBLICATION_HOLD_SECONDS,
    RELEASE_OVERRUNS,
    VALUES_CACHE_BYTES,
    VALUES_CACHE_CAPACITY,
    forget_process,
)
from app.core.pg import Link, conninfo
from app.datasets.service import ARCHIVED_CHANNEL, VALUES_CACHE
from app.mechanisms import MECHANISMS, GridHistogram
from app.releases.runner import (
    FAILURE_TIMEOUT,
    Claim,
    Connection,
    RunFailed,
    claim_batch,
    complete_batch,
    expire_lease,
    fail,
    load_job,
    run_job,
    start_run,
)
from app.releases.schedule import bound_of_claim
from app.releases.service import PENDING_CHANNEL

logger = logging.getLogger("dpquant.worker")


class Slot:
    """What one worker is running, shared with the supervisor (release, lease, deadline)."""

    def __init__(self, ctx: SpawnContext) -> None:
        self.lock = ctx.Lock()
        # ctypes char arrays (``.raw`` is their bytes); guarded by ``lock``.
        self.release: Any = ctx.Array("c", 16, lock=False)
        self.token: Any = ctx.Array("c", 16, lock=False)
        self.deadline: Synchronized[float] = ctx.Value("d", 0.0, lock=False)

    def set(self, claim: Claim, deadline: float) -> None:
        with self.lock:
            self.release.raw = claim.release_id.bytes
            self.token.raw = claim.token.bytes
            self.deadline.value = deadline

    def set_lease(self, token: uuid.UUID, deadline: float) -> None:
        """Before a claim: the token the lease will carry (the release is not known yet)."""
        with self.lock:
            self.release.raw = bytes(16)
            self.token.raw = token.bytes
            self.deadline.value = deadline

    def clear(self) -> None:
        with self.lock:
            self.deadline.value = 0.0

    def read(self) -> tuple[Claim, float] | None:
        with self.lock:
            if self.deadline.value == 0.0:
                return None
            claim = Claim(
                release_id=uuid.UUID(bytes=bytes(self.release.raw)),
                token=uuid.UUID(bytes=bytes(self.token.raw)),
                attempts=0,
            )
            return claim, float(self.deadline.value)


# --------------------------------------------------------------------------- worker process


@dataclass
class _Stop:
    requested: bool = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


T = TypeVar("T")


def settle(link: Link, work: Callable[[Connection], T], *, until: float) -> T:
    """Run ``work`` (store a run's outcome, or start a run), retrying while the database is
    unreachable (until ``until``).

    The run is paid and done; abandoning its output would leave the release pending until
    its lease expires (minutes). Storing is idempotent: it is guarded by the lease token and
    the pending state, so a retry after a commit whose outcome was lost changes nothing.
    (Starting a run is guarded the same way; a retry after a lost commit may count one
    attempt twice.)
    """
    while True:
        try:
            return link.run(work)
        except (psycopg.Error, CommitOutcomeUnknown) as exc:
            if time.monotonic() > until:
                raise
            logger.warning("a release's statement failed (%s); retrying", type(exc).__name__)
            link.close()
            time.sleep(0.5)


#: Most releases one worker claims at once (see :func:`process_one`). One: a
#: release claimed with others waits, leased to this worker, for the runs before it — and,
#: with publication times, for their bounds — while another worker may be idle; a 5 ms
#: release co-claimed behind a run that hit the time limit answered after that limit. A
#: claim is one short statement, small beside a run's publication bound.
MAX_BATCH = 1


def batch_size(announced: int, workers: int) -> int:
    """How many releases to claim at once: this worker's share of the ``announced`` ones
    (every worker hears every announcement), between 1 and :data:`MAX_BATCH`."""
    return max(1, min(MAX_BATCH, -(-announced // max(1, workers))))


def process_one(link: Link, settings: Settings, slot: Slot | None = None) -> bool:
    """Claim and run one release; False when there was nothing to run."""
    return process_batch(link, settings, slot, limit=1) > 0


def process_batch(link: Link, settings: Settings, slot: Slot | None = None, *, limit: int) -> int:
    """Claim up to ``limit`` releases and run them one after the other; returns how many
    releases the claim took (0: nothing to run).

    The claim is one autocommit statement on ``link``'s connection, under one lease token.
    Each run after the first starts with its own lease and attempt (:func:`start_run`), and
    each result is stored the moment it exists, by one statement that reaches the disk
    before it returns (the completion sets ``synchronous_commit`` for its own implicit
    transaction), so a finished release never waits for the next run of its batch (a 5 ms
    release co-claimed with a run that hits the time limit would otherwise answer after
    that limit). Before each run the release and its deadline are published to the
    supervisor, which enforces the time limit of each run.

    Each run has a public run-time bound (:mod:`app.releases.schedule`): its release is
    published at its start plus the bound, and the worker holds its slot until then before
    it starts the next run (or claims again), so the queue moves at the pace of the bounds.
    A run that outlives its bound is counted (``dpquant_release_overruns_total``).
    """
    lease_s = settings.run_timeout_s + settings.lease_margin_s

    # The lease's token is published before the claim: a worker killed between the claim's
    # commit and its first word to the supervisor still gets its leases given back.
    token = uuid.uuid4()
    if slot is not None:
        slot.set_lease(token, time.monotonic() + settings.run_timeout_s)
    try:
        claims, taken = link.run(
            lambda conn: claim_batch(
                conn, lease_s=lease_s, max_runs=settings.max_runs, token=token, limit=limit
            )
        )
    except BaseException:
        if slot is not None:
            slot.clear()
        # The claim may have committed before the failure: give its leases back now rather
        # than when they expire (best effort; an unreachable database expires them later).
        unknown = Claim(release_id=uuid.UUID(int=0), token=token, attempts=0)
        with suppress(Exception):
            link.run(lambda conn: expire_lease(conn, claim=unknown))
        raise
    claimed_until = time.monotonic() + lease_s - 1.0
    try:
        for index, claimed in enumerate(claims):
            claim: Claim | None = claimed
            if index > 0:
                start = functools.partial(
                    start_run, claim=claimed, lease_s=lease_s, max_runs=settings.max_runs
                )
                claim = settle(link, start, until=claimed_until)
                if claim is None:  # taken over after its lease expired, or out of runs
                    continue
            assert claim is not None
            run_start = time.monotonic()
            lease_end = run_start + lease_s - 1.0
            bound = _bound(claim, settings)
            if slot is not None:
                slot.set(claim, time.monotonic() + settings.run_timeout_s)
            spans = _Spans(claimed)
            try:
                with spans.run():
                    job = link.run(functools.partial(load_job, claim=claim))
                    if settings.chaos_run_delay_ms:
                        time.sleep(settings.chaos_run_delay_ms / 1000.0)
                    started = time.perf_counter()
                    try:
                        estimates = run_job(job)
                    finally:
                        elapsed = time.perf_counter() - started
                        MECHANISM_SECONDS.labels(job.method).observe(elapsed)
            except RunFailed as exc:
                logger.error("release %s failed: %s (charged)", claim.release_id, exc)
                failed = functools.partial(fail, claim=claim, reason=exc.reason, bound_s=bound)
                with spans.complete(f"failed: {exc.reason}"):
                    settle(link, failed, until=lease_end)
                _hold(claim, run_start, bound)
                continue
            # keys a partition selection kept (only then: the call is otherwise unchanged)
            extra: dict[str, Any] = (
                {} if job.selection is None else {"selected": [list(job.selected)]}
            )
            store = functools.partial(
                complete_batch, done=[(claim, estimates)], bounds=[bound], **extra
            )
            with spans.complete("done"):
                settle(link, store, until=lease_end)
            _hold(claim, run_start, bound, job.method)
        return taken
    except BaseException:
        # The rest of the batch did not start here: give it back now rather than when its
        # lease expires (best effort; an unreachable database expires them later).
        with suppress(Exception):
            link.run(lambda conn: expire_lease(conn, claim=claims[0]))
        raise
    finally:
        if slot is not None:
            slot.clear()


class _Spans:
    """The worker's spans of one release, children of its reservation's span (the row's
    ``trace_parent``): the queue wait (from the reservation to now), the run (load and
    mechanism) and the completion. No-ops while tracing is off. Attributes: the release and
    dataset ids, the method, the number of quantiles and the outcome; nothing from the
    data."""

    def __init__(self, claim: Claim) -> None:
        row = claim.row or {}
        self.parent = tracing.context_of(row.get("trace_parent"))
        self.attributes: dict[str, str | int] = {
            "dpquant.release_id": str(claim.release_id),
            "dpquant.dataset_id": str(row.get("dataset_id", "")),
            "dpquant.method": str(row.get("method", "")),
            "dpquant.quantiles": len(row.get("quantiles") or []),
            "dpquant.attempt": claim.attempts,
        }
        if tracing.enabled():
            created = row.get("created_at")
            queued = tracing.tracer().start_span(
                "release.queue",
                context=self.parent,
                start_time=None if created is None else tracing.ns(created),
                attributes=self.attributes,
            )
            queued.end()

    def run(self) -> AbstractContextManager[object]:
        return tracing.tracer().start_as_current_span(
            "release.run", context=self.parent, attributes=self.attributes
        )

    def complete(self, outcome: str) -> AbstractContextManager[object]:
        return tracing.tracer().start_as_current_span(
            "release.complete",
            context=self.parent,
            attributes={**self.attributes, "dpquant.outcome": outcome},
        )


def _bound(claim: Claim, settings: Settings) -> float:
    """The claim's public run-time bound (0.0: publication times off)."""
    if claim.row is None or settings.publish_scale <= 0.0:
        return 0.0
    return bound_of_claim(
        claim.row,
        scale=settings.publish_scale,
        max_cells=settings.max_cells,
        max_values=settings.max_values,
        cap_s=settings.run_timeout_s,
    )


def _hold(claim: Claim, run_start: float, bound: float, method: str | None = None) -> None:
    """Hold this worker until the run's publication time (``run_start + bound``), so that
    the next run starts at a time the bounds decide, not the data; count an overrun."""
    label = method or (str(claim.row["method"]) if claim.row is not None else "unknown")
    if bound <= 0.0:
        return
    left = run_start + bound - time.monotonic()
    if left > 0.0:
        PUBLICATION_HOLD_SECONDS.labels(label).observe(left)
        time.sleep(left)
    else:
        RELEASE_OVERRUNS.labels(label).inc()


#: Scheduling niceness added to release workers: on a host shared with the API, a run's CPU
#: load slowed the API's answers to other requests (a viewer polling while JointExp ran
#: 0.5 s on 5·10^7 records got ~10 % fewer answers than while it ran 2 ms on 10, in the
#: timing benchmark). At +10 the API's processes get ~10x the CPU share of a busy worker
#: under contention, and the workers lose nothing when the API is idle.
WORKER_NICENESS = 10


def lower_priority() -> None:
    """Run this worker at WORKER_NICENESS below the API (best effort: not on every OS)."""
    with suppress(OSError, AttributeError):
        os.nice(WORKER_NICENESS)


def warm_up() -> None:
    """Compile every mechanism's kernels on public synthetic data before the first claim.

    Numba compiles on first use; without this the first releases a worker runs would take
    seconds longer than later ones (a timing difference that says nothing about the data,
    but wastes run-time budget). The outputs are discarded.
    """
    histogram = GridHistogram(
        cells=np.arange(0, 64, 2, dtype=np.int64),
        counts=np.ones(32, dtype=np.int64),
        grid_points=101,
    )
    for mech in MECHANISMS.values():
        try:
            mech.run_grid(
                histogram,
                [0.25, 0.5, 0.75],
                epsilon=1.0,
                delta=1e-6 if mech.uses_delta else None,
            )
        except Exception as exc:
            logger.warning("warm-up of %s failed (%s)", mech.name, type(exc).__name__)


def _heard(
    listener: psycopg.Connection[Any], *, timeout: float, stop_after: int | None = None
) -> int:
    """How many releases were announced within ``timeout`` (0: only the notifications
    already received). An archived dataset's notification drops its cached arrays here and
    counts as none (it ends the wait, as any notification does)."""
    count = 0
    for note in listener.notifies(timeout=timeout, stop_after=stop_after):
        if note.channel == ARCHIVED_CHANNEL:
            with suppress(ValueError):
                VALUES_CACHE.drop_dataset(uuid.UUID(note.payload))
            _report_cache()
        else:
            count += 1
    return count


def configure_cache(settings: Settings) -> None:
    """This process's values cache as ``DPQUANT_VALUES_CACHE_BYTES`` says, in workers
    as in web processes."""
    VALUES_CACHE.max_bytes = settings.values_cache_bytes
    VALUES_CACHE_CAPACITY.labels("release_worker").set(settings.values_cache_bytes)
    _report_cache()


def _report_cache() -> None:
    VALUES_CACHE_BYTES.labels("release_worker").set(VALUES_CACHE.nbytes)


#: glibc ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Freed memory a worker keeps for its next run instead of giving it back to the OS.
KEEP_FREED_BYTES = 1 << 30
#: Blocks at least this large are mapped on their own (glibc's largest allowed threshold).
MMAP_THRESHOLD_BYTES = 32 << 20


def keep_freed_memory() -> bool:
    """Make glibc keep the memory a run frees, so the next run does not fault it in again.

    glibc adapts its trim and mmap thresholds as blocks are freed; after the warm-up's many
    small runs a worker returned the DP rows' memory to the OS after every release and paid
    ~4,000 page faults on the next one: JointExp m = 99 on 5.6·10^5 cells took 33-40 ms in
    a worker against 26 ms in a fresh process. Fixed thresholds keep the freed heap (the
    worker's RSS stays at the high-water mark of its largest run, which the run's memory
    bound limits) and map only blocks of 32 MiB or more separately. False where ``mallopt``
    is unavailable (not glibc): nothing changes there.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    )


def worker_main(url: str, slot: Slot, log_level: str, workers: int = 1) -> None:
    """Entry point of one of ``workers`` worker processes (spawned by the supervisor)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides
    settings = Settings(database_url=url)
    configure_cache(settings)
    tracing.configure(settings.otel_endpoint, service="dpquant-worker")
    link = Link(url, settings)
    keep_freed_memory()
    lower_priority()
    warm_up()
    # Everything imported and compiled so far lives as long as the process: keep it out of
    # the garbage collector's full passes (each took ~110 ms in a worker, a latency spike
    # for whichever release was running).
    gc.freeze()
    listener: psycopg.Connection[Any] | None = None
    # Claims worth trying: one per notification heard (each announces one runnable release
    # to every worker) and one per poll (expired leases announce nothing). A worker claims
    # its share of the announced releases at once (batch_size) and claims again only while
    # announcements are left, rather than sending an empty claim after every run.
    hints = 1
    try:
        while not stop.requested:
            try:
                if listener is None:
                    listener = psycopg.connect(conninfo(url), autocommit=True)
                    listener.execute(f"LISTEN {PENDING_CHANNEL}")
                    listener.execute(f"LISTEN {ARCHIVED_CHANNEL}")
                    hints = 1  # whatever was announced while not listening
                    VALUES_CACHE.clear()  # and whatever was archived meanwhile
                    _report_cache()
                if hints > 0:
                    limit = batch_size(hints, workers)
                    taken = process_batch(link, settings, slot, limit=limit)
                    _report_cache()
                    if taken:
                        hints = max(0, hints - taken) + _heard(listener, timeout=0.0)
                        continue
                    hints = 0  # the queue is empty (or every runnable release is leased)
                heard = _heard(listener, timeout=settings.worker_poll_s, stop_after=1)
                hints = max(1, heard + _heard(listener, timeout=0.0))
            except (psycopg.Error, OSError, CommitOutcomeUnknown) as exc:
                logger.warning("worker database error (%s); retrying", type(exc).__name__)
                if listener is not None:
                    listener.close()
                    listener = None
                link.close()
                time.sleep(1.0)
            except Exception as exc:
                logger.error("worker error %s; retrying", type(exc).__name__)
                time.sleep(1.0)
    finally:
        if listener is not None:
            listener.close()
        link.close()


# --------------------------------------------------------------------------- supervisor


class Supervisor:
    """Starts ``concurrency`` worker processes and enforces the hard time limit."""

    def __init__(self, url: str, settings: Settings, concurrency: int) -> None:
        self.url = url
        self.settings = settings
        self.ctx = multiprocessing.get_context("spawn")
        self.slots = [Slot(self.ctx) for _ in range(concurrency)]
        self.procs: list[SpawnProcess | None] = [None] * concurrency
        self.link = Link(url, settings, process="release_supervisor")
        self.stop = _Stop()

    def _spawn(self, i: int) -> None:
        proc = self.ctx.Process(
            target=worker_main,
            args=(self.url, self.slots[i], self.settings.log_level, len(self.slots)),
            name=f"dpquant-worker-{i}",
            daemon=False,
        )
        proc.start()
        self.procs[i] = proc
        logger.info("worker %d started (pid %s)", i, proc.pid)

    def _settle(self, claim: Claim, *, timed_out: bool) -> None:
        """Settle the leases of a worker that was killed or died: the release it was running
        past its deadline is failed (charged); every other release still pending under its
        lease token (the rest of its batch) goes back to the queue."""
        try:
            if timed_out and claim.release_id.int:
                self.link.run(lambda conn: fail(conn, claim=claim, reason=FAILURE_TIMEOUT))
            self.link.run(lambda conn: expire_lease(conn, claim=claim))
        except Exception as exc:
            logger.error("could not settle release %s (%s)", claim.release_id, type(exc).__name__)

    def check(self) -> None:
        """One supervision round: enforce deadlines, replace dead workers."""
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            running = self.slots[i].read()
            if running is not None and now > running[1]:
                proc.kill()
                proc.join()
                forget_process(proc.pid)
                self.slots[i].clear()
                logger.warning(
                    "release %s exceeded the %.0f s time limit: failed (charged)",
                    running[0].release_id,
                    self.settings.run_timeout_s,
                )
                self._settle(running[0], timed_out=True)
                self._spawn(i)
            elif not proc.is_alive():
                forget_process(proc.pid)
                self.slots[i].clear()
                logger.warning("worker %d died (exit code %s)", i, proc.exitcode)
                if running is not None:
                    self._settle(running[0], timed_out=False)
                time.sleep(0.5)  # no tight crash loop
                self._spawn(i)

    def run(self) -> int:
        """Supervise until SIGTERM or SIGINT; then stop the workers (they finish their run)."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        for i in range(len(self.procs)):
            self._spawn(i)
        try:
            while not self.stop.requested:
                self.check()
                time.sleep(0.1)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.is_alive():
                proc.terminate()
        grace = time.monotonic() + 10.0
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            proc.join(timeout=max(0.0, grace - time.monotonic()))
            if proc.is_alive():
                running = self.slots[i].read()
                proc.kill()
                proc.join()
                if running is not None:
                    self._settle(running[0], timed_out=False)
        self.link.close()
        logger.info("workers stopped (supervisor pid %s)", os.getpid())
