"""The local engine, the file discovery shared by both engines, and the upload client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.codec.grid import grid_steps
from app.codec.histogram import HistogramBuilder
from app.datasets.parquet_scan import (
    ParquetRefused,
    check_parquet_pages,
    parquet_leaf,
    parquet_rows,
)
from app.datasets.upload import MAX_PARQUET_PAGE_BYTES, PARQUET_BUFFER_BYTES

IntArray = NDArray[np.int64]
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
CSV_SUFFIXES = (".csv",)
#: Rows per record batch read by the local engine.
BATCH_ROWS = 1 << 18


class IngestError(Exception):
    """A problem to report to the operator (exit status 2); never carries a data value."""


@dataclass(frozen=True)
class Grid:
    """A dataset's public grid, as the server describes it."""

    lower: float
    upper: float
    granularity: float

    @property
    def k_max(self) -> int:
        """The largest cell index K."""
        return grid_steps(self.lower, self.upper, self.granularity)


@dataclass(frozen=True)
class Counted:
    """A computed histogram and its figures."""

    cells: IntArray
    counts: IntArray
    n: int
    n_outside: int
    skipped: int


def is_uri(path: str) -> bool:
    """Whether ``path`` names remote storage (``hdfs://``, ``s3a://``, ``file://``, ...)."""
    return "://" in path


def expand_paths(paths: list[str], *, allow_uris: bool = False) -> tuple[str, list[str]]:
    """The data files under ``paths`` and their format (``parquet`` or ``csv``; one per run).

    Local paths: files, or directories searched recursively; hidden and ``_``-prefixed files
    (``_SUCCESS``, ``.crc``) are ignored, as Spark does. URIs (``hdfs://…``, ``s3a://…``) are
    passed through untouched when ``allow_uris`` (the Spark engine: the executors list and
    read them); their format is CSV when the URI ends in ``.csv``, Parquet otherwise.
    """
    files: list[str] = []
    for raw in paths:
        path = Path(raw)
        if is_uri(raw):
            if not allow_uris:
                raise IngestError(f"{raw}: remote paths need --engine spark")
            files.append(raw)
        elif path.is_dir():
            files.extend(
                str(p)
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not p.name.startswith((".", "_"))
                and p.suffix.lower() in PARQUET_SUFFIXES + CSV_SUFFIXES
            )
        elif path.is_file():
            files.append(raw)
        else:
            raise IngestError(f"no such file or directory: {raw}")
    if not files:
        raise IngestError("no Parquet or CSV files found")
    kinds = {"csv" if f.lower().endswith(CSV_SUFFIXES) else "parquet" for f in files}
    if len(kinds) != 1:
        raise IngestError("mix of CSV and Parquet files: ingest one format per run")
    return kinds.pop(), files


def _check_parquet(
    path: str, file: Any, parquet: Any, column: str, *, room: int, limit: int, max_page_bytes: int
) -> None:
    """Refuse a Parquet file from its footer and page headers, before any data page is read:
    more records of ``column`` (missing ones included) than ``room``, or a page above
    ``max_page_bytes`` (see :func:`app.datasets.parquet_scan.check_parquet_pages`)."""
    leaf = parquet_leaf(parquet, column)
    if leaf is None:
        raise IngestError(f"{path}: column {column!r} is not a numeric top-level column")
    metadata = parquet.metadata
    if parquet_rows(metadata, leaf) > room:
        raise IngestError(
            f"{path}: more than {limit} values in all (column {column!r}, missing values "
            "included; DPQUANT_MAX_VALUES)"
        )
    try:
        check_parquet_pages(file, metadata, leaf, max_page_bytes=max_page_bytes)
    except ParquetRefused as exc:
        raise IngestError(f"{path}: column {column!r}: {exc}") from None


def _batches(
    kind: str, path: str, column: str, *, room: int, limit: int, max_page_bytes: int
) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            with open(path, "rb") as file:
                parquet = pq.ParquetFile(file, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
                if column not in parquet.schema_arrow.names:
                    raise IngestError(f"{path}: no column {column!r}")
                _check_parquet(
                    path,
                    file,
                    parquet,
                    column,
                    room=room,
                    limit=limit,
                    max_page_bytes=max_page_bytes,
                )
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=[column])
        else:
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[column], column_types={column: pa.float64()}
                ),
            )
            yield from reader
    except KeyError:
        raise IngestError(f"{path}: no column {column!r}") from None
    except (pa.ArrowException, OSError) as exc:
        # Arrow messages can quote a cell; report the class only.
        raise IngestError(f"{path}: cannot read column {column!r} ({type(exc).__name__})") from None


