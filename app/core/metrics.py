"""Prometheus metrics, correct across any number of processes.

Two sources, both exact across processes:

* **Process-local instruments** (counters, histograms, gauges below) use ``prometheus_client``
  in *multiprocess mode* whenever ``PROMETHEUS_MULTIPROC_DIR`` is set: every process (uvicorn
  web workers, the release-worker supervisor and its workers) writes its own memory-mapped
  file in that directory and a scrape sums them, so counters add up whichever process
  answers the scrape and whichever process did the work (a release's ``done`` is counted in
  the worker that stored it). ``dpquant serve`` and ``dpquant worker`` create a fresh
  directory when the variable is unset. Gauges of processes that died are dropped at scrape
  time (``mark_process_dead``); counters of dead processes keep counting, as they should.
  Without the variable (tests, a single in-process app) the default registry is used.
* **Ledger figures** (ε and δ spent and granted per dataset) are read from the
  ``budget_balance`` rows at scrape time: the exact NUMERIC sums PostgreSQL keeps, converted
  once to the nearest double, identical whichever process answers and unaffected by
  restarts. Counting spent ε in each process and summing floats would not be exact.

Nothing here is derived from a dataset's values: no n, no estimate, no data-dependent
failure detail beyond the public outcome. Timing histograms (request latency, mechanism run
time) are operator figures — run time grows with n, which is why ``/metrics`` is for admins
and the scrape token only (docs/security.md).
"""

from __future__ import annotations

import glob
import hashlib
import hmac
import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: Outcomes of ``dpquant_releases_total``: stored ``done`` / ``failed`` (by the process that
#: stored them), or ``refused`` (409 at reservation: budget, key cap, archived, no values).
OUTCOMES = ("done", "failed", "refused")

RELEASES = Counter(
    "dpquant_releases",
    "Releases by method and public outcome (done, failed: stored by a worker; refused: 409 "
    "at reservation, nothing debited).",
    ["method", "outcome"],
)
RESERVATIONS = Counter(
    "dpquant_release_reservations",
    "Releases reserved (paid, queued) by method; reservations - done - failed = in flight.",
    ["method"],
)
REFUSALS = Counter(
    "dpquant_refusals",
    "Error responses by error type (budget_exhausted, key_budget_exhausted, unauthorized, "
    "validation_error, ...).",
    ["type"],
)
REQUEST_SECONDS = Histogram(
    "dpquant_http_request_duration_seconds",
    "HTTP request latency by method, route template and status code.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 150.0),
)
MECHANISM_SECONDS = Histogram(
    "dpquant_mechanism_run_seconds",
    "Wall time of one mechanism run in a release worker, by method.",
    ["method"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0),
)
RELEASE_OVERRUNS = Counter(
    "dpquant_release_overruns",
    "Runs that outlived their public run-time bound (app.releases.schedule) and were "
    "published when they finished: each is a timing residue non-admins can see.",
    ["method"],
)
PUBLICATION_HOLD_SECONDS = Histogram(
    "dpquant_publication_hold_seconds",
    "Time a worker held its slot after a run, until the run's publication time.",
    ["method"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0),
)
POOL_IN_USE = Gauge(
    "dpquant_db_pool_connections_in_use",
    "Database connections checked out of the pools of live processes, by process kind.",
    ["process"],
    multiprocess_mode="livesum",
)
POOL_CAPACITY = Gauge(
    "dpquant_db_pool_capacity",
    "Most connections the pools of live processes may open (pool size + overflow).",
    ["process"],
    multiprocess_mode="livesum",
)


VALUES_CACHE_BYTES = Gauge(
    "dpquant_values_cache_bytes",
    "Bytes of dataset arrays the live release workers hold in their caches.",
    ["process"],
    multiprocess_mode="livesum",
)
VALUES_CACHE_CAPACITY = Gauge(
    "dpquant_values_cache_capacity_bytes",
    "Most bytes the live release workers' caches may hold (DPQUANT_VALUES_CACHE_BYTES each).",
    ["process"],
    multiprocess_mode="livesum",
)


def instrument_pool(engine: Engine, *, process: str, capacity: int) -> None:
    """Track the engine's checked-out connections in :data:`POOL_IN_USE`."""
    gauge = POOL_IN_USE.labels(process)
    POOL_CAPACITY.labels(process).inc(capacity)

    def checkout(*args: Any) -> None:
        gauge.inc()

    def checkin(*args: Any) -> None:
        gauge.dec()

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)


