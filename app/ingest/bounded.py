"""Contribution bounding where the data lives: at most k rows per privacy unit, then counts.

Both engines keep, for every unit, ``k`` of its rows chosen uniformly at random (a unit with
k rows or fewer keeps them all) and count the kept rows' grid cells. Only the histogram and
three totals leave: no unit id, no per-unit figure.

* ``local`` (pyarrow, memory bounded): one pass reads (value, unit) by record batches, gives
  each row a cell, a 63-bit sort key from the CSPRNG (:func:`app.mechanisms.rng.make_rng`)
  and its unit's 64-bit keyed hash (BLAKE2b under a random key of this run; a collision
  merges two units, which only keeps fewer rows), and appends the rows to one of
  :data:`BUCKETS` temporary files by hash; a second pass sorts each bucket by (unit, key)
  and keeps each unit's first k rows. Memory: one batch, then one bucket (~rows / 64).
* ``spark``: ``row_number()`` over a window partitioned by unit and ordered by
  SHA-256(secret, unit, row id) — a keyed pseudo-random order from a 256-bit secret drawn
  from the OS CSPRNG, evaluated on the executors — then ``rn <= k`` and the same GROUP BY
  as the unbounded count (:mod:`app.ingest.spark`). The shuffle by unit is Spark's.

When no unit has more than k rows, nothing is dropped and both engines count exactly the
unbounded histogram (tests check it).
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.codec.grid import cell_of
from app.ingest.core import BATCH_ROWS, Counted, Grid, IngestError
from app.mechanisms.rng import make_rng

#: Temporary files the local engine spreads the rows over (by unit hash).
BUCKETS = 64
_ROW = np.dtype([("unit", "<u8"), ("key", "<i8"), ("cell", "<i8"), ("outside", "u1")])


def _unit_hashes(array: Any, run_key: bytes, path: str) -> np.ndarray:
    """64-bit keyed hashes of a unit column's values (strings or integers; no nulls)."""
    import pyarrow as pa

    if array.null_count:
        raise IngestError(f"{path}: the privacy unit column has empty cells")
    if not (pa.types.is_integer(array.type) or pa.types.is_string(array.type)
            or pa.types.is_large_string(array.type)):  # fmt: skip
        raise IngestError(f"{path}: the privacy unit column must hold strings or integers")
    out = np.empty(len(array), dtype="<u8")
    for i, unit in enumerate(array.to_pylist()):
        digest = hashlib.blake2b(str(unit).encode(), digest_size=8, key=run_key).digest()
        out[i] = int.from_bytes(digest, "little")
    return out


def _batches(kind: str, path: str, column: str, unit: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            parquet = pq.ParquetFile(path, pre_buffer=False)
            for name in (column, unit):
                if name not in parquet.schema_arrow.names:
                    raise IngestError(f"{path}: no column {name!r}")
            yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=[column, unit])
        else:
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[column, unit],
                    column_types={column: pa.float64(), unit: pa.string()},
                ),
            )
            yield from reader
    except KeyError:
        raise IngestError(f"{path}: no column {column!r} or {unit!r}") from None
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{path}: cannot read the columns ({type(exc).__name__})") from None


