"""Issue 5, points 1-3: real server processes over a throwaway PostgreSQL cluster.

* ``test_many_processes_one_budget`` — ``dpquant serve --workers 2`` on loopback, 200
  concurrent clients at epsilon 0.01 against a budget of 1.0, an admin grant of 0.5 midway:
  exactly 150 successes, 50 x 409, spent == granted, one debit and one release per success,
  no 5xx.
* ``test_sigkill_of_every_release_worker_mid_run_then_restart`` — SIGKILL the release
  workers (supervisor included) while one runs a paid JointExp release, restart the server:
  the release stays paid and pending, its lease expires, it is run again and the client's
  retry with the same Idempotency-Key returns it; one debit, two runs started.
* ``test_database_outage_gives_503_and_recovers`` — stop the cluster under traffic: 503
  ``database_unavailable`` within the configured timeouts, /readyz 503, automatic recovery
  after the restart, every Idempotency-Key debited exactly once after retries.

Each test prints its measured figures (visible with ``-s`` and in CI output).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from sqlalchemy import Engine, create_engine, text

from .conftest import report
from .procs import DpquantServer, ThrowawayPostgres, migrate

pytestmark = [pytest.mark.processes, pytest.mark.own_cluster]

ADMIN_KEY = "dpq_proc-admin-" + secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres()
    try:
        migrate(pg.url)
        yield pg
    finally:
        pg.destroy()


@pytest.fixture(scope="module")
def cluster_engine(cluster: ThrowawayPostgres) -> Iterator[Engine]:
    engine = create_engine(cluster.url, pool_pre_ping=True)
    yield engine
    engine.dispose()


def _setup_dataset(
    base: str, *, epsilon: str, values: np.ndarray, octet: bool = False
) -> tuple[str, dict[str, str]]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=base, timeout=120.0) as c:
        r = c.post(
            "/v1/datasets",
            json={
                "name": "proc-" + uuid.uuid4().hex[:8],
                "lower": 0.0,
                "upper": 100.0,
                "epsilon": epsilon,
            },
            headers=admin,
        )
        assert r.status_code == 201, r.text
        ds = r.json()["id"]
        if octet:
            r = c.put(
                f"/v1/datasets/{ds}/values",
                content=values.astype("<f8").tobytes(),
                headers=admin | {"content-type": "application/octet-stream"},
            )
        else:
            r = c.put(f"/v1/datasets/{ds}/values", json=values.tolist(), headers=admin)
        assert r.status_code == 200, r.text
        r = c.post("/v1/keys", json={"role": "analyst", "dataset_id": ds}, headers=admin)
        assert r.status_code == 201, r.text
        return ds, {"Authorization": f"Bearer {r.json()['key']}"}


def _db_figures(engine: Engine, dataset_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT "
                " coalesce(sum(epsilon) FILTER (WHERE kind = 'grant'), 0),"
                " coalesce(sum(epsilon) FILTER (WHERE kind = 'debit'), 0),"
                " count(*) FILTER (WHERE kind = 'debit'),"
                " count(*) FILTER (WHERE kind = 'grant')"
                " FROM ledger_entry WHERE dataset_id = :d"
            ),
            {"d": dataset_id},
        ).one()
        releases = conn.execute(
            text("SELECT count(*) FROM release WHERE dataset_id = :d"), {"d": dataset_id}
        ).scalar_one()
        orphans = conn.execute(
            text(
                "SELECT count(*) FROM release r WHERE r.dataset_id = :d AND "
                "(SELECT count(*) FROM ledger_entry l WHERE l.release_id = r.id) <> 1"
            ),
            {"d": dataset_id},
        ).scalar_one()
        bad_debits = conn.execute(
            text(
                "SELECT count(*) FROM ledger_entry l WHERE l.dataset_id = :d AND l.kind = 'debit'"
                " AND NOT EXISTS (SELECT 1 FROM release r WHERE r.id = l.release_id"
                "                 AND r.cost_epsilon = l.epsilon)"
            ),
            {"d": dataset_id},
        ).scalar_one()
    return {
        "granted": Decimal(row[0]),
        "spent": Decimal(row[1]),
        "debits": int(row[2]),
        "grants": int(row[3]),
        "releases": int(releases),
        "releases_without_one_debit": int(orphans),
        "debits_without_release": int(bad_debits),
    }


# --------------------------------------------------------------------------- 1. one budget


def test_many_processes_one_budget(cluster: ThrowawayPostgres, cluster_engine: Engine) -> None:
    # one key, 200 requests at once: this test is about the budget, not the queue cap
    server = DpquantServer(cluster.url, ADMIN_KEY, workers=2, DPQUANT_MAX_PENDING_PER_KEY="0")
    server.start()
    try:
        rng = np.random.default_rng(1)
        ds, analyst = _setup_dataset(
            server.base_url, epsilon="1.0", values=rng.uniform(0, 100, 1000)
        )
        clients = 200
        # "Midway": the first 100 clients fire at once; the admin's grant is sent while they
        # are in flight; the other 100 clients fire as soon as the grant is acknowledged
        # (while the first wave may still be running). Whatever the scheduling, at most 100
        # budget checks precede the grant's commit, so exactly 150 must succeed.
        wave = clients // 2

        async def run() -> tuple[list[tuple[int, dict[str, Any], float]], int, float, int]:
            limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=0)
            granted = asyncio.Event()
            finished: list[float] = []
            grant_done: list[float] = []
            async with httpx.AsyncClient(
                base_url=server.base_url, timeout=120.0, limits=limits
            ) as c:

                async def one(i: int) -> tuple[int, dict[str, Any], float]:
                    if i >= wave:
                        await granted.wait()
                    t0 = time.perf_counter()
                    r = await c.post(
                        f"/v1/datasets/{ds}/quantiles",
                        json={"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"},
                        headers=analyst,
                    )
                    if i < wave:
                        finished.append(time.perf_counter())
                    return r.status_code, r.json(), time.perf_counter() - t0

                async def grant() -> int:
                    await asyncio.sleep(0.05)  # the first wave is on the wire
                    try:
                        r = await c.post(
                            f"/v1/datasets/{ds}/grants",
                            json={"epsilon": "0.5", "reason": "midway grant under load"},
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        )
                    finally:
                        grant_done.append(time.perf_counter())
                        granted.set()
                    return r.status_code

                t0 = time.perf_counter()
                results = await asyncio.gather(grant(), *(one(i) for i in range(clients)))
                elapsed = time.perf_counter() - t0
            grant_status = results[0]
            assert isinstance(grant_status, int)
            overlapping = sum(t > grant_done[0] for t in finished)
            return list(results[1:]), grant_status, elapsed, overlapping  # type: ignore[arg-type]

        results, grant_status, elapsed, overlapping = asyncio.run(run())
        statuses = Counter(status for status, _, _ in results)
        fivexx = sum(n for s, n in statuses.items() if s >= 500)
        latencies = sorted(lat for _, _, lat in results)
        with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
            budget = c.get(f"/v1/datasets/{ds}/budget", headers=server.headers()).json()
        figures = _db_figures(cluster_engine, ds)
        report(
            "1 many processes one budget",
            workers=2,
            requests=len(results),
            successes=statuses[201],
            conflicts_409=statuses[409],
            fivexx=fivexx,
            other=sum(n for s, n in statuses.items() if s not in (201, 409)),
            grant_status=grant_status,
            first_wave_still_running_at_grant=overlapping,
            granted=budget["granted"]["epsilon"],
            spent=budget["spent"]["epsilon"],
            db_releases=figures["releases"],
            db_debits=figures["debits"],
            wall_s=f"{elapsed:.2f}",
            p50_ms=f"{1000 * latencies[len(latencies) // 2]:.0f}",
            max_ms=f"{1000 * latencies[-1]:.0f}",
        )
        assert fivexx == 0, statuses
        assert grant_status == 201
        assert statuses[201] == 150 and statuses[409] == 50, statuses
        for status, body, _ in results:
            if status == 409:
                assert body["type"] == "budget_exhausted"
        assert Decimal(budget["spent"]["epsilon"]) == Decimal(budget["granted"]["epsilon"])
        assert Decimal(budget["granted"]["epsilon"]) == Decimal("1.5")
        assert figures["spent"] == figures["granted"] == Decimal("1.5")
        assert figures["releases"] == figures["debits"] == 150
        assert figures["releases_without_one_debit"] == 0
        assert figures["debits_without_release"] == 0
        released_ids = {body["id"] for status, body, _ in results if status == 201}
        with cluster_engine.connect() as conn:
            stored = {
                str(r[0])
                for r in conn.execute(
                    text("SELECT id FROM release WHERE dataset_id = :d"), {"d": ds}
                )
            }
        assert released_ids == stored
    finally:
        server.close()


# --------------------------------------------------------------------------- 2. crash


def test_sigkill_of_every_release_worker_mid_run_then_restart(
    cluster: ThrowawayPostgres, cluster_engine: Engine
) -> None:
    """Issue 8: the worker dies between reservation and completion, with no chance to clean
    up (its supervisor is killed too): the release stays paid and pending, its lease expires,
    a restarted worker runs it, and a retry with the same key returns it — one debit."""
    server = DpquantServer(
        cluster.url,
        ADMIN_KEY,
        workers=2,
        DPQUANT_RUN_TIMEOUT_S="6",
        DPQUANT_LEASE_MARGIN_S="1",
        DPQUANT_CHAOS_RUN_DELAY_MS="2000",
    )
    server.start()
    body = {
        "quantiles": [float(q) for q in np.linspace(0, 1, 101)[1:-1]],
        "epsilon": "1",
        "method": "jointexp",
    }
    idem = {"Idempotency-Key": "crash-" + uuid.uuid4().hex}
    try:
        rng = np.random.default_rng(2)
        ds, analyst = _setup_dataset(
            server.base_url, epsilon="10", values=rng.uniform(0, 100, 100_000), octet=True
        )
        t0 = time.perf_counter()
        accepted = httpx.post(
            f"{server.base_url}/v1/datasets/{ds}/quantiles",
            json=body,
            headers=analyst | idem | {"Prefer": "respond-async"},
            timeout=60.0,
        )
        assert accepted.status_code == 202, accepted.text
        rid = accepted.json()["id"]

        def attempts() -> int:
            with cluster_engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT attempts FROM release WHERE id = :i"), {"i": rid}
                    ).scalar_one()
                )

        deadline = time.monotonic() + 30
        while attempts() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert attempts() == 1, "no worker claimed the release"
        victims = server.release_worker_pids()
        assert len(victims) >= 2  # the supervisor and at least one worker
        for pid in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()  # SIGKILL: nobody can give the lease back
        killed_at = time.perf_counter() - t0
        after_kill = _db_figures(cluster_engine, ds)
        with cluster_engine.connect() as conn:
            state = conn.execute(
                text("SELECT status FROM release WHERE id = :i"), {"i": rid}
            ).scalar_one()
        assert state == "pending"

        server.kill()  # then the rest of the server, and start it again
        t1 = time.perf_counter()
        server.start()
        restart_s = time.perf_counter() - t1
        with httpx.Client(base_url=server.base_url, timeout=120.0) as c:
            retry = c.post(f"/v1/datasets/{ds}/quantiles", json=body, headers=analyst | idem)
            replay = c.post(f"/v1/datasets/{ds}/quantiles", json=body, headers=analyst | idem)
            budget_end = c.get(f"/v1/datasets/{ds}/budget", headers=server.headers()).json()
        resumed_after = time.perf_counter() - t0
        final = _db_figures(cluster_engine, ds)
        report(
            "2 sigkill of the release workers mid-run",
            killed_after_s=f"{killed_at:.2f}",
            releases_after_kill=after_kill["releases"],
            debits_after_kill=after_kill["debits"],
            restart_s=f"{restart_s:.1f}",
            retry_status=retry.status_code,
            answered_after_s=f"{resumed_after:.1f}",
            runs_started=attempts(),
            final_releases=final["releases"],
            final_debits=final["debits"],
            final_spent=budget_end["spent"]["epsilon"],
        )
        assert after_kill["releases"] == after_kill["debits"] == 1  # paid before the run
        assert after_kill["spent"] == Decimal(1)
        assert retry.status_code == 201, retry.text
        assert retry.json()["id"] == rid and retry.json()["status"] == "done"
        assert retry.headers.get("Idempotent-Replayed") == "true"
        assert replay.content == retry.content
        assert attempts() == 2  # the killed run, then the resumed one
        assert final["releases"] == final["debits"] == 1
        assert final["releases_without_one_debit"] == final["debits_without_release"] == 0
        assert final["spent"] == Decimal(budget_end["spent"]["epsilon"]) == Decimal(1)
    finally:
        server.close()


# --------------------------------------------------------------------------- 3. outage


def test_database_outage_gives_503_and_recovers() -> None:
    pg = ThrowawayPostgres()
    connect_timeout, pool_timeout = 2, 3
    server = DpquantServer(
        pg.url,
        ADMIN_KEY,
        workers=2,
        DPQUANT_CONNECT_TIMEOUT_S=str(connect_timeout),
        DPQUANT_POOL_TIMEOUT_S=str(pool_timeout),
    )
    bound = connect_timeout + pool_timeout + 2.0  # no request may take longer than this
    try:
        migrate(pg.url)
        server.start()
        rng = np.random.default_rng(3)
        ds, analyst = _setup_dataset(
            server.base_url, epsilon="100", values=rng.uniform(0, 100, 1000)
        )
        phase = {"name": "before"}
        log: list[dict[str, Any]] = []
        lock = threading.Lock()
        stop = threading.Event()
        body = {"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"}

        def traffic(worker: int) -> None:
            with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    key = f"outage-{worker}-{i}"
                    for kind, call in (
                        (
                            "query",
                            lambda key=key: c.post(
                                f"/v1/datasets/{ds}/quantiles",
                                json=body,
                                headers=analyst | {"Idempotency-Key": key},
                            ),
                        ),
                        ("budget", lambda: c.get(f"/v1/datasets/{ds}/budget", headers=analyst)),
                        ("readyz", lambda: c.get("/readyz")),
                    ):
                        started_phase = phase["name"]
                        t0 = time.perf_counter()
                        try:
                            r = call()
                            status, payload = r.status_code, r.json()
                        except httpx.HTTPError as exc:
                            status, payload = -1, {"error": type(exc).__name__}
                        entry = {
                            "kind": kind,
                            "key": key,
                            "status": status,
                            "body": payload,
                            "latency": time.perf_counter() - t0,
                            "phase": started_phase,
                            "end_phase": phase["name"],
                        }
                        with lock:
                            log.append(entry)
                    time.sleep(0.02)

        threads = [threading.Thread(target=traffic, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        phase["name"] = "stopping"
        t_stop = time.perf_counter()
        pg.stop("fast")
        phase["name"] = "down"
        time.sleep(4.0)
        phase["name"] = "starting"
        pg.start()
        t_up = time.perf_counter()
        phase["name"] = "up"
        # Recovery: the first success of each kind after the restart.
        deadline = time.monotonic() + 30
        recovered_after = None
        while time.monotonic() < deadline:
            with lock:
                ok = [
                    e
                    for e in log
                    if e["phase"] == "up" and e["kind"] == "query" and e["status"] == 201
                ]
            if ok:
                recovered_after = time.perf_counter() - t_up
                break
            time.sleep(0.05)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)

        down = [e for e in log if e["phase"] == "down" and e["end_phase"] == "down"]
        statuses = Counter((e["kind"], e["status"]) for e in log)
        fivehundreds = [e for e in log if e["status"] == 500 or e["status"] == -1]
        max_latency = max(e["latency"] for e in log)
        down_api = [e for e in down if e["kind"] != "readyz"]
        down_ready = [e for e in down if e["kind"] == "readyz"]

        # Retry every query that did not get a 201 with the same key and body (a 202 means
        # reserved and paid while the database went away during the wait for the worker).
        unanswered = {e["key"] for e in log if e["kind"] == "query" and e["status"] != 201}
        answered = {
            e["key"]: e["body"]["id"] for e in log if e["kind"] == "query" and e["status"] == 201
        }
        replays = 0
        with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
            for key in sorted(unanswered):
                r = c.post(
                    f"/v1/datasets/{ds}/quantiles",
                    json=body,
                    headers=analyst | {"Idempotency-Key": key},
                )
                assert r.status_code == 201, r.text
                replays += r.headers.get("Idempotent-Replayed") == "true"
                answered[key] = r.json()["id"]
            for key, rid in answered.items():  # every key maps to one release, for good
                r = c.post(
                    f"/v1/datasets/{ds}/quantiles",
                    json=body,
                    headers=analyst | {"Idempotency-Key": key},
                )
                assert r.status_code == 201 and r.json()["id"] == rid
            budget = c.get(f"/v1/datasets/{ds}/budget", headers=analyst).json()
            ready = c.get("/readyz")
        engine = create_engine(pg.url)
        try:
            figures = _db_figures(engine, ds)
        finally:
            engine.dispose()
        report(
            "3 database outage",
            requests=len(log),
            during_outage=len(down),
            outage_503=sum(e["status"] == 503 for e in down),
            status_counts=dict(sorted((f"{k}:{s}", n) for (k, s), n in statuses.items())),
            fivexx_500_or_dropped=len(fivehundreds),
            max_latency_s=f"{max_latency:.2f}",
            latency_bound_s=bound,
            stop_s=f"{t_up - t_stop:.1f}",
            recovered_after_s=None if recovered_after is None else f"{recovered_after:.2f}",
            retried=len(unanswered),
            retries_replayed=replays,
            keys=len(answered),
            db_releases=figures["releases"],
            db_debits=figures["debits"],
            spent=budget["spent"]["epsilon"],
        )
        assert not fivehundreds, fivehundreds[:3]
        assert set(s for _, s in statuses) <= {200, 201, 202, 503}, statuses
        assert len(down_api) >= 4 and len(down_ready) >= 2
        for e in down_api:
            assert e["status"] == 503, e
            assert e["body"] == {
                "type": "database_unavailable",
                "detail": "the database is unavailable; nothing was charged",
            }
        for e in down_ready:
            assert e["status"] == 503 and e["body"]["type"] == "not_ready", e
        for e in log:
            if e["status"] == 503:
                assert set(e["body"]) == {"type", "detail"}
        assert max_latency <= bound
        assert recovered_after is not None and recovered_after < 10
        assert ready.status_code == 200
        # No lost and no double debit: one release and one debit per key, spent = their sum.
        assert figures["releases"] == figures["debits"] == len(answered)
        assert len(set(answered.values())) == len(answered)
        assert figures["releases_without_one_debit"] == figures["debits_without_release"] == 0
        assert figures["spent"] == Decimal("0.01") * len(answered)
        assert Decimal(budget["spent"]["epsilon"]) == figures["spent"]
    finally:
        server.close()
        pg.destroy()
