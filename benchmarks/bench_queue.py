"""Queue fairness (issue 28): how long one key's backlog delays another key's release.

Starts a real server (``dpquant serve``, two web processes and its release workers) on
PostgreSQL (``DPQUANT_BENCH_DATABASE_URL`` or an embedded pgserver). Key A queues
``--backlog`` releases at the service's minimum epsilon (``Prefer: respond-async``) on a
dataset of ``--n`` values (JointExp, m = 99: a run of ~0.1-0.3 s); at once key B asks for one
small release (n = 10^3, m = 9) on another dataset and waits for it. Reported, as medians
over ``--rounds`` rounds (each with a fresh backlog): B's latency, one A run alone, and
their ratio. ``--code DIR`` serves another checkout (before/after tables).

Usage::

    python -m benchmarks.bench_queue [--rounds 3] [--backlog 50] [--n 1000000] [--code DIR]

Target: B waits at most about one A run (ratio <= ~1.5, the run in flight per worker).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.bench_service import free_port, make_dataset, migrate, start_server


def _release(client: httpx.Client, ds: str, key: str, m: int, prefer: str | None) -> str:
    body = {
        "quantiles": [(j + 1) / (m + 1) for j in range(m)],
        "epsilon": "0.001",
        "method": "jointexp",
    }
    headers = {"Authorization": f"Bearer {key}"} | ({"Prefer": prefer} if prefer else {})
    r = client.post(f"/v1/datasets/{ds}/quantiles", json=body, headers=headers)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"release refused: {r.status_code} {r.text}")
    return str(r.json()["id"])


def _wait_done(client: httpx.Client, rid: str, key: str) -> None:
    while True:
        r = client.get(f"/v1/releases/{rid}", headers={"Authorization": f"Bearer {key}"})
        if r.json()["status"] != "pending":
            return
        time.sleep(0.02)


def _key(client: httpx.Client, role: str) -> str:
    r = client.post("/v1/keys", json={"role": role, "name": "bench-queue"})
    r.raise_for_status()
    return str(r.json()["key"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=50)
    parser.add_argument("--n", type=int, default=10**6)
    parser.add_argument("--code", type=Path, default=None, help="serve this checkout instead")
    args = parser.parse_args()
    code = args.code.resolve() if args.code else None
    tmp = tempfile.mkdtemp(prefix="dpquant-bench-queue-")
    pg = None
    url = os.environ.get("DPQUANT_BENCH_DATABASE_URL")
    if url is None:
        import pgserver

        from app.core.db import normalize_url

        pg = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        url = normalize_url(pg.get_uri())
    migrate(url, code)
    admin = "dpq_bench-" + secrets.token_urlsafe(32)
    port = free_port()
    proc = start_server(url, admin, port, code)
    try:
        rng = np.random.default_rng(7)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=600,
        ) as client:
            big = make_dataset(client, f"queue-big-{port}", rng.normal(50, 20, args.n))
            small = make_dataset(client, f"queue-small-{port}", rng.normal(50, 20, 1000))
            key_a, key_b = _key(client, "analyst"), _key(client, "analyst")
            for _ in range(4):  # warm the workers
                _wait_done(client, _release(client, big, key_a, 99, None), key_a)
                _wait_done(client, _release(client, small, key_b, 9, None), key_b)
            alone = []
            for _ in range(5):
                t0 = time.perf_counter()
                _wait_done(client, _release(client, big, key_a, 99, None), key_a)
                alone.append(time.perf_counter() - t0)
            waits = []
            for _ in range(args.rounds):
                backlog = [
                    _release(client, big, key_a, 99, "respond-async") for _ in range(args.backlog)
                ]
                t0 = time.perf_counter()
                victim = _release(client, small, key_b, 9, None)
                _wait_done(client, victim, key_b)
                waits.append(time.perf_counter() - t0)
                for rid in backlog:
                    _wait_done(client, rid, key_a)
        one = statistics.median(alone)
        wait = statistics.median(waits)
        print("| backlog of key A | one A run alone (s) | B's release behind it (s) | ratio |")
        print("|---:|---:|---:|---:|")
        print(f"| {args.backlog} | {one:.3f} | {wait:.3f} | {wait / one:.2f} |")
        print(f"B's waits per round (s): {', '.join(f'{w:.3f}' for w in waits)}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if pg is not None:
            pg.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
