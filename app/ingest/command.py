"""``dpquant ingest``: count a dataset's grid histograms (and, with ``--group-by``, its
per-key histograms) where the data lives, and upload the counts only."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from app.ingest import core
from app.ingest.groups import KeyCounter, upload_groups


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_ingest(args: argparse.Namespace, api_key: str) -> int:
    """Count a dataset's grid histogram from files and upload (cell, count) pairs only."""
    if not api_key:
        sys.stderr.write("error: set DPQUANT_API_KEY to an admin key\n")
        return 2
    started = time.perf_counter()
    try:
        kind, files = core.expand_paths(args.paths, allow_uris=args.engine == "spark")
        with core.make_client(args.server, api_key) as client:
            target = core.fetch_dataset(client, args.dataset)
            if args.unit is not None and target.unit is None:
                raise core.IngestError("the dataset has no privacy_unit: drop --unit")
            unit, k = args.unit or target.unit, target.k
            listed = None if args.columns is None else [
                c.strip() for c in args.columns.split(",") if c.strip()
            ]  # fmt: skip
            sources, names, grids = core.plan_columns(target, args.column, listed)
            if unit is not None and unit in sources:
                raise core.IngestError(
                    f"{unit!r} is the privacy unit column: it cannot be counted as a value"
                )
            if args.group_by is not None and args.group_by in [*sources, unit]:
                raise core.IngestError("--group-by names a value or unit column")
            keys = None if args.group_by is None else KeyCounter(args.group_by, grids)
            found: dict[str, Any] = {}
            bounded: tuple[int, int, int] | None = None
            counted: list[core.Counted]
            if args.engine == "spark":
                try:
                    from app.ingest.spark import count_columns_spark, session

                    spark = session(args.spark_master)
                except ImportError:
                    raise core.IngestError(
                        'the Spark engine needs pyspark: pip install "dpquant[spark]"'
                    ) from None
                if unit is None:
                    counted = count_columns_spark(
                        spark, kind, files, sources, grids, args.group_by, found
                    )
                else:
                    from app.ingest.bounded import count_columns_spark_bounded

                    counted, units, dropped = count_columns_spark_bounded(
                        spark, kind, files, sources, unit, grids, k, args.group_by, found
                    )
                    bounded = (k, units, dropped)
            elif unit is None:
                counted = core.count_columns_local(kind, files, sources, grids, keys=keys)
            else:
                from app.ingest.bounded import count_columns_local_bounded

                counted, units, dropped = count_columns_local_bounded(
                    kind, files, sources, unit, grids, k, keys
                )
                bounded = (k, units, dropped)
            if args.missing == "error" and counted[0].skipped:
                raise core.IngestError(
                    "some rows have a missing value (an empty cell, NA, NaN or null; a Parquet "
                    f"null) in {', '.join(map(repr, sources))}: use --missing skip to skip "
                    "those rows, as an upload's ?missing=skip does"
                )
            counted_at = time.perf_counter()
            dataset = core.upload(client, args.dataset, counted, bounded, columns=names)
            if args.group_by is not None:
                groups = keys.result() if keys is not None and args.engine == "local" else found
                dataset = upload_groups(client, args.dataset, args.group_by, names, groups)
    except core.IngestError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    done = time.perf_counter()
    _write(
        json.dumps(
            {
                "dataset": args.dataset,
                "engine": args.engine,
                "columns": names,
                "group_by": args.group_by,
                "files": len(files),
                "n": dataset.get("n"),
                "n_cells": dataset.get("n_cells"),
                "n_outside_bounds": dataset.get("n_outside_bounds"),
                "values_skipped": dataset.get("values_skipped"),
                "units": dataset.get("units"),
                "rows_dropped": dataset.get("rows_dropped"),
                "count_s": round(counted_at - started, 3),
                "upload_s": round(done - counted_at, 3),
            }
        )
    )
    return 0