def count_local_bounded(
    kind: str, files: list[str], column: str, unit: str, grid: Grid, k: int
) -> tuple[Counted, int, int]:
    """(histogram of the kept rows, units, rows dropped) by the local engine."""
    import pyarrow as pa

    run_key = secrets.token_bytes(32)
    rng = make_rng(None)
    skipped = 0
    with tempfile.TemporaryDirectory(prefix="dpquant-ingest-") as tmp:
        paths = [Path(tmp) / f"bucket{b:02d}" for b in range(BUCKETS)]
        files_out = [p.open("wb") for p in paths]
        try:
            for path in files:
                for batch in _batches(kind, path, column, unit):
                    values = batch.column(batch.schema.get_field_index(column))
                    units = batch.column(batch.schema.get_field_index(unit))
                    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
                        raise IngestError(f"{path}: column {column!r} is not numeric")
                    x = values.to_numpy(zero_copy_only=False).astype(np.float64)
                    hashes = _unit_hashes(units, run_key, path)
                    if values.null_count:
                        present = ~values.is_null().to_numpy(zero_copy_only=False)
                        skipped += int(values.null_count)
                        x, hashes = x[present], hashes[present]
                    if not np.isfinite(x).all():
                        raise IngestError(f"{path}: column {column!r} holds NaN or infinite values")
                    rows = np.empty(x.size, dtype=_ROW)
                    rows["unit"] = hashes
                    rows["key"] = rng.integers(0, 2**63 - 1, size=x.size, dtype=np.int64)
                    rows["cell"] = cell_of(x, grid.lower, grid.upper, grid.granularity)
                    rows["outside"] = (x < grid.lower) | (x > grid.upper)
                    bucket = (hashes % np.uint64(BUCKETS)).astype(np.int64)
                    order = np.argsort(bucket, kind="stable")
                    bounds = np.searchsorted(bucket[order], np.arange(BUCKETS + 1))
                    for b in range(BUCKETS):
                        part = rows[order[bounds[b] : bounds[b + 1]]]
                        if part.size:
                            files_out[b].write(part.tobytes())
        finally:
            for f in files_out:
                f.close()
        cells: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        units = kept = total = outside = 0
        for p in paths:
            rows = np.fromfile(p, dtype=_ROW)
            p.unlink()
            if not rows.size:
                continue
            total += rows.size
            rows = rows[np.lexsort((rows["key"], rows["unit"]))]
            starts = np.flatnonzero(np.r_[True, rows["unit"][1:] != rows["unit"][:-1]])
            units += starts.size
            rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
            chosen = rows[rank < k]
            kept += chosen.size
            outside += int(chosen["outside"].sum())
            c, n = np.unique(chosen["cell"], return_counts=True)
            cells.append(c)
            counts.append(n)
    if not cells:
        raise IngestError("no values found (all missing?)")
    all_cells = np.concatenate(cells)
    all_counts = np.concatenate(counts)
    uniq, inverse = np.unique(all_cells, return_inverse=True)
    summed = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(summed, inverse, all_counts)
    counted = Counted(uniq.astype(np.int64), summed, kept, outside, skipped)
    return counted, units, total - kept


def count_spark_bounded(
    spark: Any, kind: str, files: list[str], column: str, unit: str, grid: Grid, k: int
) -> tuple[Counted, int, int]:
    """(histogram of the kept rows, units, rows dropped) by Spark; its own errors are
    reported by class only (their messages can quote a value)."""
    try:
        return _spark(spark, kind, files, column, unit, grid, k)
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"Spark failed: {type(exc).__name__}") from None


def _spark(
    spark: Any, kind: str, files: list[str], column: str, unit: str, grid: Grid, k: int
) -> tuple[Counted, int, int]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from app.ingest.spark import cell_column

    reader = spark.read
    frame = (
        reader.parquet(*files) if kind == "parquet" else reader.option("header", True).csv(files)
    )
    for name in (column, unit):
        if name not in frame.columns:
            raise IngestError(f"no column {name!r}")
    secret = secrets.token_hex(32)
    data = frame.select(
        F.col(f"`{column}`").cast("double").alias("x"),
        F.col(f"`{unit}`").cast("string").alias("u"),
    )
    checks = data.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count("x").alias("present"),
        F.sum(F.when(F.col("u").isNull(), 1).otherwise(0)).alias("no_unit"),
        F.sum(F.when(F.isnan("x") | (F.abs("x") == float("inf")), 1).otherwise(0)).alias("bad"),
    ).collect()[0]
    if checks["bad"]:
        raise IngestError(f"column {column!r} holds NaN or infinite values")
    if checks["no_unit"]:
        raise IngestError("the privacy unit column has empty cells")
    order = F.sha2(
        F.concat_ws("|", F.lit(secret), F.col("u"), F.monotonically_increasing_id().cast("string")),
        256,
    )
    # One window pass, no cache: each unit's first row (rn = 1) is always kept (k >= 1), so
    # the kept rows' counts per cell also give the number of units.
    counted = (
        data.where(F.col("x").isNotNull())
        .withColumn("rn", F.row_number().over(Window.partitionBy("u").orderBy(order)))
        .where(F.col("rn") <= k)
        .select(
            cell_column(F.col("x"), grid).alias("cell"),
            F.when(F.col("rn") == 1, 1).otherwise(0).alias("first"),
            F.when((F.col("x") < grid.lower) | (F.col("x") > grid.upper), 1)
            .otherwise(0)
            .alias("outside"),
        )
        .groupBy("cell")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("first").alias("units"),
            F.sum("outside").alias("outside"),
        )
        .orderBy("cell")
        .toArrow()
    )
    cells = counted.column("cell").to_numpy().astype(np.int64)
    counts = counted.column("count").to_numpy().astype(np.int64)
    kept = int(counts.sum())
    result = Counted(
        cells=cells,
        counts=counts,
        n=kept,
        n_outside=int(counted.column("outside").to_numpy().sum()),
        skipped=int(checks["rows"] - checks["present"]),
    )
    units = int(counted.column("units").to_numpy().sum())
    return result, units, int(checks["present"]) - kept
