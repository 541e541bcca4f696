"""Dataset upload endpoints: values (one column, or a table's rows) and grid histograms."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Literal

import anyio.from_thread
import numpy as np
from fastapi import APIRouter, Query, Request
from pydantic import Field

from app.api.deps import AdminDep, SessionDep
from app.api.http import DecimalJSONRoute
from app.api.routes.datasets import present
from app.codec.histogram import TooManyCells
from app.core.errors import DpquantError, error_responses, invalid
from app.core.principal import Principal
from app.datasets import groups, service, units, upload
from app.datasets.histogram_upload import (
    PairSink,
    read_histogram_json,
    read_histogram_octet,
    read_sections_json,
    read_sections_octet,
)
from app.datasets.models import Dataset
from app.datasets.schemas import MAX_COLUMNS, DatasetAdmin, DatasetPublic

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], route_class=DecimalJSONRoute)


class ByteCounter:
    """Counts the bytes of a chunk stream as it passes (for the audit log: size only)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.total += len(chunk)
            yield chunk


def request_chunks(request: Request) -> Iterator[bytes]:
    """The request body as it arrives, read from a worker thread (sync endpoints only).

    Each chunk is pulled from the ASGI receive channel on the event loop; nothing is
    buffered beyond the chunk the server handed over, so the body never sits in memory.
    """
    stream = request.stream()

    async def next_chunk() -> bytes | None:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None

    while True:
        chunk = anyio.from_thread.run(next_chunk)
        if chunk is None:
            return
        yield chunk


def _declared_too_large(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise upload.too_large(limit)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


# One content type per operation in the document: client generators cannot dispatch one
# operation over several bodies (openapi-python-client emits ``isinstance(body, list[float])``).
# CSV and float64 bytes are accepted all the same; the description and x-also-accepts say so.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The values as a JSON array of numbers. The same operation also accepts "
        "`text/csv` and `application/vnd.apache.parquet` (pick the column with `?column=`) and "
        "`application/octet-stream` (little-endian float64 bytes), listed in `x-also-accepts`. "
        "Streamed: any size up to `DPQUANT_MAX_UPLOAD_BYTES`.",
        "content": {
            "application/json": {"schema": {"type": "array", "items": {"type": "number"}}},
        },
        "x-also-accepts": [
            "text/csv",
            "application/octet-stream",
            "application/vnd.apache.parquet",
        ],
    }
}

HISTOGRAM_BODY = {
    "requestBody": {
        "required": True,
        "description": 'Grid histogram: `{"cells": [...], "counts": [...]}` (JSON, up to '
        "`DPQUANT_MAX_BODY_BYTES`) or little-endian int64 pairs (cell, count), 16 bytes each "
        "(octet-stream, streamed, up to `DPQUANT_MAX_UPLOAD_BYTES`). Cells lie in [0, K] "
        "(grid point lower + k*granularity), counts >= 1; repeated cells are summed. With "
        "`?column=` (required for a table of several numeric columns): "
        '`{"<column>": {"cells": [...], "counts": [...]}, ...}` in JSON, or per named column, '
        "in order, an int64 pair count followed by its pairs in octet-stream.",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "cells": {"type": "array", "items": {"type": "integer"}},
                        "counts": {"type": "array", "items": {"type": "integer"}},
                    },
                    "required": ["cells", "counts"],
                }
            },
        },
        # One content type per operation for client generators; the binary form is accepted
        # all the same (and is what `dpquant ingest` sends).
        "x-also-accepts": ["application/octet-stream"],
    }
}

ColumnQuery = Annotated[
    str | None, Query(max_length=200, description="Column name (CSV and Parquet uploads)")
]
HeaderQuery = Annotated[
    bool,
    Query(
        description="CSV: whether the first line names the columns (default). Without a "
        "header row (`false`), `?column=` is the column's position from 1 (default 1); "
        "one-column datasets only.",
    ),
]
MissingQuery = Annotated[
    Literal["error", "skip"],
    Query(
        description="Empty CSV cells / Parquet nulls: `error` (422 naming the first such row) "
        "or `skip` (skipped and counted in `values_skipped`)."
    ),
]


