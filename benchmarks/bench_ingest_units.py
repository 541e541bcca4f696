"""``dpquant ingest`` with privacy units: both engines bound every unit to k rows.

Writes Parquet files of ``--rows`` rows (``--columns`` float64 columns x, x1, x2, ... and
person: int64) over ``--units`` people (each row's person uniform, so ~rows/units rows each),
then counts the bounded histogram of every column (a table's ``ingest --columns``) with
the local engine (pyarrow, hash buckets on disk) and with Spark (``local[*]``: a window by
unit), checks that both keep the same number of rows and units, and prints a table: time,
peak memory (the local engine's process; Spark's JVM and Python together), rows kept and
dropped. Counting only: nothing is uploaded (the upload is the histogram, O(cells)).

Usage::

    .venv/bin/python -m benchmarks.bench_ingest_units [--rows 100000000] [--units 10000000]
        [--k 5] [--columns 1] [--engines local,spark] [--dir /tmp/dpquant-bench-units]
        [--spark-memory 6g]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.ingest import core
from app.ingest.core import Grid

CHUNK = 1 << 22


def names(columns: int) -> list[str]:
    return ["x"] + [f"x{i}" for i in range(1, columns)]


def write_files(root: Path, rows: int, units: int, columns: int = 1, files: int = 8) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    per_file = -(-rows // files)
    for f in range(files):
        n = min(per_file, rows - f * per_file)
        if n <= 0:
            break
        with pq.ParquetWriter(
            root / f"part{f:02d}.parquet",
            pa.schema([*((c, pa.float64()) for c in names(columns)), ("person", pa.int64())]),
        ) as writer:
            left = n
            while left:
                k = min(CHUNK, left)
                writer.write_table(
                    pa.table(
                        {
                            **{c: np.round(rng.lognormal(10.5, 0.6, k), 2) for c in names(columns)},
                            "person": rng.integers(0, units, k),
                        }
                    )
                )
                left -= k


def tree_rss_mb(pid: int) -> float:
    """RSS of ``pid`` and its descendants now (MB)."""
    total = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Peak:
    """Samples the RSS of this process and its children every 0.2 s."""

    def __init__(self) -> None:

        self.pid, self.peak, self._stop = os.getpid(), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, tree_rss_mb(self.pid))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--units", type=int, default=10_000_000)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--columns", type=int, default=1, help="numeric columns per row")
    parser.add_argument("--engines", default="local,spark")
    parser.add_argument("--dir", default="/tmp/dpquant-bench-units")
    parser.add_argument("--spark-memory", default="6g", help="local mode's driver memory")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    write_files(root, args.rows, args.units, args.columns)
    written = time.perf_counter() - t
    size = sum(p.stat().st_size for p in root.iterdir())
    kind, files = core.expand_paths([str(root)])
    grid = Grid(0.0, 1e6, 1.0)  # 10^6 + 1 cells: within the server's DPQUANT_MAX_CELLS
    columns, grids = names(args.columns), [grid] * args.columns
    out = [
        ("rows / units / k", f"{args.rows:,} / {args.units:,} / {args.k}"),
        ("numeric columns", str(args.columns)),
        ("Parquet written", f"{len(files)} files, {size / 1e9:.2f} GB in {written:.0f} s"),
    ]
    kept: dict[str, tuple[int, int, int]] = {}
    for engine in args.engines.split(","):
        with Peak() as peak:
            if engine == "local":
                from app.ingest.bounded import count_columns_local_bounded

                t = time.perf_counter()
                counted, units, dropped = count_columns_local_bounded(
                    kind, files, columns, "person", grids, args.k
                )
                took = time.perf_counter() - t
            else:
                from app.ingest.bounded import count_columns_spark_bounded
                from app.ingest.spark import session

                # local mode runs the executors inside the driver: give it the memory a
                # cluster's executors would have (the default is 1 GB)
                os.environ.setdefault(
                    "PYSPARK_SUBMIT_ARGS", f"--driver-memory {args.spark_memory} pyspark-shell"
                )
                spark = session("local[*]")  # the JVM's start is not counted
                t = time.perf_counter()
                counted, units, dropped = count_columns_spark_bounded(
                    spark, kind, files, columns, "person", grids, args.k
                )
                took = time.perf_counter() - t
                spark.stop()
        kept[engine] = (counted[0].n, units, dropped)
        out += [
            (f"{engine}: time (count and bound)", f"{took:.0f} s"),
            (f"{engine}: peak RSS (process and children)", f"{peak.peak:.0f} MB"),
            (
                f"{engine}: kept / units / dropped",
                f"{counted[0].n:,} / {units:,} / {dropped:,}",
            ),
        ]
    if len(kept) == 2:
        a, b = kept.values()
        out.append(("engines agree on kept rows and units", str(a[:2] == b[:2])))
    out.append(("self max RSS (ru_maxrss)", f"{resource.getrusage(0).ru_maxrss / 1024:.0f} MB"))
    print("| measure | value |\n|---|---|")
    for name, value in out:
        print(f"| {name} | {value} |")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
