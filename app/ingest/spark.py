"""The Spark engine: the grid histogram as one GROUP BY, computed where the data lives.

The executors read the files, compute each row's cell with the same IEEE double expression as
:func:`app.codec.grid.cell_of` — ``floor((least(greatest(x, lower), upper) - lower) / g
+ 0.5)``, clipped to [0, K] — and count rows per cell. Only the (cell, count) rows (one per
distinct cell) and four totals reach the driver; no value does.
"""

from __future__ import annotations

import os
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


def count_spark(spark: Any, kind: str, files: list[str], column: str, grid: Grid) -> Counted:
    """The histogram of ``column`` over ``files``, counted by Spark.

    Spark's own errors (unreadable files, values that do not cast to double under ANSI mode)
    are reported by class only: their messages can quote a value.
    """
    try:
        return _count(spark, kind, files, column, grid)
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"Spark failed: {type(exc).__name__}") from None


def _count(spark: Any, kind: str, files: list[str], column: str, grid: Grid) -> Counted:
    from pyspark.sql import functions as F

    paths = list(files)
    reader = spark.read
    frame = (
        reader.parquet(*paths) if kind == "parquet" else reader.option("header", True).csv(paths)
    )
    if column not in frame.columns:
        raise IngestError(f"no column {column!r}")
    x = F.col(f"`{column}`").cast("double")
    data = frame.select(x.alias("x"))
    finite = ~(F.isnan("x") | (F.col("x") == float("inf")) | (F.col("x") == float("-inf")))
    totals = data.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count("x").alias("present"),
        F.sum(F.when(~finite, 1).otherwise(0)).alias("bad"),
        F.sum(F.when((F.col("x") < grid.lower) | (F.col("x") > grid.upper), 1).otherwise(0)).alias(
            "outside"
        ),
    ).collect()[0]
    if totals["bad"]:
        raise IngestError(f"column {column!r} holds NaN or infinite values")
    counted = (
        data.where(F.col("x").isNotNull())
        .select(cell_column(F.col("x"), grid).alias("cell"))
        .groupBy("cell")
        .count()
        .orderBy("cell")
        .toArrow()
    )
    cells = counted.column("cell").to_numpy().astype(np.int64)
    counts = counted.column("count").to_numpy().astype(np.int64)
    return Counted(
        cells=cells,
        counts=counts,
        n=int(totals["present"]),
        n_outside=int(totals["outside"] or 0),
        skipped=int(totals["rows"] - totals["present"]),
    )