def count_local(
    kind: str,
    files: list[str],
    column: str,
    grid: Grid,
    *,
    max_values: int | None = None,
    max_page_bytes: int = MAX_PARQUET_PAGE_BYTES,
) -> Counted:
    """The histogram of ``column`` over ``files``, streamed with pyarrow (memory O(batch + d)).

    Nulls (empty CSV cells) are skipped and counted; NaN or infinite values are an error.
    Values and nulls of all files together count against ``max_values`` (default
    ``DPQUANT_MAX_VALUES``, as on the server): a Parquet file is refused from its footer
    before any of it is read, a CSV file as soon as it crosses the limit. A Parquet page
    above ``max_page_bytes`` is refused from the page headers, before any data page is read
    (as the server does with uploads: :data:`app.datasets.upload.MAX_PARQUET_PAGE_BYTES`).
    """
    import pyarrow as pa

    if max_values is None:
        from app.core.config import get_settings

        max_values = get_settings().max_values
    builder = HistogramBuilder(lower=grid.lower, upper=grid.upper, granularity=grid.granularity)
    skipped = 0
    read = 0  # values and nulls
    for path in files:
        room = max_values - read
        for batch in _batches(
            kind, path, column, room=room, limit=max_values, max_page_bytes=max_page_bytes
        ):
            array = batch.column(0)
            read += len(array)
            if read > max_values:
                raise IngestError(
                    f"{path}: more than {max_values} values in all (column {column!r}, "
                    "missing values included; DPQUANT_MAX_VALUES)"
                )
            if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
                raise IngestError(f"{path}: column {column!r} is not numeric")
            values = array.to_numpy(zero_copy_only=False).astype(np.float64)
            if array.null_count:
                skipped += int(array.null_count)
                values = values[~array.is_null().to_numpy(zero_copy_only=False)]
            if not np.isfinite(values).all():
                raise IngestError(f"{path}: column {column!r} holds NaN or infinite values")
            builder.add_values(values)
    cells, counts = builder.result()
    return Counted(cells, counts, builder.n, builder.n_outside, skipped)


# --------------------------------------------------------------------------- server


def make_client(server: str, api_key: str) -> Any:
    """An HTTP client for the server (tests substitute an in-process one)."""
    import httpx

    return httpx.Client(
        base_url=server.rstrip("/"),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=httpx.Timeout(30.0, read=600.0),
    )


def _check(response: Any, what: str) -> Any:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", "")
        except ValueError:
            detail = ""
        raise IngestError(f"{what}: HTTP {response.status_code} {detail}".rstrip())
    return response.json()


def fetch_grid(client: Any, dataset_id: str) -> Grid:
    """The dataset's public bounds and granularity."""
    return fetch_dataset(client, dataset_id)[0]


def fetch_dataset(client: Any, dataset_id: str) -> tuple[Grid, str | None, int]:
    """The dataset's public grid, its privacy unit column (or None) and max_rows_per_unit.
    A table of several columns takes rows, not histograms: refused here."""
    ds = _check(client.get(f"/v1/datasets/{dataset_id}"), "reading the dataset")
    if len(ds.get("columns") or []) > 1:
        raise IngestError("the dataset is a table of several columns: upload its rows instead")
    grid = Grid(float(ds["lower"]), float(ds["upper"]), float(ds["granularity"]))
    return grid, ds.get("privacy_unit"), int(ds.get("max_rows_per_unit") or 1)


def pair_chunks(counted: Counted, pairs_per_chunk: int = 1 << 16) -> Iterator[bytes]:
    """The histogram as little-endian int64 (cell, count) pairs, in chunks."""
    for start in range(0, counted.cells.size, pairs_per_chunk):
        block = np.empty((min(pairs_per_chunk, counted.cells.size - start), 2), dtype="<i8")
        block[:, 0] = counted.cells[start : start + pairs_per_chunk]
        block[:, 1] = counted.counts[start : start + pairs_per_chunk]
        yield block.tobytes()


def upload(
    client: Any, dataset_id: str, counted: Counted, bounded: tuple[int, int, int] | None = None
) -> Any:
    """PUT the histogram (counts only) and return the server's view of the dataset.
    ``bounded``: (k, units, rows dropped) of a privacy-unit bounding done here."""
    if counted.cells.size == 0:
        raise IngestError("no values found (all missing?)")
    params: dict[str, int] = {"n_outside": counted.n_outside, "values_skipped": counted.skipped}
    if bounded is not None:
        params.update(rows_per_unit=bounded[0], units=bounded[1], rows_dropped=bounded[2])
    return _check(
        client.put(
            f"/v1/datasets/{dataset_id}/histogram",
            params=params,
            content=pair_chunks(counted),
            headers={"content-type": "application/octet-stream"},
        ),
        "uploading the histogram",
    )
