"""Table uploads (several columns, a privacy unit): at most k rows per unit, across appends.

A table (several declared columns) or a dataset that names a ``privacy_unit`` column takes
its rows as CSV with a header row that carries every declared column (and the unit column).
Each row's unit id is kept only as HMAC-SHA256 under the dataset's random ``unit_key`` (16
bytes of it), never in clear, and never reaches a log, an error or a response (errors name
the row, never a value or an id).

Contribution bounding runs in PostgreSQL, so memory stays bounded whatever the upload's size
(the bounding needs every row of a unit together): the rows stream into a temporary table
with a 63-bit sort key from the CSPRNG (:func:`app.mechanisms.rng.make_rng`), and each unit
keeps its ``k - already`` rows of smallest key (``already``: the rows the stored values keep
of it, from ``dataset_unit``; 0 on a replace), a uniformly random subset of its rows. The
kept rows feed the columns' histogram builders through a server-side cursor;
``dataset_unit`` is updated in the same transaction, after the dataset row is locked, so
concurrent appends serialise and a unit never exceeds k. Without a unit column every row is
its own unit: the rows go straight to the builders.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ijson
import numpy as np
import psycopg
from numpy.typing import NDArray

from app.codec.histogram import HistogramBuilder
from app.core.errors import DpquantError, invalid
from app.datasets.groups import GroupSink, KeyCodes
from app.datasets.parquet_scan import ParquetRefused, check_parquet_pages, parquet_leaf
from app.datasets.upload import (
    BATCH_VALUES,
    MAX_PARQUET_PAGE_BYTES,
    csv_with_header,
    missing_cell,
    spooled_parquet,
    too_many_values,
)
from app.mechanisms.rng import make_rng

#: Bytes of HMAC-SHA256 kept per unit id (2^-128 collision odds per pair).
UNIT_HASH_BYTES = 16


def unit_hash(key: bytes, unit: str) -> bytes:
    """The stored form of a unit id: HMAC-SHA256 under the dataset's key, truncated."""
    return hmac.new(key, unit.encode("utf-8"), hashlib.sha256).digest()[:UNIT_HASH_BYTES]


def _bad(problem: str) -> DpquantError:
    return invalid("body", problem)


@dataclass
class BoundedUpload:
    """What a bounded upload read and kept (admin-only figures)."""

    rows: int = 0
    skipped: int = 0
    kept: int = 0

    @property
    def dropped(self) -> int:
        return self.rows - self.kept


@dataclass(frozen=True)
class TableSpec:
    """What a table upload reads: the CSV header names feeding the numeric columns (in
    declared order), the categorical columns (name, public keys or None) and the unit
    column's header name (None: each row is its own unit)."""

    numeric: tuple[str, ...]
    categorical: tuple[tuple[str, frozenset[str] | None], ...] = ()
    unit: str | None = None


#: A batch sink: (unit hashes or None, values rows x numeric columns, key codes rows x
#: categorical columns; -1 for a missing key).
Batch = Callable[[list[bytes] | None, NDArray[np.float64], NDArray[np.int64]], None]


#: One record of a table upload: its position (CSV row from 1 after the header, JSON index
#: from 0) and its cells: the unit's (if any), the numeric columns' and the categorical
#: columns', in that order; a missing cell is None.
Record = tuple[int, list[object]]


def csv_records(chunks: Iterable[bytes], spec: TableSpec) -> Iterator[Record]:
    """A CSV with a header row carrying every declared column (and the unit column)."""
    reader, names = csv_with_header(chunks)
    for name in _wanted(spec):
        if name not in names:
            raise _bad(f"the CSV header lacks the declared column {name!r}")
    if spec.unit is not None and spec.unit not in names:
        raise _bad("the CSV header lacks the dataset's privacy_unit column")
    order = [*([] if spec.unit is None else [spec.unit]), *_wanted(spec)]
    at = [names.index(name) for name in order]
    last = max(at)
    # numeric cells holding a missing-value marker (NA, NaN, null, ...) are missing, like
    # empty ones; a categorical key or a unit id "NA" is a value
    numeric = range(int(spec.unit is not None), int(spec.unit is not None) + len(spec.numeric))
    row_number = 0
    try:
        for row_number, row in enumerate(reader, start=1):
            if not row:
                continue
            if last >= len(row):
                raise _bad(f"row {row_number}: missing cell")
            cells: list[object] = [row[i].strip() or None for i in at]
            for j in numeric:
                cell = cells[j]
                if isinstance(cell, str) and missing_cell(cell) is not None:
                    cells[j] = None
            yield row_number, cells
    except csv.Error:
        raise _bad(f"row {row_number + 1}: malformed CSV") from None


