"""Grouped releases end to end: a real server, 10^7-row tables, 10^3 and 10^4 groups.

Starts ``dpquant serve --workers 2`` on loopback against PostgreSQL
(``DPQUANT_BENCH_DATABASE_URL`` or an embedded pgserver in a temporary directory), uploads
three tables of ``--rows`` rows (default 10^7) as Parquet (a numeric column and a categorical
one, Zipf-distributed group sizes), and reports, per case, the median of ``--runs`` grouped
releases:

* ``e2e``: an analyst's ``POST /quantiles`` until the answer is readable (the synchronous
  answer, or polling after a 202): what an analyst waits, publication delay included;
* ``run``: the release's reservation to its finish as an admin sees it (the mechanism runs,
  without the publication delay), and the public bound the service published it at;
* peak RSS of the server's process tree.

Cases: ``continuous`` (10^3 groups, m = 9, values on a grid of step 0.1 over [0, 1000]),
``ratings`` (10^3 groups, m = 9, integers 1-5: heavy ties in every group), ``many``
(10^4 groups, m = 3, continuous), and the growth with the number of groups: the ``many``
table queried with its first 10, 100, 1,000 and 10,000 keys.

Usage::

    python -m benchmarks.bench_grouped [--rows 10000000] [--runs 5] [--publish-scale 1]

Targets (issue): 10^3 groups over 10^7 rows, m = 9: <= 3 s end to end, continuous and
ratings; 10^4 groups, m = 3: <= 10 s.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.bench_service import free_port, migrate, start_server
from benchmarks.bench_upload import tree, vm_hwm_mb


def zipf_sizes(groups: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Group sizes summing to ``rows``, Zipf-like (size of rank r proportional to 1/r)."""
    weights = 1.0 / np.arange(1, groups + 1)
    sizes = np.floor(weights / weights.sum() * rows).astype(np.int64)
    sizes[0] += rows - int(sizes.sum())
    rng.shuffle(sizes)
    return sizes


def table(kind: str, groups: int, rows: int, seed: int) -> tuple[bytes, list[str]]:
    rng = np.random.default_rng(seed)
    sizes = zipf_sizes(groups, rows, rng)
    keys = [f"g{i:05d}" for i in range(groups)]
    codes = np.repeat(np.arange(groups, dtype=np.int32), sizes)
    if kind == "ratings":
        bias = rng.uniform(-1.0, 1.0, groups)[codes]
        values = np.clip(np.rint(3.0 + bias + rng.normal(0.0, 1.0, rows)), 1, 5)
    else:
        centre = rng.uniform(200.0, 800.0, groups)[codes]
        values = np.round(rng.lognormal(0.0, 0.25, rows) * centre, 1)
    region = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(keys))
    out = io.BytesIO()
    pq.write_table(pa.table({"value": values, "region": region}), out, compression="zstd")
    return out.getvalue(), keys


def make_table(
    client: httpx.Client, kind: str, groups: int, rows: int, seed: int
) -> tuple[str, list[str], float]:
    body, keys = table(kind, groups, rows, seed)
    ratings = kind == "ratings"
    column = (
        {"name": "value", "type": "integer", "lower": 1, "upper": 5}
        if ratings
        else {"name": "value", "type": "numeric", "lower": 0, "upper": 1000, "granularity": 0.1}
    )
    r = client.post(
        "/v1/datasets",
        json={
            "name": f"grouped-{kind}-{groups}-{secrets.token_hex(4)}",
            "columns": [column, {"name": "region", "type": "categorical", "keys": keys}],
            "epsilon": "1000000",
        },
    )
    r.raise_for_status()
    ds: str = r.json()["id"]
    t0 = time.perf_counter()
    r = client.put(
        f"/v1/datasets/{ds}/values",
        content=body,
        headers={"content-type": "application/vnd.apache.parquet"},
    )
    r.raise_for_status()
    return ds, keys, time.perf_counter() - t0


