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
from app.ingest.core import (
    BATCH_ROWS,
    Counted,
    Grid,
    IngestError,
    KeySink,
    csv_null_values,
    numeric_block,
)
from app.mechanisms.rng import make_rng

#: Temporary files the local engine spreads the rows over (by unit hash).
BUCKETS = 64

Bounded = tuple[list[Counted], int, int]


def _row_type(width: int) -> np.dtype[Any]:
    """A staged row: unit hash, random sort key, per column its cell and whether the value
    lay outside the bounds, and its group key's code (-1: none)."""
    return np.dtype(
        [("unit", "<u8"), ("key", "<i8"), ("cell", "<i8", (width,)), ("outside", "u1", (width,)),
         ("code", "<i8")]
    )  # fmt: skip


def _unit_hashes(array: Any, run_key: bytes, path: str) -> np.ndarray:
    """64-bit keyed hashes of a unit column's values (strings or integers; no nulls)."""
    import pyarrow as pa

    if array.null_count:
        raise IngestError(f"{path}: the privacy unit column has empty cells")
    if not (pa.types.is_integer(array.type) or pa.types.is_string(array.type)
            or pa.types.is_large_string(array.type)):  # fmt: skip
        raise IngestError(f"{path}: the privacy unit column must hold strings or integers")
    import pyarrow.compute as pc

    text = pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
    if text and pc.any(pc.equal(pc.utf8_trim_whitespace(array), "")).as_py():
        raise IngestError(f"{path}: the privacy unit column has empty cells")
    out = np.empty(len(array), dtype="<u8")
    for i, unit in enumerate(array.to_pylist()):
        digest = hashlib.blake2b(str(unit).encode(), digest_size=8, key=run_key).digest()
        out[i] = int.from_bytes(digest, "little")
    return out


def _batches(kind: str, path: str, columns: list[str], unit: str, text: list[str]) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    wanted = [*columns, unit, *text]
    try:
        if kind == "parquet":
            parquet = pq.ParquetFile(path, pre_buffer=False)
            for name in wanted:
                if name not in parquet.schema_arrow.names:
                    raise IngestError(f"{path}: no column {name!r}")
            yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted)
        else:
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=wanted,
                    column_types={
                        **dict.fromkeys(columns, pa.float64()),
                        unit: pa.string(),
                        **dict.fromkeys(text, pa.string()),
                    },
                    null_values=csv_null_values(),
                ),
            )
            yield from reader
    except KeyError:
        raise IngestError(f"{path}: no column {' or '.join(map(repr, wanted))}") from None
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{path}: cannot read the columns ({type(exc).__name__})") from None


def count_local_bounded(
    kind: str, files: list[str], column: str, unit: str, grid: Grid, k: int
) -> tuple[Counted, int, int]:
    """(histogram of the kept rows, units, rows dropped) by the local engine, one column."""
    (counted,), units, dropped = count_columns_local_bounded(kind, files, [column], unit, [grid], k)
    return counted, units, dropped


def count_columns_local_bounded(
    kind: str, files: list[str], columns: list[str], unit: str, grids: list[Grid], k: int,
    keys: KeySink | None = None,
) -> Bounded:  # fmt: skip
    """(histogram of each column over the kept rows, units, rows dropped) by the local
    engine. A row with a missing numeric cell is skipped whole (counted), before bounding.
    ``keys``: also the kept rows' per-key counts (:mod:`app.ingest.groups`)."""
    run_key = secrets.token_bytes(32)
    rng = make_rng(None)
    row_type = _row_type(len(columns))
    skipped = 0
    with tempfile.TemporaryDirectory(prefix="dpquant-ingest-") as tmp:
        paths = [Path(tmp) / f"bucket{b:02d}" for b in range(BUCKETS)]
        files_out = [p.open("wb") for p in paths]
        try:
            for path in files:
                text = [] if keys is None else [keys.name]
                for batch in _batches(kind, path, columns, unit, text):
                    block, present = numeric_block(batch, columns, path)
                    hashes = _unit_hashes(batch.column(batch.schema.get_field_index(unit)),
                                          run_key, path)  # fmt: skip
                    codes = (np.full(hashes.size, -1, np.int64) if keys is None
                             else keys.codes(batch, path))  # fmt: skip
                    if not present.all():
                        skipped += int(present.size - present.sum())
                        block, hashes, codes = block[present], hashes[present], codes[present]
                    rows = np.empty(hashes.size, dtype=row_type)
                    rows["code"] = codes
                    rows["unit"] = hashes
                    rows["key"] = rng.integers(0, 2**63 - 1, size=hashes.size, dtype=np.int64)
                    for i, grid in enumerate(grids):
                        x = block[:, i]
                        rows["cell"][:, i] = cell_of(x, grid.lower, grid.upper, grid.granularity)
                        rows["outside"][:, i] = (x < grid.lower) | (x > grid.upper)
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
        cells: list[list[np.ndarray]] = [[] for _ in columns]
        counts: list[list[np.ndarray]] = [[] for _ in columns]
        outside = np.zeros(len(columns), dtype=np.int64)
        units = kept = total = 0
        for p in paths:
            rows = np.fromfile(p, dtype=row_type)
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
            outside += chosen["outside"].sum(axis=0, dtype=np.int64)
            if keys is not None:
                keys.add_cells(
                    np.ascontiguousarray(chosen["code"]),
                    [np.ascontiguousarray(chosen["cell"][:, i]) for i in range(len(columns))],
                )
            for i in range(len(columns)):
                c, n = np.unique(chosen["cell"][:, i], return_counts=True)
                cells[i].append(c)
                counts[i].append(n)
    if not kept:
        raise IngestError("no values found (all missing?)")
    out = []
    for i in range(len(columns)):
        uniq, inverse = np.unique(np.concatenate(cells[i]), return_inverse=True)
        summed = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(summed, inverse, np.concatenate(counts[i]))
        out.append(Counted(uniq.astype(np.int64), summed, kept, int(outside[i]), skipped))
    return out, units, total - kept


