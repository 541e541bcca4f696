"""The local engine, the file discovery shared by both engines, and the upload client."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
from app.datasets.upload import MAX_PARQUET_PAGE_BYTES, MISSING_MARKERS, PARQUET_BUFFER_BYTES

IntArray = NDArray[np.int64]
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
CSV_SUFFIXES = (".csv",)
#: Rows per record batch read by the local engine.
BATCH_ROWS = 1 << 18


def csv_null_values() -> list[str]:
    """The CSV cells read as missing: the server's :data:`MISSING_MARKERS` in the cases
    writers use (pyarrow compares exactly)."""
    out: set[str] = set()
    for marker in MISSING_MARKERS:
        out |= {marker, marker.upper(), marker.capitalize(), marker.title()}
    out |= {"NaN", "-NaN", "N/A", "#N/A"}
    return sorted(out)


class KeySink(Protocol):
    """Where the local engines send each kept row's key (:class:`app.ingest.groups.KeyCounter`)."""

    name: str

    def codes(self, batch: Any, path: str) -> IntArray: ...

    def add_values(self, codes: IntArray, block: NDArray[np.float64]) -> None: ...

    def add_cells(self, codes: IntArray, cells: list[IntArray]) -> None: ...


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
    kind: str, path: str, columns: list[str], *, room: int, limit: int, max_page_bytes: int,
    text: Sequence[str] = (),
) -> Iterator[Any]:  # fmt: skip
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if kind == "parquet":
            with open(path, "rb") as file:
                parquet = pq.ParquetFile(file, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
                for column in [*columns, *text]:
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
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=[*columns, *text])
        else:
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=[*columns, *text],
                    column_types={
                        **dict.fromkeys(columns, pa.float64()),
                        **dict.fromkeys(text, pa.string()),
                    },
                    null_values=csv_null_values(),
                ),
            )
            yield from reader
    except KeyError:
        raise IngestError(f"{path}: no column {_names(columns)}") from None
    except (pa.ArrowException, OSError) as exc:
        # Arrow messages can quote a cell; report the class only.
        raise IngestError(
            f"{path}: cannot read column {_names(columns)} ({type(exc).__name__})"
        ) from None


def _names(columns: list[str]) -> str:
    return " or ".join(map(repr, columns))


def numeric_block(batch: Any, columns: list[str], path: str) -> tuple[Any, NDArray[np.bool_]]:
    """A record batch's columns as one (rows, columns) float64 array, and the mask of the
    rows with no missing cell (the others are skipped whole). NaN or infinite values in a
    kept row are an error."""
    import pyarrow as pa

    block = np.empty((batch.num_rows, len(columns)), dtype=np.float64)
    present = np.ones(batch.num_rows, dtype=bool)
    for i, column in enumerate(columns):
        array = batch.column(batch.schema.get_field_index(column))
        if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
            raise IngestError(f"{path}: column {column!r} is not numeric")
        block[:, i] = array.to_numpy(zero_copy_only=False).astype(np.float64)
        if array.null_count:
            present &= ~array.is_null().to_numpy(zero_copy_only=False)
    for i, column in enumerate(columns):
        if not np.isfinite(block[present, i]).all():
            raise IngestError(f"{path}: column {column!r} holds NaN or infinite values")
    return block, present


def count_local(
    kind: str,
    files: list[str],
    column: str,
    grid: Grid,
    *,
    max_values: int | None = None,
    max_page_bytes: int = MAX_PARQUET_PAGE_BYTES,
) -> Counted:
    """The histogram of ``column`` over ``files`` (:func:`count_columns_local` of one)."""
    (counted,) = count_columns_local(
        kind, files, [column], [grid], max_values=max_values, max_page_bytes=max_page_bytes
    )
    return counted


def count_columns_local(
    kind: str,
    files: list[str],
    columns: list[str],
    grids: list[Grid],
    *,
    max_values: int | None = None,
    max_page_bytes: int = MAX_PARQUET_PAGE_BYTES,
    keys: KeySink | None = None,
) -> list[Counted]:
    """The histogram of each of ``columns`` (on its grid) over ``files``, streamed with
    pyarrow (memory O(batch + cells)); with ``keys``, also its per-key counts (of the key
    column ``keys.name``, :mod:`app.ingest.groups`).

    A row with a missing cell (empty CSV cell, Parquet null) in any of ``columns`` is
    skipped whole and counted, so every column counts the same rows; NaN or infinite values
    are an error. Rows of all files together (skipped ones included) count against
    ``max_values`` (default ``DPQUANT_MAX_VALUES``, as on the server): a Parquet file is
    refused from its footer before any of it is read, a CSV file as soon as it crosses the
    limit. A Parquet page above ``max_page_bytes`` is refused from the page headers, before
    any data page is read (as the server does with uploads:
    :data:`app.datasets.upload.MAX_PARQUET_PAGE_BYTES`).
    """
    if max_values is None:
        from app.core.config import get_settings

        max_values = get_settings().max_values
    builders = [
        HistogramBuilder(lower=g.lower, upper=g.upper, granularity=g.granularity) for g in grids
    ]
    skipped = 0
    read = 0  # rows, skipped ones included
    for path in files:
        room = max_values - read
        text = [] if keys is None else [keys.name]
        for batch in _batches(
            kind, path, columns, room=room, limit=max_values, max_page_bytes=max_page_bytes,
            text=text,
        ):  # fmt: skip
            read += batch.num_rows
            if read > max_values:
                raise IngestError(
                    f"{path}: more than {max_values} values in all (column "
                    f"{_names(columns)}, missing values included; DPQUANT_MAX_VALUES)"
                )
            block, present = numeric_block(batch, columns, path)
            codes = None if keys is None else keys.codes(batch, path)
            if not present.all():
                skipped += int(present.size - present.sum())
                block = block[present]
                codes = None if codes is None else codes[present]
            for i, builder in enumerate(builders):
                builder.add_values(np.ascontiguousarray(block[:, i]))
            if keys is not None and codes is not None:
                keys.add_values(codes, block)
    out = []
    for builder in builders:
        cells, counts = builder.result()
        out.append(Counted(cells, counts, builder.n, builder.n_outside, skipped))
    return out


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