def release(
    analyst: httpx.Client, admin: httpx.Client, ds: str, m: int, keys: list[str] | None
) -> tuple[float, float]:
    """(end to end as the analyst waits, reservation to finish as an admin sees it)."""
    qs = [round((j + 1) / (m + 1), 6) for j in range(m)]
    body: dict[str, Any] = {"quantiles": qs, "epsilon": "1", "method": "jointexp",
                            "group_by": "region"}  # fmt: skip
    if keys is not None:
        body["keys"] = keys
    t0 = time.perf_counter()
    r = analyst.post(f"/v1/datasets/{ds}/quantiles", json=body)
    r.raise_for_status()
    rel = r.json()
    while rel["status"] == "pending":
        time.sleep(0.05)
        rel = analyst.get(f"/v1/releases/{rel['id']}").json()
    e2e = time.perf_counter() - t0
    if rel["status"] != "done":
        raise RuntimeError(f"release {rel['id']} {rel['status']}")
    seen = admin.get(f"/v1/releases/{rel['id']}").json()
    start = datetime.fromisoformat(seen["created_at"])
    finish = datetime.fromisoformat(seen["finished_at"])
    return e2e, (finish - start).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10**7)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--publish-scale", default="1")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="dpquant-bench-grouped-")
    server = None
    database_url = os.environ.get("DPQUANT_BENCH_DATABASE_URL")
    if database_url is None:
        import pgserver

        from app.core.db import normalize_url

        server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        database_url = normalize_url(server.get_uri())
    migrate(database_url, None)
    admin_key = "dpq_bench-" + secrets.token_urlsafe(32)
    port = free_port()
    os.environ["DPQUANT_MAX_VALUES"] = str(max(10**7, args.rows))
    os.environ["DPQUANT_MAX_UPLOAD_BYTES"] = str(512 * 1024 * 1024)
    os.environ["DPQUANT_PUBLISH_SCALE"] = args.publish_scale
    proc = start_server(database_url, admin_key, port, None)
    base = f"http://127.0.0.1:{port}"
    rows_out: list[tuple[str, ...]] = []
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin_key}"},
                          timeout=900) as admin:  # fmt: skip
            key = admin.post("/v1/keys", json={"role": "analyst"}).json()["key"]
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                              timeout=900) as analyst:  # fmt: skip
                cases = [("continuous", 1000, 9), ("ratings", 1000, 9), ("many", 10_000, 3)]
                made = {}
                for kind, groups, _ in cases:
                    made[kind] = make_table(admin, kind, groups, args.rows, seed=groups)
                    print(f"uploaded {kind}: {args.rows} rows, {groups} groups in "
                          f"{made[kind][2]:.1f} s", flush=True)  # fmt: skip
                for kind, groups, m in cases:
                    ds = made[kind][0]
                    release(analyst, admin, ds, m, None)  # warm: load and JIT on a worker
                    release(analyst, admin, ds, m, None)
                    runs = [release(analyst, admin, ds, m, None) for _ in range(args.runs)]
                    rows_out.append((kind, str(groups), str(m),
                                     f"{statistics.median(r[0] for r in runs):.2f}",
                                     f"{statistics.median(r[1] for r in runs):.2f}"))  # fmt: skip
                    print(rows_out[-1], flush=True)
                ds, keys, _ = made["many"]
                for count in (10, 100, 1000, 10_000):
                    subset = keys[:count]
                    release(analyst, admin, ds, 3, subset)
                    runs = [release(analyst, admin, ds, 3, subset) for _ in range(args.runs)]
                    rows_out.append((f"many[:{count}]", str(count), "3",
                                     f"{statistics.median(r[0] for r in runs):.2f}",
                                     f"{statistics.median(r[1] for r in runs):.2f}"))  # fmt: skip
                    print(rows_out[-1], flush=True)
        peak = sum(vm_hwm_mb(pid) for pid in tree(proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if server is not None:
            server.cleanup()
    print(f"\nGrouped releases, {args.rows} rows per table, median of {args.runs} runs, "
          f"publish scale {args.publish_scale}")  # fmt: skip
    print(f"{'case':<16}{'groups':>8}{'m':>4}{'e2e s':>10}{'run s':>10}")
    for case, groups, m, e2e, run in rows_out:
        print(f"{case:<16}{groups:>8}{m:>4}{e2e:>10}{run:>10}")
    print(f"server peak RSS (sum over its processes): {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