def _receive_values(
    request: Request,
    session: SessionDep,
    principal: Principal,
    dataset_id: uuid.UUID,
    column: str | None,
    missing: str,
    append: bool,
    header: bool = True,
) -> DatasetPublic:
    settings = request.app.state.settings
    _declared_too_large(request, settings.max_upload_bytes)
    dataset = service.get_visible(session, principal=principal, dataset_id=dataset_id)
    service.ensure_writable(dataset, append=append)  # early: a body that cannot be stored
    media_type = _media_type(request)
    if not header and media_type != upload.MEDIA_CSV:
        raise invalid("query.header", "applies to CSV uploads only")
    if dataset.privacy_unit is not None or len(dataset.columns) > 1:
        if not header:
            raise invalid("query.header", "a table's CSV names its columns in a header row")
        return _receive_table(
            request, session, principal, dataset, media_type, column, missing, append
        )
    if media_type not in upload.VALUE_MEDIA_TYPES:
        raise upload.unsupported(upload.VALUE_MEDIA_TYPES)
    if not header:
        column = column or "1"
        if not column.isdigit() or not 1 <= int(column) <= 10_000:
            raise invalid(
                "query.column", "without a header row, the column is its position (1, 2, ...)"
            )
    if media_type in (upload.MEDIA_CSV, upload.MEDIA_PARQUET) and not column:
        raise invalid("query.column", f"is required for {media_type} uploads")
    already = dataset.n or 0 if append else 0
    builder = service.new_builder(dataset, max_cells=settings.max_cells)
    # End the read-only transaction: no connection is held while the body streams in.
    session.commit()
    sink = upload.ValueSink(builder, max_values=settings.max_values, already=already)
    counted = ByteCounter(request_chunks(request))
    try:
        stats = upload.read_values(
            upload.limited(iter(counted), settings.max_upload_bytes),
            sink,
            media_type=media_type,
            column=column,
            skip_missing=missing == "skip",
            header=header,
        )
        histogram = builder.result()
    except TooManyCells as exc:
        raise DpquantError(413, "payload_too_large", str(exc)) from None
    dataset = service.store_histogram(
        session,
        principal=principal,
        dataset_id=dataset_id,
        histogram=histogram,
        n_outside=builder.n_outside,
        skipped=stats.skipped,
        append=append,
        max_values=settings.max_values,
        max_cells=settings.max_cells,
        upload="values",
        media_type=media_type,
        size_bytes=counted.total,
    )
    return present(session, dataset, principal)


def _appendable(dataset: Dataset, append: bool) -> None:
    """409 on an append to a privacy-unit dataset whose rows a sender bounded: the server has
    no per-unit counts to keep each unit at k rows across the append."""
    if append and dataset.bounded_by == "sender":
        raise DpquantError(
            409,
            "unit_counts_unknown",
            "this dataset's values came from a histogram bounded by its sender (dpquant "
            "ingest): the server keeps no per-unit counts, so an append could take a unit past "
            "max_rows_per_unit; replace the values (before the first release) or ingest all "
            "rows again",
        )


def _receive_table(
    request: Request,
    session: SessionDep,
    principal: Principal,
    dataset: Dataset,
    media_type: str,
    column: str | None,
    missing: str,
    append: bool,
) -> DatasetPublic:
    """A table (several columns) or a dataset with a privacy unit: CSV rows carrying every
    declared column and the unit column (:mod:`app.datasets.units`). With a unit the rows
    are bounded to k per unit in PostgreSQL, all in one transaction with the store."""
    settings = request.app.state.settings
    _appendable(dataset, append)
    table_media = (upload.MEDIA_CSV, upload.MEDIA_JSON, upload.MEDIA_PARQUET)
    if media_type not in table_media:
        raise upload.unsupported(table_media)
    numeric = [c for c in dataset.columns if c.numeric]
    sources = [c.name for c in numeric]
    if column is not None:
        if len(numeric) > 1:
            raise invalid(
                "query.column", "is not used for tables: the CSV header names the columns"
            )
        sources = [column]  # the CSV column feeding the only numeric column
    spec = units.TableSpec(
        numeric=tuple(sources),
        categorical=tuple(
            (c.name, None if c.keys is None else frozenset(c.keys))
            for c in dataset.columns
            if not c.numeric
        ),
        unit=dataset.privacy_unit,
    )
    dataset_id, key, k = dataset.id, dataset.unit_key, dataset.max_rows_per_unit
    builders = [service.column_builder(c, max_cells=settings.max_cells) for c in numeric]
    names = [c.name for c in numeric]
    sink = groups.sink_for(dataset.columns, max_cells=settings.max_cells)
    session.commit()
    counted = ByteCounter(request_chunks(request))
    body = upload.limited(iter(counted), settings.max_upload_bytes)
    if media_type == upload.MEDIA_CSV:
        records, where = units.csv_records(body, spec), "row"
    elif media_type == upload.MEDIA_PARQUET:
        records, where = units.parquet_records(body, spec), "row"
    else:
        records, where = units.json_records(body, spec), "index"
    stored_units: int | None = None
    try:
        if spec.unit is None:

            def direct(_: list[bytes] | None, block: np.ndarray, codes: np.ndarray) -> None:
                for i, builder in enumerate(builders):
                    builder.add_values(np.ascontiguousarray(block[:, i]))
                sink.add(block, codes)

            stats = units.read_table(
                records, spec, direct, key=None, skip_missing=missing == "skip",
                max_values=settings.max_values, where=where, key_codes=sink.keys,
            )  # fmt: skip
            stats.kept = stats.rows
        else:
            conn = service.driver(session)  # a new transaction: the staged rows live in it
            stats = units.read_table(
                records, spec, units.stage(conn, len(builders), len(sink.keys)), key=key,
                skip_missing=missing == "skip", max_values=settings.max_values, where=where,
                key_codes=sink.keys,
            )  # fmt: skip
            # lock the dataset row before reading the units' stored counts: appends serialise
            locked = service.get_visible(
                session, principal=principal, dataset_id=dataset_id, for_update=True
            )
            service.ensure_writable(locked, append=append)
            _appendable(locked, append)
            stored_units = units.bound_rows(
                conn, builders, stats, dataset_id=dataset_id, k=k, append=append, groups=sink
            )
        histograms = [b.result() for b in builders]
        grouped = sink.histograms()
    except TooManyCells as exc:
        raise DpquantError(413, "payload_too_large", str(exc)) from None
    dataset = service.store_histogram(
        session,
        principal=principal,
        dataset_id=dataset_id,
        histogram=histograms[0],
        n_outside=builders[0].n_outside,
        skipped=stats.skipped,
        append=append,
        max_values=settings.max_values,
        max_cells=settings.max_cells,
        upload="values",
        media_type=media_type,
        size_bytes=counted.total,
        rows_dropped=None if stored_units is None else stats.dropped,
        units=stored_units,
        bounded_by=None if stored_units is None else "server",
        column=names[0],
        more={
            name: (h, b.n_outside)
            for name, h, b in zip(names[1:], histograms[1:], builders[1:], strict=True)
        },
        groups=grouped if sink.active else None,
    )
    return present(session, dataset, principal)