@dataclass(frozen=True)
class Target:
    """What ingest needs to know of a dataset: its numeric columns and their grids (in
    declared order), its privacy unit column (or None) and max_rows_per_unit."""

    columns: tuple[tuple[str, Grid], ...]
    unit: str | None
    k: int


def fetch_grid(client: Any, dataset_id: str) -> Grid:
    """The public grid of the dataset's first numeric column."""
    return fetch_dataset(client, dataset_id).columns[0][1]


def fetch_dataset(client: Any, dataset_id: str) -> Target:
    """The dataset's public schema, as :class:`Target`."""
    ds = _check(client.get(f"/v1/datasets/{dataset_id}"), "reading the dataset")
    columns = tuple(
        (c["name"], Grid(float(c["lower"]), float(c["upper"]), float(c["granularity"])))
        for c in ds.get("columns") or []
        if c.get("type") in ("numeric", "integer")
    ) or (("value", Grid(float(ds["lower"]), float(ds["upper"]), float(ds["granularity"]))),)
    return Target(columns, ds.get("privacy_unit"), int(ds.get("max_rows_per_unit") or 1))


def pair_chunks(counted: Counted, pairs_per_chunk: int = 1 << 16) -> Iterator[bytes]:
    """The histogram as little-endian int64 (cell, count) pairs, in chunks."""
    for start in range(0, counted.cells.size, pairs_per_chunk):
        block = np.empty((min(pairs_per_chunk, counted.cells.size - start), 2), dtype="<i8")
        block[:, 0] = counted.cells[start : start + pairs_per_chunk]
        block[:, 1] = counted.counts[start : start + pairs_per_chunk]
        yield block.tobytes()


def plan_columns(
    target: Target, column: str | None, columns: list[str] | None
) -> tuple[list[str], list[str], list[Grid]]:
    """(file columns to read, dataset columns they fill, grids) for ``--column`` (the file
    column feeding a one-column dataset; default: the column's own name) or ``--columns``
    (a table's numeric columns, read from file columns of the same names; default: all of
    them, and all of them are needed, since a table's columns hold the same rows)."""
    names = [name for name, _ in target.columns]
    grids = [grid for _, grid in target.columns]
    if column is not None and columns is not None:
        raise IngestError("give --column (one-column dataset) or --columns (table), not both")
    if column is not None:
        if len(names) > 1:
            raise IngestError(
                f"the dataset is a table of {len(names)} numeric columns: use --columns "
                f"{','.join(names)} (or leave it out)"
            )
        return [column], names, grids
    if columns is None:
        return list(names), names, grids
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise IngestError(f"not a numeric column of the dataset: {', '.join(map(repr, unknown))}")
    if len(set(columns)) != len(columns):
        raise IngestError("--columns names a column twice")
    missing = [c for c in names if c not in columns]
    if missing:
        raise IngestError(
            f"--columns misses {', '.join(map(repr, missing))}: a table's numeric columns "
            "hold the same rows and are uploaded together"
        )
    order = [names.index(c) for c in columns]
    return list(columns), list(columns), [grids[i] for i in order]


def section_chunks(counted: list[Counted]) -> Iterator[bytes]:
    """Every column's histogram as one section: its int64 pair count, then its pairs."""
    for one in counted:
        yield np.int64(one.cells.size).astype("<i8").tobytes()
        yield from pair_chunks(one)


def upload(
    client: Any,
    dataset_id: str,
    counted: Counted | list[Counted],
    bounded: tuple[int, int, int] | None = None,
    columns: list[str] | None = None,
) -> Any:
    """PUT the histograms (counts only) and return the server's view of the dataset.

    One :class:`Counted` (or a list of one): the one-column body. Several: one section per
    column of ``columns``, in that order (a table's columns are replaced together).
    ``bounded``: (k, units, rows dropped) of a privacy-unit bounding done here."""
    parts = counted if isinstance(counted, list) else [counted]
    if any(one.cells.size == 0 for one in parts):
        raise IngestError("no values found (all missing?)")
    params: list[tuple[str, int | str]] = []
    if len(parts) > 1:
        assert columns is not None and len(columns) == len(parts)
        params += [("column", name) for name in columns]
    params += [("n_outside", one.n_outside) for one in parts]
    params.append(("values_skipped", parts[0].skipped))
    if bounded is not None:
        params += [("rows_per_unit", bounded[0]), ("units", bounded[1])]
        params.append(("rows_dropped", bounded[2]))
    body = pair_chunks(parts[0]) if len(parts) == 1 else section_chunks(parts)
    return _check(
        client.put(
            f"/v1/datasets/{dataset_id}/histogram",
            params=params,
            content=body,
            headers={"content-type": "application/octet-stream"},
        ),
        "uploading the histogram",
    )