# --------------------------------------------------------------------------- scrape


class LedgerCollector(Collector):
    """ε and δ spent and granted per dataset, read from the balance rows at scrape time."""

    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterable[Metric]:
        families = {
            name: CounterMetricFamily(name, doc, labels=["dataset"])
            for name, doc in (
                ("dpquant_epsilon_spent", "Epsilon debited per dataset (exact sum, as a double)."),
                ("dpquant_delta_spent", "Delta debited per dataset (exact sum, as a double)."),
            )
        }
        granted = {
            name: GaugeMetricFamily(name, doc, labels=["dataset"])
            for name, doc in (
                ("dpquant_epsilon_granted", "Epsilon granted per dataset."),
                ("dpquant_delta_granted", "Delta granted per dataset."),
            )
        }
        up = GaugeMetricFamily("dpquant_ledger_up", "1 when the ledger figures could be read.")
        try:
            with self.factory() as session:
                rows = session.execute(
                    text(
                        "SELECT dataset_id, spent_epsilon, spent_delta, granted_epsilon,"
                        " granted_delta FROM budget_balance ORDER BY dataset_id"
                    )
                ).all()
        except SQLAlchemyError:
            up.add_metric([], 0.0)
            yield up
            return
        for dataset_id, se, sd, ge, gd in rows:
            label = [str(dataset_id)]
            families["dpquant_epsilon_spent"].add_metric(label, float(se))
            families["dpquant_delta_spent"].add_metric(label, float(sd))
            granted["dpquant_epsilon_granted"].add_metric(label, float(ge))
            granted["dpquant_delta_granted"].add_metric(label, float(gd))
        up.add_metric([], 1.0)
        yield from families.values()
        yield from granted.values()
        yield up


class _Default(Collector):
    """The process's default registry (single-process mode)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_dead_processes(path: str) -> list[int]:
    """Drop the live-gauge files of processes that no longer exist; returns their pids."""
    dead: list[int] = []
    for f in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        stem = os.path.basename(f)[: -len(".db")]
        pid_text = stem.rsplit("_", 1)[-1]
        if pid_text.isdigit() and not _alive(int(pid_text)):
            multiprocess.mark_process_dead(int(pid_text), path)  # type: ignore[no-untyped-call]
            dead.append(int(pid_text))
    return dead


def render(factory: sessionmaker[Session]) -> bytes:
    """The exposition text of every process's instruments plus the ledger figures."""
    registry = CollectorRegistry(auto_describe=False)
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        mark_dead_processes(path)
        multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Default())
    registry.register(LedgerCollector(factory))
    return generate_latest(registry)


def token_matches(expected: str, presented: str) -> bool:
    """Constant-time comparison of the scrape token (fixed-length digests are compared)."""
    return hmac.compare_digest(
        hashlib.sha256(expected.encode()).digest(), hashlib.sha256(presented.encode()).digest()
    )


def forget_process(pid: int | None) -> None:
    """Drop a dead process's live gauges now (a scrape would also notice it)."""
    path = os.environ.get(MULTIPROC_ENV)
    if path and pid is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


class RequestMetricsMiddleware:
    """Observes each HTTP request's latency by method, route *template* and status.

    The route template (``/v1/datasets/{dataset_id}``) keeps ids out of the labels; paths
    that match no API route are labelled ``other``.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import time

        started = time.perf_counter()
        status = {"code": 500}

        async def observed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            REQUEST_SECONDS.labels(
                scope.get("method", ""),
                template if isinstance(template, str) and template else "other",
                str(status["code"]),
            ).observe(time.perf_counter() - started)