class _ChunkReader:
    """A file-like ``read(n)`` over an iterator of byte chunks (what ijson reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._pending) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._pending += chunk
        if size < 0:
            size = len(self._pending)
        out, self._pending = self._pending[:size], self._pending[size:]
        return out


#: Deepest nesting a JSON table upload may have: the array, its objects, and values nested
#: inside columns that are not declared (read and dropped, never built).
MAX_JSON_DEPTH = 64
_NOT_SCALAR = object()  # a declared column's value that is an array or an object


def json_records(chunks: Iterable[bytes], spec: TableSpec) -> Iterator[Record]:
    """A JSON array of objects, one per row, keyed by column name; a declared column missing
    from an object is an error naming it. Read from ijson's basic event stream (no prefix
    strings, which grow with the depth): only the declared columns' scalars are kept, one
    object at a time, and nesting beyond :data:`MAX_JSON_DEPTH` is refused."""
    order = [*([] if spec.unit is None else [spec.unit]), *_wanted(spec)]
    wanted = set(order)
    index = -1
    depth = 0
    row: dict[str, object] = {}
    key: str | None = None
    try:
        for event, value in ijson.basic_parse(_ChunkReader(chunks), use_float=True):
            if event in ("start_map", "start_array"):
                if depth == 0 and event != "start_array":
                    raise _bad("the body must be a JSON array of objects")
                if depth == 1:
                    index += 1
                    if event != "start_map":
                        raise _bad(f"index {index}: not an object")
                    row, key = {}, None
                elif depth == 2 and key in wanted:
                    row[key] = _NOT_SCALAR
                depth += 1
                if depth > MAX_JSON_DEPTH:
                    raise _bad(f"index {index}: nested too deeply")
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == 1:
                    yield index, _json_cells(row, order, spec, index)
            elif event == "map_key":
                if depth == 2:
                    key = value
            elif depth == 1:
                index += 1
                raise _bad(f"index {index}: not an object")
            elif depth == 2 and key in wanted:
                row[key] = value
            elif depth == 0:
                raise _bad("the body must be a JSON array of objects")
    except ijson.JSONError:
        raise _bad(f"index {index + 1}: malformed JSON (an array of objects is expected)") from None


def _json_cells(
    row: dict[str, object], order: list[str], spec: TableSpec, index: int
) -> list[object]:
    cells: list[object] = []
    for name in order:
        if name not in row:
            if name == spec.unit:
                raise _bad(f"index {index}: lacks the dataset's privacy_unit column")
            raise _bad(f"index {index}: lacks the declared column {name!r}")
        cell = row[name]
        if cell is _NOT_SCALAR:
            cell = [None]  # an array or object: refused as not a number / string / unit
        cells.append(cell)
    return cells


def parquet_records(
    chunks: Iterable[bytes], spec: TableSpec, *, max_page_bytes: int | None = None
) -> Iterator[Record]:
    """A Parquet file carrying every declared column (and the unit column) by name, spooled
    to a temporary file and read one record batch at a time; every page header of the
    columns read is checked first, as for one-column uploads
    (:func:`app.datasets.upload.read_parquet`). Numeric columns must be integer or floating
    point, categorical ones strings, the unit integers or strings."""
    import pyarrow as pa

    bound = MAX_PARQUET_PAGE_BYTES if max_page_bytes is None else max_page_bytes
    order = [*([] if spec.unit is None else [spec.unit]), *_wanted(spec)]
    with spooled_parquet(chunks) as (file, parquet):
        schema, metadata = parquet.schema_arrow, parquet.metadata
        for name in order:
            what = "the dataset's privacy_unit column" if name == spec.unit else repr(name)
            if len(schema.get_all_field_indices(name)) != 1:
                raise _bad(f"the Parquet schema lacks (or repeats) {what}")
            kind = schema.field(name).type
            if name == spec.unit:
                fits = pa.types.is_integer(kind) or pa.types.is_string(kind)
            elif name in spec.numeric:
                fits = pa.types.is_integer(kind) or pa.types.is_floating(kind)
            else:
                fits = pa.types.is_string(kind) or pa.types.is_dictionary(kind)
            leaf = parquet_leaf(parquet, name)
            if not fits or leaf is None:
                raise _bad(f"the Parquet column {what} has the wrong type")
            try:
                check_parquet_pages(file, metadata, leaf, max_page_bytes=bound)
            except ParquetRefused as exc:
                if exc.too_large:
                    raise DpquantError(413, "payload_too_large", str(exc)) from None
                raise _bad(str(exc)) from None
        row = 1
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_VALUES, columns=order):
                columns = [batch.column(i).to_pylist() for i in range(len(order))]
                for offset, cells in enumerate(zip(*columns, strict=True)):
                    yield row + offset, list(cells)
                row += batch.num_rows
        except (pa.ArrowException, OSError):
            raise _bad(f"row {row}: unreadable Parquet data") from None


def _wanted(spec: TableSpec) -> list[str]:
    return [*spec.numeric, *(name for name, _ in spec.categorical)]


def read_table(
    records: Iterable[Record],
    spec: TableSpec,
    on_batch: Batch,
    *,
    key: bytes | None,
    skip_missing: bool,
    max_values: int,
    where: str = "row",
    key_codes: Sequence[KeyCodes] = (),
) -> BoundedUpload:
    """Check and pass on a table upload's records: ``on_batch(unit hashes or None,
    values)`` gets them by blocks, one row of doubles per record (numeric columns in
    declared order). A record with a missing numeric cell is an error naming it, or skipped
    whole with ``skip_missing``; numbers must be finite; a categorical cell must be a string
    and one of the column's public keys when it has them; a unit id must be a non-empty
    string or an integer. ``where`` names positions ("row" or "index"); no message carries
    a cell. ``key_codes``: one per categorical column (in order), coding each row's keys
    for the per-key histograms (:mod:`app.datasets.groups`); none: the keys are checked only."""
    width = len(spec.numeric)
    has_unit = spec.unit is not None
    keysets = [keys for _, keys in spec.categorical]
    stats = BoundedUpload()
    units: list[bytes] = []
    rows: list[float] = []
    codes: list[int] = []
    coded = len(key_codes)

    def flush() -> None:
        block = np.asarray(rows, dtype=np.float64).reshape(-1, width)
        code_block = np.asarray(codes, dtype=np.int64).reshape(block.shape[0], coded)
        on_batch(list(units) if has_unit else None, block, code_block)
        units.clear()
        rows.clear()
        codes.clear()

    for position, cells in records:
        if stats.rows + stats.skipped >= max_values:
            raise too_many_values(max_values)
        here = f"{where} {position}"
        unit = ""
        if has_unit:
            raw = cells[0]
            if isinstance(raw, int) and not isinstance(raw, bool):
                unit = str(raw)
            elif isinstance(raw, str) and raw.strip():
                unit = raw.strip()
            else:
                raise _bad(f"{here}: empty privacy unit (a string or an integer is needed)")
        numbers = cells[int(has_unit) : int(has_unit) + width]
        categorical = cells[int(has_unit) + width :]
        for keys, cell in zip(keysets, categorical, strict=True):
            if cell is not None and not isinstance(cell, str):
                raise _bad(f"{here}: a categorical cell is not a string")
            if keys is not None and cell not in keys:
                raise _bad(f"{here}: a categorical cell is not a declared key")
        if any(v is None for v in numbers):
            if skip_missing:
                stats.skipped += 1
                continue
            raise _bad(f"{here}: empty cell (use ?missing=skip to skip them)")
        for cell in numbers:
            if isinstance(cell, bool) or not isinstance(cell, (str, int, float)):
                raise _bad(f"{here}: not a number")
            try:
                value = float(cell)
            except (ValueError, OverflowError):
                raise _bad(f"{here}: not a number") from None
            if not math.isfinite(value):
                raise _bad(f"{here}: not a finite number")
            rows.append(value)
        for coder, cell in zip(key_codes, categorical, strict=True):
            codes.append(coder.code(cell))
        if has_unit:
            assert key is not None
            units.append(unit_hash(key, unit))
        stats.rows += 1
        if len(rows) >= BATCH_VALUES:
            flush()
    if rows:
        flush()
    return stats


def _names(width: int) -> list[str]:
    return [f"v{i}" for i in range(width)]


def _code_names(coded: int) -> list[str]:
    return [f"g{i}" for i in range(coded)]


def stage(conn: psycopg.Connection[Any], width: int, coded: int = 0) -> Batch:
    """A batch sink that copies rows into the temporary table ``upload_rows`` (unit hash,
    a 63-bit sort key from the CSPRNG, the values, the key codes), inside ``conn``'s open
    transaction."""
    cols = ", ".join(
        [f"{name} double precision NOT NULL" for name in _names(width)]
        + [f"{name} bigint NOT NULL" for name in _code_names(coded)]
    )
    conn.execute(
        f"CREATE TEMPORARY TABLE upload_rows (unit bytea NOT NULL, r bigint NOT NULL, {cols}) "
        "ON COMMIT DROP"
    )
    rng = make_rng(None)
    names = ", ".join(_names(width) + _code_names(coded))
    statement = f"COPY upload_rows (unit, r, {names}) FROM STDIN (FORMAT BINARY)"
    # PostgreSQL's binary COPY rows are fixed-width here: a field count, then each field as
    # a length and its big-endian bytes; a batch is one structured array (no Python per row).
    fields: list[tuple[str, str]] = [("count", ">i2"), ("ulen", ">i4"), ("unit", "S16")]
    fields += [("rlen", ">i4"), ("r", ">i8")]
    for i in range(width):
        fields += [(f"len{i}", ">i4"), (f"v{i}", ">f8")]
    for i in range(coded):
        fields += [(f"glen{i}", ">i4"), (f"g{i}", ">i8")]
    row_type = np.dtype(fields)

    def copy_batch(
        units: list[bytes] | None, values: NDArray[np.float64], codes: NDArray[np.int64]
    ) -> None:
        assert units is not None
        rows = np.empty(len(units), dtype=row_type)
        rows["count"] = 2 + width + coded
        rows["ulen"] = UNIT_HASH_BYTES
        rows["unit"] = np.frombuffer(b"".join(units), dtype="S16")
        rows["rlen"] = 8
        rows["r"] = rng.integers(0, 2**63 - 1, size=len(units), dtype=np.int64)
        for i in range(width):
            rows[f"len{i}"] = 8
            rows[f"v{i}"] = values[:, i]
        for i in range(coded):
            rows[f"glen{i}"] = 8
            rows[f"g{i}"] = codes[:, i]
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.write(_BINARY_HEADER + rows.tobytes() + _BINARY_TRAILER)

    return copy_batch


#: The binary COPY signature, flags and header extension length; the trailer (-1 fields).
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
_BINARY_TRAILER = (-1).to_bytes(2, "big", signed=True)


_KEPT = """
    SELECT {values} FROM (
        SELECT *, row_number() OVER (PARTITION BY unit ORDER BY r) AS rn
        FROM upload_rows
    ) AS c
    LEFT JOIN dataset_unit AS du
      ON %(append)s AND du.dataset_id = %(id)s AND du.unit_hash = c.unit
    WHERE c.rn <= %(k)s - COALESCE(du.rows, 0)