def count_spark_bounded(
    spark: Any, kind: str, files: list[str], column: str, unit: str, grid: Grid, k: int
) -> tuple[Counted, int, int]:
    """(histogram of the kept rows, units, rows dropped) by Spark, one column."""
    (counted,), units, dropped = count_columns_spark_bounded(
        spark, kind, files, [column], unit, [grid], k
    )
    return counted, units, dropped


def count_columns_spark_bounded(
    spark: Any, kind: str, files: list[str], columns: list[str], unit: str, grids: list[Grid],
    k: int, group_by: str | None = None, groups_out: dict[str, Any] | None = None,
) -> Bounded:  # fmt: skip
    """(histogram of each column over the kept rows, units, rows dropped) by Spark; its own
    errors are reported by class only (their messages can quote a value). ``group_by``: also
    the kept rows' per-key counts, put in ``groups_out``."""
    try:
        return _spark(spark, kind, files, columns, unit, grids, k, group_by, groups_out)
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"Spark failed: {type(exc).__name__}") from None


def _spark(
    spark: Any, kind: str, files: list[str], columns: list[str], unit: str, grids: list[Grid],
    k: int, group_by: str | None = None, groups_out: dict[str, Any] | None = None,
) -> Bounded:  # fmt: skip
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from app.ingest.spark import numeric_frame, read_frame, stacked_counts

    frame = read_frame(spark, kind, files, [*columns, unit, *([group_by] if group_by else [])])
    secret = secrets.token_hex(32)
    grouping = [] if group_by is None else [F.col(f"`{group_by}`").cast("string").alias("g")]
    data, xs, complete, checks = numeric_frame(
        frame, kind, columns,
        keep=[F.col(f"`{unit}`").cast("string").alias("u"), *grouping],
        checks=[F.sum(F.when(F.col("u").isNull(), 1).otherwise(0)).alias("no_unit")],
    )  # fmt: skip
    if checks["no_unit"]:
        raise IngestError("the privacy unit column has empty cells")
    order = F.sha2(
        F.concat_ws("|", F.lit(secret), F.col("u"), F.monotonically_increasing_id().cast("string")),
        256,
    )
    # One window pass, no cache: each unit's first row (rn = 1) is always kept (k >= 1), so
    # the kept rows' first-row marks also give the number of units.
    kept = (
        data.where(complete)
        .withColumn("rn", F.row_number().over(Window.partitionBy("u").orderBy(order)))
        .where(F.col("rn") <= k)
        .withColumn("first", F.when(F.col("rn") == 1, 1).otherwise(0))
    )
    if group_by is not None:  # both counts must see the same kept rows: evaluate once
        kept = kept.persist()
    counted, extra = stacked_counts(kept, xs, grids, extra="first")
    if group_by is not None and groups_out is not None:
        from app.ingest.groups import spark_key_counts

        groups_out.update(spark_key_counts(kept, xs, grids, "g", group_by))
    present = int(checks["present"])
    n = int(counted[0].counts.sum()) if counted else 0
    skipped = int(checks["rows"]) - present
    out = [Counted(one.cells, one.counts, n, one.n_outside, skipped) for one in counted]
    return out, extra, present - n