@router.put(
    "/{dataset_id}/values",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=UPLOAD_BODY,
    summary="Upload (replace) a dataset's values",
)
def upload_values(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,  # before the body: unauthenticated uploads are never read
    column: ColumnQuery = None,
    missing: MissingQuery = "error",
    header: HeaderQuery = True,
) -> DatasetPublic:
    """Replace the values atomically; any bad row rejects the whole upload (422).

    The body is streamed: each value is clamped to [lower, upper] and counted in its grid
    cell as it arrives; only the histogram is stored.
    """
    return _receive_values(
        request, session, principal, dataset_id, column, missing, append=False, header=header
    )


@router.post(
    "/{dataset_id}/values",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=UPLOAD_BODY,
    summary="Append values to a dataset",
)
def append_values(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,
    column: ColumnQuery = None,
    missing: MissingQuery = "error",
    header: HeaderQuery = True,
) -> DatasetPublic:
    """Add values to the stored ones (counts merge); same formats and rules as the upload."""
    return _receive_values(
        request, session, principal, dataset_id, column, missing, append=True, header=header
    )


@router.put(
    "/{dataset_id}/histogram",
    response_model=DatasetAdmin,
    responses=error_responses(401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=HISTOGRAM_BODY,
    summary="Upload (replace) a dataset's grid histogram",
)
def upload_histogram(
    dataset_id: uuid.UUID,
    request: Request,
    session: SessionDep,
    principal: AdminDep,
    column: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200)]] | None,
        Query(
            max_length=MAX_COLUMNS,
            description="The numeric columns the body holds histograms of, in the body's "
            "order (repeat the parameter). Required for a table of several numeric columns, "
            "which must name every one: a table's columns hold the same rows. With it, the "
            "octet-stream body is one section per column (an int64 pair count, then the "
            "pairs) and the JSON body an object keyed by column name.",
        ),
    ] = None,
    n_outside: Annotated[
        list[Annotated[int, Field(ge=0, le=2**62)]] | None,
        Query(
            max_length=MAX_COLUMNS,
            description="Values outside [lower, upper] before clamping, if known: one per "
            "column, in the order of `column`.",
        ),
    ] = None,
    values_skipped: Annotated[
        int, Query(ge=0, le=2**62, description="Rows with missing values the sender skipped.")
    ] = 0,
    rows_per_unit: Annotated[
        int | None,
        Query(
            ge=1,
            le=10_000,
            description="For a dataset with a privacy_unit: the sender attests that it kept at "
            "most this many rows per unit (must equal max_rows_per_unit; dpquant ingest does "
            "the bounding). Appends are then refused (no per-unit counts on the server).",
        ),
    ] = None,
    units_kept: Annotated[
        int | None,
        Query(alias="units", ge=0, le=2**62, description="Units the sender kept (admin figure)."),
    ] = None,
    rows_dropped: Annotated[
        int | None,
        Query(ge=0, le=2**62, description="Rows the sender's bounding dropped (admin figure)."),
    ] = None,
) -> DatasetPublic:
    """Replace the values by (cell, count) pairs computed elsewhere (e.g. `dpquant ingest`)."""
    settings = request.app.state.settings
    dataset = service.get_visible(session, principal=principal, dataset_id=dataset_id)
    service.ensure_writable(dataset)
    numeric = [c.name for c in dataset.columns if c.numeric]
    names = _histogram_columns(numeric, column)
    if n_outside is not None and len(n_outside) != len(names):
        raise invalid("query.n_outside", f"give one per column ({len(names)}), or none")
    if dataset.privacy_unit is not None and rows_per_unit != dataset.max_rows_per_unit:
        raise DpquantError(
            409,
            "privacy_unit_needs_rows",
            "this dataset has a privacy_unit: upload its rows with their unit column "
            "(PUT or POST /values: CSV, JSON objects or Parquet), or a histogram that "
            "dpquant ingest bounded to max_rows_per_unit rows per unit (?rows_per_unit=k)",
        )
    if dataset.privacy_unit is None and (rows_per_unit, units_kept, rows_dropped) != (
        None,
        None,
        None,
    ):
        raise invalid("query.rows_per_unit", "this dataset has no privacy_unit")
    media_type = _media_type(request)
    if media_type not in upload.HISTOGRAM_MEDIA_TYPES:
        raise upload.unsupported(upload.HISTOGRAM_MEDIA_TYPES)
    limit = (
        settings.max_body_bytes if media_type == upload.MEDIA_JSON else settings.max_upload_bytes
    )
    _declared_too_large(request, limit)
    by_name = {c.name: c for c in dataset.columns}
    sinks = [
        PairSink(
            service.column_builder(by_name[name], max_cells=settings.max_cells),
            max_values=settings.max_values,
            label=f"column {name!r}" if column is not None else "",
        )
        for name in names
    ]
    session.commit()  # no connection is held while the body streams in
    counted = ByteCounter(request_chunks(request))
    chunks = upload.limited(iter(counted), limit)
    try:
        if column is None and media_type == upload.MEDIA_JSON:
            read_histogram_json(b"".join(chunks), sinks[0])
        elif column is None:
            read_histogram_octet(chunks, sinks[0])
        elif media_type == upload.MEDIA_JSON:
            read_sections_json(b"".join(chunks), dict(zip(names, sinks, strict=True)))
        else:
            read_sections_octet(chunks, sinks)
        histograms = [sink.builder.result() for sink in sinks]
    except TooManyCells as exc:
        raise DpquantError(413, "payload_too_large", str(exc)) from None
    totals = {sink.builder.n for sink in sinks}
    if len(totals) > 1:
        raise invalid("body", "every column must count the same rows: the columns' totals differ")
    outside: list[int | None] = [None] * len(names) if n_outside is None else list(n_outside)
    if any(o is not None and o > sinks[0].builder.n for o in outside):
        raise invalid("query.n_outside", "must not exceed the number of values")
    dataset = service.store_histogram(
        session,
        principal=principal,
        dataset_id=dataset_id,
        histogram=histograms[0],
        n_outside=outside[0],
        skipped=values_skipped,
        append=False,
        max_values=settings.max_values,
        max_cells=settings.max_cells,
        upload="histogram",
        media_type=media_type,
        size_bytes=counted.total,
        rows_dropped=rows_dropped,
        units=units_kept,
        bounded_by="sender" if rows_per_unit is not None else None,
        column=names[0],
        more=dict(zip(names[1:], zip(histograms[1:], outside[1:], strict=True), strict=True)),
    )
    return present(session, dataset, principal)


def _histogram_columns(numeric: list[str], named: list[str] | None) -> list[str]:
    """The numeric columns a histogram upload replaces, in the body's order: all of them
    (a table's columns hold the same rows), each named once."""
    if named is None:
        if len(numeric) > 1:
            raise invalid(
                "query.column",
                "is required for a table of several numeric columns: name each of them "
                f"({', '.join(numeric)}), in the order of the body's sections",
            )
        return numeric
    for name in named:
        if name not in numeric:
            raise invalid("query.column", f"{name!r} is not a numeric column of the dataset")
    if len(set(named)) != len(named):
        raise invalid("query.column", "names a column twice")
    missing = [name for name in numeric if name not in named]
    if missing:
        raise invalid(
            "query.column",
            f"misses {', '.join(map(repr, missing))}: a histogram upload replaces every "
            "numeric column at once (they hold the same rows)",
        )
    return list(named)
