"""Issue 12 acceptance: ``/metrics`` of a real ``dpquant serve --workers 2`` (two uvicorn web
processes plus release-worker processes) adds up across processes.

After k releases (reserved in either web process, run and stored by the release workers),
every scrape — whichever web process answers it — shows exactly k releases and k mechanism
runs, the exact epsilon charged, and no figure derived from the data.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import signal
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for

from .procs import DpquantServer, migrate

pytestmark = pytest.mark.processes

ADMIN = "dpq_metrics-admin-" + secrets.token_urlsafe(32)
TOKEN = "scrape-" + secrets.token_urlsafe(32)

#: (method, epsilon) of the k releases: 0.1 + 0.2 + 0.3 + 0.05 + 0.15 + 0.1 + 0.1 = 1.0.
QUERIES = [
    ("indexp", "0.1"),
    ("jointexp", "0.2"),
    ("indexp", "0.3"),
    ("jointexp", "0.05"),
    ("indexp", "0.15"),
    ("jointexp", "0.1"),
    ("indexp", "0.1"),
]


@pytest.fixture(scope="module")
def server(new_schema: Callable[[], str]) -> Iterator[DpquantServer]:
    url = new_schema()
    migrate(url)
    srv = DpquantServer(url, ADMIN, workers=2, DPQUANT_METRICS_TOKEN=TOKEN, DPQUANT_WORKERS="2")
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def _post(srv: DpquantServer, path: str, key: str = ADMIN, **kw: Any) -> httpx.Response:
    # A new connection each time, so that both web processes take requests.
    return httpx.post(srv.base_url + path, headers=srv.headers(key), timeout=120, **kw)


def _scrape(srv: DpquantServer) -> tuple[str, int | None]:
    """The metrics text and the pid of the web process that answered (found by the server
    side of our still-open connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.connect()
        assert conn.sock is not None
        local_port = conn.sock.getsockname()[1]
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        text = response.read().decode()
        assert response.status == 200, text
        answered = None
        for pid in srv.worker_pids():
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(pid).net_connections(kind="tcp"):
                    if c.raddr and c.raddr.port == local_port:
                        answered = pid
        return text, answered
    finally:
        conn.close()


def _sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_counters_add_up_across_two_web_processes_and_the_release_workers(
    server: DpquantServer,
) -> None:
    values = [4321.0 + 0.125 * i for i in range(211)]  # n = 211
    ds = _post(
        server,
        "/v1/datasets",
        json={"name": "metrics", "lower": 0, "upper": 10000, "epsilon": "1"},
    ).json()["id"]
    assert _post(server, f"/v1/datasets/{ds}/values", json=values).status_code == 200
    key = _post(server, "/v1/keys", json={"role": "analyst", "dataset_id": ds}).json()["key"]

    answered_by: set[int | None] = set()
    estimates: list[float] = []
    charged = Decimal(0)
    for method, eps in QUERIES:
        r = _post(
            server,
            f"/v1/datasets/{ds}/quantiles",
            key,
            json={"quantiles": [0.25, 0.5, 0.75], "epsilon": eps, "method": method},
        )
        assert r.status_code == 201 and r.json()["status"] == "done", r.text
        estimates += r.json()["estimates"]
        charged += Decimal(eps)
    refused = _post(
        server,
        f"/v1/datasets/{ds}/quantiles",
        key,
        json={"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"},
    )
    assert refused.json()["type"] == "budget_exhausted"
    k = len(QUERIES)
    assert charged == Decimal(1)

    scrapes = []
    for _ in range(12):
        text, pid = _scrape(server)
        answered_by.add(pid)
        scrapes.append(text)
    assert len(answered_by - {None}) == 2, answered_by  # both web processes answered

    for text in scrapes:
        # every process's counters, whichever process answered the scrape
        assert _sum(text, "dpquant_releases_total", outcome="done") == k
        assert _sum(text, "dpquant_releases_total", outcome="failed") == 0
        assert _sum(text, "dpquant_releases_total", outcome="refused") == 1
        assert _sum(text, "dpquant_releases_total", method="jointexp", outcome="done") == 3
        assert _sum(text, "dpquant_release_reservations_total") == k
        # observed in the release-worker processes, not the web processes
        assert _sum(text, "dpquant_mechanism_run_seconds_count") == k
        assert _sum(text, "dpquant_refusals_total", type="budget_exhausted") == 1
        # exactly what was charged (the exact decimal sum, as the nearest double)
        assert _sum(text, "dpquant_epsilon_spent_total", dataset=ds) == float(charged)
        assert _sum(text, "dpquant_delta_spent_total", dataset=ds) == 0.0
        route = "/v1/datasets/{dataset_id}/quantiles"
        assert _sum(text, "dpquant_http_request_duration_seconds_count", route=route) == k + 1
        assert _sum(text, "dpquant_db_pool_capacity", process="api") > 0
        assert _sum(text, "dpquant_db_pool_capacity", process="release_worker") > 0
        # nothing derived from the data: no value, no estimate, no n
        for value in {*values, *estimates}:
            assert repr(value) not in text
        families = {f.name for f in text_string_to_metric_families(text)}
        assert not any(name.endswith(("_n", "_values", "_estimate")) for name in families)
        for family in text_string_to_metric_families(text):
            if family.name.startswith("dpquant_") and "seconds" not in family.name:
                assert all(s.value != 211.0 for s in family.samples), family.name


def test_scrape_auth_on_the_real_server(server: DpquantServer) -> None:
    url = server.base_url + "/metrics"
    assert httpx.get(url, timeout=30).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer x" + TOKEN}).status_code == 401
    assert httpx.get(url, headers=server.headers()).status_code == 200


def _spawned_workers(srv: DpquantServer) -> set[int]:
    """PIDs of the release worker processes (not the supervisor or its resource tracker)."""
    pids = set()
    for pid in srv.release_worker_pids():
        with contextlib.suppress(psutil.Error):
            if "spawn_main" in " ".join(psutil.Process(pid).cmdline()):
                pids.add(pid)
    return pids


def test_a_killed_release_worker_leaves_its_counters_and_drops_its_gauges(
    server: DpquantServer,
) -> None:
    per_worker = 1.0  # one connection per release worker (app.core.pg.Link)

    def both_up() -> str | None:
        text, _ = _scrape(server)
        capacity = _sum(text, "dpquant_db_pool_capacity", process="release_worker")
        return text if capacity == 2 * per_worker else None

    before = wait_for(both_up, timeout=60, interval=0.5)  # workers start after the API
    done = _sum(before, "dpquant_releases_total", outcome="done")
    runs = _sum(before, "dpquant_mechanism_run_seconds_count")
    workers = _spawned_workers(server)
    assert len(workers) == 2, workers
    # `dpquant serve` created the directory; its children inherited it
    directory = Path(psutil.Process(min(workers)).environ()["PROMETHEUS_MULTIPROC_DIR"])
    assert (directory / f"gauge_livesum_{min(workers)}.db").exists()
    victim = sorted(workers)[0]
    os.kill(victim, signal.SIGKILL)

    def settled() -> str | None:
        now = _spawned_workers(server)
        new = now - workers
        # the replacement is up and has written its own gauges
        if not new or not all((directory / f"gauge_livesum_{p}.db").exists() for p in new):
            return None
        text, _ = _scrape(server)
        capacity = _sum(text, "dpquant_db_pool_capacity", process="release_worker")
        return text if capacity == 2 * per_worker else None

    after = wait_for(settled, timeout=60, interval=0.5)
    # the dead worker's gauge is gone (else 3 x 1); its counters still count
    assert _sum(after, "dpquant_releases_total", outcome="done") == done
    assert _sum(after, "dpquant_mechanism_run_seconds_count") == runs
