"""The Spark engine: the grid histogram as one GROUP BY, computed where the data lives.

The executors read the files, compute each row's cell with the same IEEE double expression as
:func:`app.codec.grid.cell_of` — ``floor((least(greatest(x, lower), upper) - lower) / g
+ 0.5)``, clipped to [0, K] — and count rows per cell. Only the (cell, count) rows (one per
distinct cell) and four totals reach the driver; no value does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.ingest.core import Counted, Grid, IngestError


def session(master: str) -> Any:
    """A SparkSession on ``master`` (reuses the active session if one exists).

    The driver's log level is ``OFF`` unless ``DPQUANT_SPARK_LOG_LEVEL`` says otherwise:
    Spark's task-failure logs quote the offending value (e.g. a cell that does not cast to
    double). On a cluster, executors log with the cluster's own configuration, next to the
    data they read.
    """
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("dpquant-ingest")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    level = os.environ.get("DPQUANT_SPARK_LOG_LEVEL", "OFF")
    spark.sparkContext.setLogLevel(level)
    if level.upper() == "OFF":
        # PySpark 4 also logs failed queries' messages (with the value) from Python.
        from pyspark.logger import PySparkLogger

        for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
            PySparkLogger.getLogger(name).disabled = True
    return spark


def cell_column(x: Any, grid: Grid) -> Any:
    """The Spark expression of the cell of double column ``x``."""
    from pyspark.sql import functions as F

    lower, upper, g = F.lit(float(grid.lower)), F.lit(float(grid.upper)), F.lit(grid.granularity)
    clamped = F.least(F.greatest(x, lower), upper)
    cell = F.floor((clamped - lower) / g + F.lit(0.5))
    return F.least(F.greatest(cell, F.lit(0).cast("bigint")), F.lit(grid.k_max).cast("bigint"))


def read_frame(spark: Any, kind: str, files: list[str], names: list[str]) -> Any:
    """The files as one DataFrame (CSV with a header row); a missing column is an error."""
    reader = spark.read
    frame = (
        reader.parquet(*files) if kind == "parquet" else reader.option("header", True).csv(files)
    )
    for name in names:
        if name not in frame.columns:
            raise IngestError(f"no column {name!r}")
    return frame


def numeric_column(name: str, kind: str) -> Any:
    """The double value of column ``name``; in CSV files the server's missing-value markers
    (:data:`app.datasets.upload.MISSING_MARKERS`: NA, NaN, null, ...) are nulls, as in the
    local engine and in uploads."""
    from pyspark.sql import functions as F

    from app.datasets.upload import MISSING_MARKERS

    column = F.col(f"`{name}`")
    if kind == "csv":
        marked = F.lower(F.trim(column)).isin(sorted(MISSING_MARKERS))
        column = F.when(marked, F.lit(None)).otherwise(column)
    return column.cast("double")


def numeric_frame(
    frame: Any, kind: str, columns: list[str], *, keep: Sequence[Any] = (),
    checks: Sequence[Any] = (),
) -> tuple[Any, list[str], Any, Any]:  # fmt: skip
    """``columns`` as doubles ``x0, x1, ...`` (plus the ``keep`` expressions), their names,
    the condition "no missing cell", and one pass of totals: ``rows``, ``present`` (rows
    with no missing cell) and the ``checks`` aggregates. NaN or infinite values are refused
    (:class:`IngestError` naming the column)."""
    from pyspark.sql import functions as F

    xs = [f"x{i}" for i in range(len(columns))]
    data = frame.select(
        *(numeric_column(c, kind).alias(x) for c, x in zip(columns, xs, strict=True)), *keep
    )
    complete = F.lit(True)
    for x in xs:
        complete = complete & F.col(x).isNotNull()
    totals = data.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(complete, 1).otherwise(0)).alias("present"),
        *(
            F.sum(F.when(F.isnan(x) | (F.abs(x) == float("inf")), 1).otherwise(0)).alias(f"bad{x}")
            for x in xs
        ),
        *checks,
    ).collect()[0]
    for column, x in zip(columns, xs, strict=True):
        if totals[f"bad{x}"]:
            raise IngestError(f"column {column!r} holds NaN or infinite values")
    return data, xs, complete, totals


def stacked_counts(
    data: Any, xs: list[str], grids: list[Grid], *, extra: str | None = None
) -> tuple[list[Counted], int]:
    """Per column of ``xs`` (double columns of ``data``, no nulls), its (cell, count) rows and
    the values outside its bounds, all from one GROUP BY (column, cell): several columns are
    stacked by an explode. ``extra``: an integer column of ``data`` summed once per row
    (returned second; 0 without it). ``n`` and ``skipped`` of the results are left 0."""
    from pyspark.sql import functions as F

    def part(i: int, x: str, grid: Grid) -> list[Any]:
        outside = (F.col(x) < grid.lower) | (F.col(x) > grid.upper)
        return [
            F.lit(i).alias("c"),
            cell_column(F.col(x), grid).alias("cell"),
            F.when(outside, 1).otherwise(0).alias("out"),
        ]

    carried = [F.col(extra).alias("extra")] if extra else [F.lit(0).alias("extra")]
    if len(xs) == 1:
        rows = data.select(*part(0, xs[0], grids[0]), *carried)
    else:
        stacked = F.explode(
            F.array(
                *(F.struct(*part(i, x, g)) for i, (x, g) in enumerate(zip(xs, grids, strict=True)))
            )
        )
        rows = data.select(stacked.alias("s"), *carried).select("s.c", "s.cell", "s.out", "extra")
    table = (
        rows.groupBy("c", "cell")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("out").alias("outside"),
            F.sum(F.when(F.col("c") == 0, F.col("extra")).otherwise(0)).alias("extra"),
        )
        .orderBy("c", "cell")
        .toArrow()
    )
    which = table.column("c").to_numpy()
    cells = table.column("cell").to_numpy().astype(np.int64)
    counts = table.column("count").to_numpy().astype(np.int64)
    outside = table.column("outside").to_numpy().astype(np.int64)
    out = []
    for i in range(len(xs)):
        mine = which == i
        out.append(Counted(cells[mine], counts[mine], 0, int(outside[mine].sum()), 0))
    return out, int(table.column("extra").to_numpy().sum())


def count_spark(spark: Any, kind: str, files: list[str], column: str, grid: Grid) -> Counted:
    """The histogram of ``column`` over ``files``, counted by Spark (one column)."""
    (counted,) = count_columns_spark(spark, kind, files, [column], [grid])
    return counted


def count_columns_spark(
    spark: Any, kind: str, files: list[str], columns: list[str], grids: list[Grid],
    group_by: str | None = None, groups_out: dict[str, Any] | None = None,
) -> list[Counted]:  # fmt: skip
    """The histogram of each of ``columns`` over ``files``, counted by Spark; a row with a
    missing cell in any of them is skipped whole (counted), as the local engine does.

    Spark's own errors (unreadable files, values that do not cast to double under ANSI mode)
    are reported by class only: their messages can quote a value. ``group_by``: also the
    per-key counts of that column, put in ``groups_out`` (:mod:`app.ingest.groups`).
    """
    try:
        return _count(spark, kind, files, columns, grids, group_by, groups_out)
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"Spark failed: {type(exc).__name__}") from None


def _count(
    spark: Any, kind: str, files: list[str], columns: list[str], grids: list[Grid],
    group_by: str | None = None, groups_out: dict[str, Any] | None = None,
) -> list[Counted]:  # fmt: skip
    from pyspark.sql import functions as F

    frame = read_frame(spark, kind, files, columns + ([group_by] if group_by else []))
    keep = [] if group_by is None else [F.col(f"`{group_by}`").cast("string").alias("g")]
    data, xs, complete, totals = numeric_frame(frame, kind, columns, keep=keep)
    counted, _ = stacked_counts(data.where(complete), xs, grids)
    if group_by is not None and groups_out is not None:
        from app.ingest.groups import spark_key_counts

        groups_out.update(spark_key_counts(data.where(complete), xs, grids, "g", group_by))
    present = int(totals["present"] or 0)
    skipped = int(totals["rows"]) - present
    return [Counted(one.cells, one.counts, present, one.n_outside, skipped) for one in counted]