"""

_REPLACE_UNITS = """
    INSERT INTO dataset_unit (dataset_id, unit_hash, rows)
    SELECT %(id)s, unit, LEAST(count(*), %(k)s) FROM upload_rows GROUP BY unit
"""

_APPEND_UNITS = """
    INSERT INTO dataset_unit AS du (dataset_id, unit_hash, rows)
    SELECT %(id)s, unit, LEAST(count(*), %(k)s) FROM upload_rows GROUP BY unit
    ON CONFLICT (dataset_id, unit_hash)
    DO UPDATE SET rows = LEAST(du.rows + EXCLUDED.rows, %(k)s)
"""


def bound_rows(
    conn: psycopg.Connection[Any],
    builders: list[HistogramBuilder],
    stats: BoundedUpload,
    *,
    dataset_id: uuid.UUID,
    k: int,
    append: bool,
    groups: GroupSink | None = None,
) -> int:
    """Keep at most k rows per unit (counting, on an append, the rows already stored), feed
    the kept rows' values to ``builders`` (one per numeric column, in order) and, with their
    key codes, to ``groups``, and record the units' new row counts. The caller holds the
    dataset row lock in ``conn``'s transaction. Returns the number of distinct units now
    stored."""
    params = {"id": dataset_id, "k": k, "append": append}
    width = len(builders)
    coded = 0 if groups is None else len(groups.keys)
    query = _KEPT.format(values=", ".join(f"c.{v}" for v in _names(width) + _code_names(coded)))
    with conn.cursor(name=f"kept_{uuid.uuid4().hex}") as cur:
        cur.itersize = BATCH_VALUES
        cur.execute(query, params)
        while True:
            batch = cur.fetchmany(BATCH_VALUES)
            if not batch:
                break
            block = np.asarray(batch, dtype=np.float64).reshape(len(batch), width + coded)
            for i, builder in enumerate(builders):
                builder.add_values(np.ascontiguousarray(block[:, i]))
            if groups is not None and coded:
                groups.add(block[:, :width], block[:, width:].astype(np.int64))
            stats.kept += len(batch)
    with conn.cursor() as cur:
        if not append:
            cur.execute("DELETE FROM dataset_unit WHERE dataset_id = %s", (dataset_id,))
        cur.execute(_APPEND_UNITS if append else _REPLACE_UNITS, params)
        cur.execute("SELECT count(*) FROM dataset_unit WHERE dataset_id = %s", (dataset_id,))
        row = cur.fetchone()
    return int(row[0]) if row else 0


__all__ = [
    "UNIT_HASH_BYTES",
    "BoundedUpload",
    "TableSpec",
    "bound_rows",
    "csv_records",
    "json_records",
    "parquet_records",
    "read_table",
    "stage",
    "unit_hash",
]
