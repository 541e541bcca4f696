"""Upload and ingest benchmark against a real ``dpquant serve`` process (issue 9).

1. Streams N float64 values (default 3·10^7 = 240 MB) in ONE octet-stream request to a fresh
   server; reports the time (median of ``--repeat`` uploads), the peak RSS (VmHWM) of every
   server process, and the stored size in PostgreSQL.
2. With ``--ingest-rows R`` (e.g. 5·10^6): writes a Parquet file of R rows, runs
   ``dpquant ingest`` with ``--engine local`` and ``--engine spark``, and checks that both
   stored histograms are identical.
3. With ``--storage``: compares the compressed-bytea codec with a (cell, count) table at
   d = 10^3 and 10^6 distinct cells (size, load time).
4. With ``--bombs`` (and nothing else): hostile and large Parquet bodies (issue 28), each
   to a fresh server: a page bomb (one 512 MiB page of zeros, zstd: 17 kB), a null bomb
   (10^8 nulls and 3 values with ``?missing=skip``, to a server with
   ``DPQUANT_MAX_VALUES=10^7``) and an ordinary file of 5·10^7 float64 in ONE row group
   (400 MB); reports the answer and the server's peak RSS before and after. To measure
   another checkout's code, put it first on ``PYTHONPATH`` and run this file as a script
   (the server inherits the path; the table names the code it ran).

Usage (PostgreSQL from ``DPQUANT_DATABASE_URL``; a fresh schema is created and dropped)::

    DPQUANT_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python -m benchmarks.bench_upload [--values 30000000] [--repeat 3] \\
        [--ingest-rows 5000000] [--storage]
    DPQUANT_DATABASE_URL=... [PYTHONPATH=/other/checkout] \\
        .venv/bin/python benchmarks/bench_upload.py --bombs
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text

from app.codec.histogram import decode_histogram, encode_histogram
from app.core.db import normalize_url, upgrade_database
from tests.conftest import with_schema

CHUNK_VALUES = 1 << 17


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        children = (task / "children").read_text().split()
        for child in children:
            out.extend(tree(int(child)))
    return out


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def values_stream(n: int, seed: int) -> Iterator[bytes]:
    rng = np.random.default_rng(seed)
    left = n
    while left:
        k = min(CHUNK_VALUES, left)
        yield rng.normal(50.0, 15.0, k).astype("<f8").tobytes()
        left -= k


def start_server(
    url: str, key: str, port: int, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        DPQUANT_DATABASE_URL=url,
        DPQUANT_BOOTSTRAP_ADMIN_KEY=key,
        DPQUANT_LOG_LEVEL="WARNING",
        **(extra_env or {}),
    )
    exe = Path(sys.executable).with_name("dpquant")
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not become ready")


def storage_comparison(url: str) -> None:
    import psycopg

    conninfo = normalize_url(url).replace("postgresql+psycopg://", "postgresql://")
    rng = np.random.default_rng(0)
    print("\n| d | form | bytes in PostgreSQL | load (median of 5) |")
    print("|---|---|---|---|")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE blob (id int PRIMARY KEY, data bytea)")
        conn.execute("ALTER TABLE blob ALTER COLUMN data SET STORAGE EXTERNAL")
        conn.execute(
            "CREATE TEMP TABLE pairs (id int, cell bigint, count bigint, PRIMARY KEY (id, cell))"
        )
        for d, k in ((10**3, 10**6), (10**6, 10**7)):
            cells = np.sort(rng.choice(k + 1, d, replace=False)).astype(np.int64)
            counts = rng.poisson(30, d).astype(np.int64) + 1
            blob = encode_histogram(cells, counts, level=1).blob
            conn.execute("TRUNCATE blob")
            conn.execute("INSERT INTO blob VALUES (1, %s)", (blob,))
            size = conn.execute("SELECT pg_column_size(data) FROM blob WHERE id = 1").fetchone()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                with conn.cursor(binary=True) as cur:
                    cur.execute("SELECT data FROM blob WHERE id = 1")
                    row = cur.fetchone()
                    assert row is not None
                    decode_histogram(bytes(row[0]))
                times.append(time.perf_counter() - t)
            assert size is not None
            print(f"| {d} | zlib bytea | {size[0]} | {statistics.median(times) * 1e3:.1f} ms |")
            conn.execute("TRUNCATE pairs")
            with conn.cursor() as cur, cur.copy("COPY pairs FROM STDIN") as cp:
                for c, w in zip(cells.tolist(), counts.tolist(), strict=True):
                    cp.write_row((1, c, w))
            conn.execute("VACUUM ANALYZE pairs")
            tsize = conn.execute("SELECT pg_total_relation_size('pairs')").fetchone()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                with conn.cursor(binary=True) as cur:
                    cur.execute("SELECT cell, count FROM pairs WHERE id = 1 ORDER BY cell")
                    np.array(cur.fetchall(), dtype=np.int64)
                times.append(time.perf_counter() - t)
            assert tsize is not None
            print(f"| {d} | table rows | {tsize[0]} | {statistics.median(times) * 1e3:.1f} ms |")


def stored_histogram(engine: object, dataset_id: str) -> tuple[np.ndarray, np.ndarray, int]:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        blob, size = conn.execute(
            text("SELECT data, pg_column_size(data) FROM dataset_data WHERE dataset_id = :d"),
            {"d": dataset_id},
        ).one()
    cells, counts = decode_histogram(bytes(blob))
    return cells, counts, int(size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=30_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--ingest-rows", type=int, default=0)
    parser.add_argument("--storage", action="store_true")
    parser.add_argument(
        "--releases", type=int, default=5, help="JointExp m=99 releases timed on the upload"
    )
    parser.add_argument(
        "--format-values", type=int, default=0, help="also time JSON, CSV, Parquet uploads"
    )
    parser.add_argument(
        "--bombs", action="store_true", help="only the hostile Parquet bodies (issue 28)"
    )
    parser.add_argument(
        "--table-rows",
        type=int,
        default=0,
        help="only a privacy-unit table upload: a CSV of this many rows (person, age, income)",
    )
    parser.add_argument("--units", type=int, default=1_000_000, help="units in --table-rows")
    parser.add_argument("--k", type=int, default=5, help="max_rows_per_unit of the table")
    args = parser.parse_args()
    base_url = os.environ.get("DPQUANT_DATABASE_URL")
    if not base_url:
        sys.stderr.write("set DPQUANT_DATABASE_URL to a PostgreSQL server\n")
        return 2
    if args.bombs:
        bomb_bench(base_url)
        return 0
    if args.table_rows:
        table_bench(base_url, args.table_rows, args.units, args.k)
        return 0
    admin = create_engine(normalize_url(base_url), isolation_level="AUTOCOMMIT")
    schema = "dpq_bench_" + uuid.uuid4().hex[:10]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = with_schema(base_url, schema)
    upgrade_database(url)
    engine = create_engine(url)
    key = "dpq_bench-" + secrets.token_urlsafe(32)
    port = free_port()
    proc = start_server(url, key, port)
    rows: list[tuple[str, str]] = []
    try:
        base = f"http://127.0.0.1:{port}"
        h = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=h, timeout=600) as client:
            ds = client.post(
                "/v1/datasets", json={"name": schema, "lower": 0, "upper": 100, "epsilon": 100}
            ).json()
            idle = max(vm_hwm_mb(p) for p in tree(proc.pid))
            times = []
            table_bytes = 0
            for i in range(args.repeat):
                t = time.perf_counter()
                r = client.put(
                    f"/v1/datasets/{ds['id']}/values",
                    content=values_stream(args.values, seed=i),
                    headers={"content-type": "application/octet-stream"},
                )
                times.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
                if i == 0:  # one dataset, one stored version
                    with engine.connect() as conn:
                        table_bytes = conn.execute(
                            text("SELECT pg_total_relation_size('dataset_data')")
                        ).scalar_one()
            peak = {p: vm_hwm_mb(p) for p in tree(proc.pid)}
            view = r.json()
            _, _, blob_bytes = stored_histogram(engine, ds["id"])
            rows += [
                ("values in one streamed octet-stream request", f"{args.values:,}"),
                ("body size", f"{8 * args.values / 1e6:.0f} MB"),
                (
                    f"upload time (median of {args.repeat})",
                    f"{statistics.median(times):.1f} s ({', '.join(f'{t:.1f}' for t in times)})",
                ),
                ("server processes", str(len(peak))),
                ("server VmHWM before upload", f"{idle:.0f} MB"),
                ("server peak RSS (VmHWM, max over processes)", f"{max(peak.values()):.0f} MB"),
                ("n / n_cells stored", f"{view['n']:,} / {view['n_cells']:,}"),
                ("stored histogram (pg_column_size)", f"{blob_bytes / 1e6:.2f} MB"),
                (
                    "pg_total_relation_size('dataset_data') after the first upload",
                    f"{table_bytes / 1e6:.2f} MB",
                ),
            ]
            if args.releases:
                rows += release_bench(client, ds["id"], args.releases)
            if args.format_values:
                rows += format_bench(client, proc.pid, args.format_values, schema)
            if args.ingest_rows:
                rows += ingest_bench(client, base, key, engine, args.ingest_rows, schema)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    if args.storage:
        storage_comparison(base_url)
    admin.dispose()
    return 0


def release_bench(client: httpx.Client, dataset_id: str, runs: int) -> list[tuple[str, str]]:
    """End-to-end latency of synchronous JointExp m=99 releases on the uploaded dataset (the
    first also loads the histogram into a worker's cache; later ones may hit the other
    worker's cold cache once)."""
    body = {"quantiles": [k / 100 for k in range(1, 100)], "epsilon": "0.5", "method": "jointexp"}
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        r = client.post(f"/v1/datasets/{dataset_id}/quantiles", json=body)
        times.append(time.perf_counter() - t)
        assert r.status_code == 201 and r.json()["status"] == "done", r.text
    return [
        (
            f"JointExp m=99 release, end to end (first; median of all {runs})",
            f"{times[0]:.2f} s; {statistics.median(times):.2f} s (max {max(times):.2f} s)",
        )
    ]


def format_bench(client: httpx.Client, pid: int, n: int, schema: str) -> list[tuple[str, str]]:
    """Upload the same n values as JSON, CSV and Parquet (each body built in memory here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.random.default_rng(4).normal(50.0, 15.0, n).round(6)
    text_values = [repr(v) for v in values.tolist()]
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": values}), buf)
    bodies = {
        "application/json": ("", ("[" + ", ".join(text_values) + "]").encode()),
        "text/csv": (
            "?column=x",
            ("id,x\n" + "".join(f"{i},{v}\n" for i, v in enumerate(text_values))).encode(),
        ),
        "application/vnd.apache.parquet": ("?column=x", buf.getvalue()),
    }
    out = []
    for ctype, (query, body) in bodies.items():
        ds = client.post(
            "/v1/datasets", json={"name": f"{schema}-{ctype[-7:]}", "lower": 0, "upper": 100}
        ).json()
        t = time.perf_counter()
        r = client.put(
            f"/v1/datasets/{ds['id']}/values{query}",
            content=(body[i : i + (1 << 16)] for i in range(0, len(body), 1 << 16)),
            headers={"content-type": ctype},
        )
        wall = time.perf_counter() - t
        assert r.status_code == 200 and r.json()["n"] == n, r.text
        hwm = max(vm_hwm_mb(p) for p in tree(pid))
        out.append(
            (
                f"{ctype}: {n:,} values, {len(body) / 1e6:.0f} MB body",
                f"{wall:.1f} s; server VmHWM so far {hwm:.0f} MB",
            )
        )
    return out


def ingest_bench(
    client: httpx.Client, base: str, key: str, engine: object, n: int, schema: str
) -> list[tuple[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="dpquant-ingest-") as tmp:
        path = Path(tmp) / "data.parquet"
        rng = np.random.default_rng(9)
        with pq.ParquetWriter(path, pa.schema([("x", pa.float64())])) as writer:
            for start in range(0, n, 1 << 20):
                k = min(1 << 20, n - start)
                writer.write_table(pa.table({"x": rng.lognormal(3.0, 1.0, k)}))
        out.append(
            ("ingest: Parquet rows / file size", f"{n:,} / {path.stat().st_size / 1e6:.0f} MB")
        )
        results = {}
        for eng in ("local", "spark"):
            ds = client.post(
                "/v1/datasets",
                json={"name": f"{schema}-{eng}", "lower": 0, "upper": 200, "epsilon": 1},
            ).json()
            exe = Path(sys.executable).with_name("dpquant")
            t = time.perf_counter()
            done = subprocess.run(
                [
                    str(exe),
                    "ingest",
                    "--server",
                    base,
                    "--dataset",
                    ds["id"],
                    "--column",
                    "x",
                    "--engine",
                    eng,
                    str(path),
                ],
                env=dict(os.environ, DPQUANT_API_KEY=key),
                capture_output=True,
                text=True,
                check=True,
            )
            wall = time.perf_counter() - t
            cells, counts, _ = stored_histogram(engine, ds["id"])
            view = client.get(f"/v1/datasets/{ds['id']}").json()
            results[eng] = (cells, counts)
            out.append(
                (
                    f"ingest --engine {eng}: wall time (JVM start included for spark)",
                    f"{wall:.1f} s; n = {view['n']:,}, n_cells = {view['n_cells']:,}; "
                    f"{done.stdout.strip()}",
                )
            )
        same = all(
            np.array_equal(a, b) for a, b in zip(results["local"], results["spark"], strict=True)
        )
        out.append(("ingest: local and spark histograms identical", str(same)))
    return out


def write_bombs(root: Path) -> list[tuple[str, Path, str, dict[str, str]]]:
    """The bodies of ``--bombs``: (label, file, query, server environment)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 1 << 26  # 512 MiB of float64 zeros in one page
    page = root / "page_bomb.parquet"
    pq.write_table(
        pa.table({"x": np.zeros(rows)}),
        page,
        compression="zstd",
        use_dictionary=False,
        write_statistics=False,
        data_page_size=1 << 30,
        max_rows_per_page=rows,
        write_batch_size=rows,
        row_group_size=rows,
    )
    nulls = root / "null_bomb.parquet"
    with pq.ParquetWriter(nulls, pa.schema([("x", pa.float64())])) as writer:
        for _ in range(10):
            writer.write_table(pa.table({"x": pa.nulls(10**7, pa.float64())}))
        writer.write_table(pa.table({"x": pa.array([1.0, 2.0, 3.0])}))
    ordinary = root / "one_row_group.parquet"
    n = 50_000_000
    values = np.random.default_rng(5).uniform(0, 100, n)
    pq.write_table(pa.table({"x": values}), ordinary, row_group_size=n, use_dictionary=False)
    del values
    return [
        ("page bomb: one 512 MiB page of zeros (zstd)", page, "?column=x", {}),
        (
            "null bomb: 10^8 nulls + 3 values, ?missing=skip, DPQUANT_MAX_VALUES=10^7",
            nulls,
            "?column=x&missing=skip",
            {"DPQUANT_MAX_VALUES": str(10**7)},
        ),
        ("ordinary: 5·10^7 float64 in one row group", ordinary, "?column=x", {}),
    ]


def bomb_bench(base_url: str) -> None:
    """Each body of :func:`write_bombs` to a fresh server; its peak RSS before and after."""
    import app

    admin = create_engine(normalize_url(base_url), isolation_level="AUTOCOMMIT")
    schema = "dpq_bench_" + uuid.uuid4().hex[:10]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = with_schema(base_url, schema)
    upgrade_database(url)
    key = "dpq_bench-" + secrets.token_urlsafe(32)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="dpquant-bombs-") as tmp:
            for label, path, query, env in write_bombs(Path(tmp)):
                port = free_port()
                proc = start_server(url, key, port, env)
                try:
                    base = f"http://127.0.0.1:{port}"
                    h = {"Authorization": f"Bearer {key}"}
                    with httpx.Client(base_url=base, headers=h, timeout=900) as client:
                        ds = client.post(
                            "/v1/datasets",
                            json={"name": f"{schema}-{port}", "lower": 0, "upper": 100},
                        ).json()
                        idle = max(vm_hwm_mb(p) for p in tree(proc.pid))
                        body = path.read_bytes()
                        t = time.perf_counter()
                        r = client.put(
                            f"/v1/datasets/{ds['id']}/values{query}",
                            content=(body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)),
                            headers={"content-type": "application/vnd.apache.parquet"},
                        )
                        wall = time.perf_counter() - t
                        peak = max(vm_hwm_mb(p) for p in tree(proc.pid))
                        answer = (
                            f"n = {r.json()['n']:,}, skipped = {r.json()['values_skipped']:,}"
                            if r.status_code == 200
                            else r.json()["detail"][:60]
                        )
                        rows.append(
                            (
                                label,
                                f"{len(body) / 1e6:.2f} MB",
                                f"{r.status_code} {answer}",
                                f"{wall:.1f} s",
                                f"{idle:.0f} MB",
                                f"{peak:.0f} MB",
                            )
                        )
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    print(f"code: {Path(app.__file__).parent.parent}")
    print("| body | size | answer | time | server VmHWM idle | server VmHWM after |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def table_csv(rows: int, units: int, seed: int) -> Iterator[bytes]:
    """A CSV (person, age, income) of ``rows`` rows over ``units`` people, each row's person
    drawn uniformly (so ~rows/units rows each, Poisson), in chunks."""
    rng = np.random.default_rng(seed)
    yield b"person,age,income\n"
    left = rows
    while left:
        k = min(CHUNK_VALUES, left)
        people = rng.integers(0, units, k)
        ages = rng.integers(18, 90, k)
        incomes = np.round(rng.lognormal(10.5, 0.6, k), 2)
        yield "".join(
            f"p{p:09d},{a},{i}\n"
            for p, a, i in zip(people.tolist(), ages.tolist(), incomes.tolist(), strict=True)
        ).encode()
        left -= k


def table_bench(base_url: str, rows: int, units: int, k: int) -> None:
    """One privacy-unit table upload (CSV by header: person, age, income; k rows kept per
    person, bounded in PostgreSQL): time, the server's peak RSS, what was kept."""
    admin = create_engine(normalize_url(base_url), isolation_level="AUTOCOMMIT")
    schema = "dpq_bench_" + uuid.uuid4().hex[:10]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = with_schema(base_url, schema)
    upgrade_database(url)
    key = "dpq_bench-" + secrets.token_urlsafe(32)
    port = free_port()
    proc = start_server(url, key, port)
    out: list[tuple[str, str]] = []
    try:
        h = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=h, timeout=3600) as c:
            body = {
                "name": schema,
                "epsilon": 10,
                "privacy_unit": "person",
                "max_rows_per_unit": k,
                "columns": [
                    {"name": "age", "type": "integer", "lower": 0, "upper": 120},
                    {"name": "income", "type": "numeric", "lower": 0, "upper": 10**6},
                ],
            }
            ds = c.post("/v1/datasets", json=body).json()
            idle = max(vm_hwm_mb(p) for p in tree(proc.pid))
            t = time.perf_counter()
            r = c.put(
                f"/v1/datasets/{ds['id']}/values",
                content=table_csv(rows, units, seed=1),
                headers={"content-type": "text/csv"},
            )
            took = time.perf_counter() - t
            assert r.status_code == 200, r.text
            peak = max(vm_hwm_mb(p) for p in tree(proc.pid))
            view = r.json()
            t = time.perf_counter()
            rel = c.post(
                f"/v1/datasets/{ds['id']}/quantiles",
                json={"quantiles": [0.1, 0.5, 0.9], "epsilon": "1", "column": "income"},
            )
            release_s = time.perf_counter() - t
            assert rel.status_code == 201, rel.text
        out += [
            ("rows (person, age, income) in one streamed CSV request", f"{rows:,}"),
            ("units / max_rows_per_unit", f"{units:,} / {k}"),
            ("upload time (read, stage, bound, store)", f"{took:.1f} s"),
            ("server VmHWM before / after (max over processes)", f"{idle:.0f} / {peak:.0f} MB"),
            (
                "n kept / units / rows dropped",
                f"{view['n']:,} / {view['units']:,} / {view['rows_dropped']:,}",
            ),
            ("first release on income (m = 3, jointexp)", f"{release_s:.2f} s"),
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    print("| measure | value |\n|---|---|")
    for name, value in out:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    raise SystemExit(main())
