"""Streaming readers for value uploads (JSON, CSV, octet-stream, Parquet) and histogram bodies.

Every reader pulls the body as an iterator of byte chunks, works on blocks of about
:data:`BLOCK_BYTES`, and feeds a :class:`~app.codec.histogram.HistogramBuilder`; memory is
bounded by the block size, the largest pending token and the histogram (O(distinct cells)),
never by the body length. Parquet needs random access, so its body is spooled to a temporary
file first; its footer and the chosen column's page headers are checked against the value
limit and :data:`MAX_PARQUET_PAGE_BYTES` before any data page is read, and it is then read
one record batch at a time through a buffer of :data:`BLOCK_BYTES`.

Errors are 4xx :class:`~app.core.errors.DpquantError` naming the field and, for a bad record, its
position ("index i" from 0 for JSON and octet-stream; "row r" from 1 for CSV and Parquet,
counting data records after the header) — never a value.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from app.codec.histogram import HistogramBuilder
from app.core.errors import DpquantError, invalid
from app.datasets.parquet_scan import (
    ParquetRefused,
    check_parquet_pages,
    parquet_leaf,
    parquet_rows,
)

MEDIA_JSON = "application/json"
MEDIA_CSV = "text/csv"
MEDIA_OCTET = "application/octet-stream"
MEDIA_PARQUET = "application/vnd.apache.parquet"
VALUE_MEDIA_TYPES = (MEDIA_JSON, MEDIA_CSV, MEDIA_OCTET, MEDIA_PARQUET)
HISTOGRAM_MEDIA_TYPES = (MEDIA_JSON, MEDIA_OCTET)

#: Work is done on blocks of about this many bytes (131072 float64 values).
BLOCK_BYTES = 1 << 20
#: The longest JSON element, CSV line or CSV record accepted (bounds the pending buffer).
MAX_TOKEN_BYTES = 1 << 20
#: Values handed to the histogram at once by the CSV and JSON readers.
BATCH_VALUES = 1 << 17

_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_JSON_WS = b" \t\n\r"


#: Text cells that mean "no value" in a numeric column (compared case-insensitively, after
#: stripping): what CSV writers put for a missing number (pandas, R, spreadsheets). They are
#: skipped with ``?missing=skip`` and refused otherwise, like an empty cell; ``dpquant ingest``
#: reads CSV with exactly these as nulls (``--missing``).
MISSING_MARKERS = frozenset({"", "na", "n/a", "#n/a", "nan", "-nan", "null", "none"})


def missing_cell(text: str) -> str | None:
    """Why a numeric cell counts as missing (``"empty cell"`` or ``"missing-value marker"``),
    or None when it holds something to parse."""
    stripped = text.strip()
    if not stripped:
        return "empty cell"
    return "missing-value marker" if stripped.lower() in MISSING_MARKERS else None


def _bad(problem: str) -> DpquantError:
    return invalid("body", problem)


def too_large(limit: int) -> DpquantError:
    """413 for a body above the upload limit."""
    return DpquantError(413, "payload_too_large", f"uploads are limited to {limit} bytes")


def too_many_values(limit: int) -> DpquantError:
    """413 for more values than a dataset may hold."""
    return DpquantError(413, "payload_too_large", f"more than {limit} values")


def unsupported(allowed: tuple[str, ...]) -> DpquantError:
    """415 listing the accepted content types."""
    return DpquantError(
        415, "unsupported_media_type", f"Content-Type must be one of {', '.join(allowed)}"
    )


@dataclass
class UploadStats:
    """What a reader saw besides the histogram (reported to admins)."""

    skipped: int = 0


def limited(chunks: Iterable[bytes], limit: int) -> Iterator[bytes]:
    """Pass chunks through, refusing (413) once more than ``limit`` bytes arrived."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if chunk:
            yield chunk


def blocks(chunks: Iterable[bytes], size: int | None = None) -> Iterator[bytes]:
    """Coalesce small chunks into blocks of at least ``size`` (default :data:`BLOCK_BYTES`)
    bytes; the last may be shorter. A chunk is never split, so a block may be larger."""
    size = BLOCK_BYTES if size is None else size
    pending: list[bytes] = []
    have = 0
    for chunk in chunks:
        pending.append(chunk)
        have += len(chunk)
        if have >= size:
            yield b"".join(pending)
            pending.clear()
            have = 0
    if pending:
        yield b"".join(pending)


class ValueSink:
    """Feeds finite values into the builder, enforcing the value limit as they arrive.

    Skipped missing values (``?missing=skip``) count against the limit like values: a body
    of 10⁸ nulls is as much work to read as 10⁸ values.
    """

    def __init__(self, builder: HistogramBuilder, *, max_values: int, already: int = 0) -> None:
        self.builder = builder
        self.max_values = max_values
        self.already = already
        self.skipped = 0

    @property
    def room(self) -> int:
        """How many more values or skipped missing values this upload may read."""
        return self.max_values - self.already - self.builder.n - self.skipped

    def add(self, values: NDArray[np.float64], first: int, where: Callable[[int], str]) -> None:
        """Add ``values`` (record positions ``first, first + 1, ...``); 422 on a non-finite."""
        finite = np.isfinite(values)
        if not finite.all():
            raise _bad(f"{where(first + int(np.argmin(finite)))}: not a finite number")
        if values.size > self.room:
            raise too_many_values(self.max_values)
        self.builder.add_values(values)

    def skip(self, count: int) -> None:
        """Count ``count`` skipped missing values against the limit (413 beyond it)."""
        if count > self.room:
            raise too_many_values(self.max_values)
        self.skipped += count


# --------------------------------------------------------------------------- octet-stream


def read_octet(chunks: Iterable[bytes], sink: ValueSink) -> UploadStats:
    """Little-endian float64 values, 8 bytes each; index i counts from 0."""
    carry = b""
    index = 0
    seen = False
    for block in blocks(chunks):
        seen = True
        data = carry + block if carry else block
        usable = len(data) - len(data) % 8
        carry = data[usable:]
        if usable:
            values = np.frombuffer(data, dtype="<f8", count=usable // 8).astype(np.float64)
            sink.add(values, index, lambda i: f"index {i}")
            index += values.size
    if not seen:
        raise _bad("the upload is empty")
    if carry:
        raise _bad("octet-stream length must be a multiple of 8 (little-endian float64)")
    return UploadStats()


# --------------------------------------------------------------------------- JSON


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _malformed() -> DpquantError:
    return _bad("malformed JSON (expected an array of numbers)")


class _JsonNumbers:
    """Incremental reader of one JSON array of numbers, at most one pending token buffered."""

    def __init__(self, sink: ValueSink) -> None:
        self.sink = sink
        self.index = 0
        self.started = False
        self.closed = False
        self.buf = b""

    def feed(self, block: bytes) -> None:
        buf = self.buf + block if self.buf else block
        if self.closed:
            if buf.strip(_JSON_WS):
                raise _malformed()
            self.buf = b""
            return
        if not self.started:
            buf = buf.lstrip(_JSON_WS)
            if not buf:
                self.buf = b""
                return
            if buf[:1] != b"[":
                raise _bad("expected a JSON array of numbers")
            buf = buf[1:]
            self.started = True
        end = buf.find(b"]")
        if end >= 0:
            # Numbers contain no ']': either this is the end of the array, or some element
            # before it is not a number and the element check below reports it first.
            self._elements(buf[:end], last=True)
            self.closed = True
            self.buf = b""
            self.feed(buf[end + 1 :])
            return
        comma = buf.rfind(b",")
        if comma >= 0:
            self._elements(buf[:comma], last=False)
            buf = buf[comma + 1 :]
        self.buf = buf.lstrip(_JSON_WS)
        if len(self.buf) > MAX_TOKEN_BYTES:
            self._fail_token(self.buf, self.index)

    def finish(self) -> None:
        if not self.started:
            raise _bad("the upload is empty") if not self.buf else _malformed()
        if not self.closed:
            raise _malformed()

    def _fail_token(self, token: bytes, index: int) -> None:
        head = token.strip(_JSON_WS)[:1]
        if head and head in b"-0123456789":
            raise _bad(f"index {index}: number too long")
        raise _bad(f"index {index}: not a number")

    def _elements(self, segment: bytes, *, last: bool) -> None:
        """Values of ``segment``: complete elements separated by commas (the final one,
        when ``last``, closes the array and may be empty only if the array is empty)."""
        if not segment.strip(_JSON_WS):
            if last and self.index == 0:
                return  # "[]" or "[ ]"
            raise _malformed()  # "[,", "[1,,2]", "[1,]"
        try:
            parsed = json.loads(b"[" + segment + b"]", parse_constant=_reject_constant)
            if not set(map(type, parsed)) <= {int, float}:
                raise TypeError
            values = np.array(parsed, dtype=np.float64)
        except (ValueError, TypeError, OverflowError, RecursionError):
            values = self._slow(segment)
        for start in range(0, values.size, BATCH_VALUES):
            part = values[start : start + BATCH_VALUES]
            self.sink.add(part, self.index, lambda i: f"index {i}")
            self.index += part.size

    def _slow(self, segment: bytes) -> NDArray[np.float64]:
        """Element by element, to name the first bad one (only runs when something is wrong)."""
        out: list[float] = []
        for offset, raw in enumerate(segment.split(b",")):
            token = raw.strip(_JSON_WS)
            index = self.index + offset
            if _NUMBER.fullmatch(token):
                value = float(token)
                if not math.isfinite(value):
                    raise _bad(f"index {index}: not a finite number")
                out.append(value)
            elif token[:1] and token[:1] in b'"[{tfn':
                raise _bad(f"index {index}: not a number")
            else:
                raise _malformed()
        return np.asarray(out, dtype=np.float64)


def read_json(chunks: Iterable[bytes], sink: ValueSink) -> UploadStats:
    """A JSON array of numbers; index i counts from 0."""
    reader = _JsonNumbers(sink)
    for block in blocks(chunks):
        reader.feed(block)
    reader.finish()
    return UploadStats()


# --------------------------------------------------------------------------- CSV


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """UTF-8 text lines (split on ``\\n`` only, ends kept), one pending line at most."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    pending = ""
    try:
        for block in blocks(chunks):
            pending += decoder.decode(block)
            parts = pending.split("\n")
            pending = parts.pop()
            for part in parts:
                yield part + "\n"
            if len(pending) > MAX_TOKEN_BYTES:
                raise _bad("CSV line too long")
        pending += decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _bad("CSV must be UTF-8") from None
    if pending:
        yield pending


def csv_with_header(chunks: Iterable[bytes]) -> tuple[Iterator[list[str]], list[str]]:
    """A strict CSV reader over the body's lines and its header row's names (stripped);
    422 without a header or with a malformed one."""
    reader = csv.reader(lines(chunks), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise _bad("the CSV has no header row") from None
    except csv.Error:
        raise _bad("malformed CSV header") from None
    return reader, [h.strip() for h in header]


def read_csv(
    chunks: Iterable[bytes],
    sink: ValueSink,
    *,
    column: str,
    skip_missing: bool,
    header: bool = True,
) -> UploadStats:
    """One column of a CSV file: named by the header row, or, without one (``header``
    False), by its position from 1.

    Row r counts data records from 1 after the header (from the first line without one;
    blank lines included; a quoted field spanning lines is one record). Empty cells and
    missing-value markers are an error naming their row unless ``skip_missing``, which skips
    and counts them.
    """
    if header:
        reader, names = csv_with_header(chunks)
        if column not in names:
            raise invalid("query.column", "no such column in the CSV header")
        idx = names.index(column)
    else:
        reader = csv.reader(lines(chunks), strict=True)
        idx = int(column) - 1
    stats = UploadStats()
    batch: list[float] = []
    first_row = 1
    row_number = 0

    def row_at(i: int) -> str:
        return f"row {i}"

    try:
        for row_number, row in enumerate(reader, start=1):
            if not row:
                continue
            if idx >= len(row):
                raise _bad(f"row {row_number}: missing cell")
            text = row[idx].strip()
            why = missing_cell(text)
            if why is not None:
                if skip_missing:
                    sink.skip(1)
                    stats.skipped += 1
                    continue
                raise _bad(f"row {row_number}: {why} (use ?missing=skip to skip them)")
            try:
                value = float(text)
            except ValueError:
                raise _bad(f"row {row_number}: not a number") from None
            if not math.isfinite(value):
                raise _bad(f"row {row_number}: not a finite number")
            if not batch:
                first_row = row_number
            batch.append(value)
            if len(batch) >= BATCH_VALUES:
                sink.add(np.asarray(batch, dtype=np.float64), first_row, row_at)
                batch.clear()
    except csv.Error:
        raise _bad(f"row {row_number + 1}: malformed CSV") from None
    if batch:
        sink.add(np.asarray(batch, dtype=np.float64), first_row, row_at)
    return stats


# --------------------------------------------------------------------------- Parquet

#: Largest page of the chosen Parquet column, stored or decompressed (413 above), checked on
#: every page header before any data page is read. pyarrow decompresses one page of a column
#: at a time, whole, so this bounds an upload's memory whatever the compression ratio (one
#: 512 MiB page of zeros compresses to 17 kB). Writers' pages are far smaller: pyarrow,
#: parquet-mr (Spark), arrow-rs and polars aim at 1 MiB, and pyarrow and parquet-mr write at
#: most 20,000 rows a page (160 kB of float64); fastparquet writes one page per row group, so
#: its row groups must stay under 8·10⁶ float64 rows. The column chunk is not bounded: Spark's
#: default 128 MiB row groups hold a 126 MiB chunk of one double column, in 160 kB pages.
MAX_PARQUET_PAGE_BYTES = 64 << 20
#: pyarrow reads Parquet through a buffer of this size, without pre-buffering whole column
#: chunks (which held a 400 MB row group in memory at once).
PARQUET_BUFFER_BYTES = BLOCK_BYTES


def spool(chunks: Iterable[bytes], file: IO[bytes]) -> int:
    """Copy the body to ``file``; returns its length."""
    size = 0
    for chunk in chunks:
        file.write(chunk)
        size += len(chunk)
    file.flush()
    return size


@contextmanager
def spooled_parquet(chunks: Iterable[bytes]) -> Iterator[tuple[IO[bytes], Any]]:
    """The body spooled to a temporary file and opened as a ``pyarrow.parquet.ParquetFile``
    (read through a buffer of :data:`PARQUET_BUFFER_BYTES`, no pre-buffering); 422 when it is
    empty or not Parquet. The file is removed on exit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryFile(prefix="dpquant-upload-") as file:
        if spool(chunks, file) == 0:
            raise _bad("the upload is empty")
        file.seek(0)
        try:
            parquet = pq.ParquetFile(file, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
            parquet.metadata  # noqa: B018 - read the footer now: a bad file fails here
        except (pa.ArrowException, OSError, ValueError):
            raise _bad("not a valid Parquet file") from None
        yield file, parquet


def read_parquet(
    chunks: Iterable[bytes],
    sink: ValueSink,
    *,
    column: str,
    skip_missing: bool,
    max_page_bytes: int | None = None,
) -> UploadStats:
    """One numeric column of a Parquet file, read one record batch at a time.

    Row r counts records from 1. Nulls are an error naming their row unless
    ``skip_missing``, which skips and counts them; either way they count against the value
    limit. Before any data page is read, the footer's records of the column (nulls included)
    must fit the sink's room and every page header of the column must declare at most
    ``max_page_bytes`` (default :data:`MAX_PARQUET_PAGE_BYTES`), else 413; while reading,
    the sink enforces the limit again, should the footer understate the records.
    """
    import pyarrow as pa

    bound = MAX_PARQUET_PAGE_BYTES if max_page_bytes is None else max_page_bytes
    stats = UploadStats()
    with spooled_parquet(chunks) as (file, parquet):
        schema, metadata = parquet.schema_arrow, parquet.metadata
        if column not in schema.names:
            raise invalid("query.column", "no such column in the Parquet schema")
        if len(schema.get_all_field_indices(column)) != 1:
            raise invalid("query.column", "names several columns of the Parquet schema")
        kind = schema.field(column).type
        leaf = parquet_leaf(parquet, column)
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or leaf is None:
            raise invalid("query.column", "is not an integer or floating-point column")
        if parquet_rows(metadata, leaf) > sink.room:
            raise too_many_values(sink.max_values)
        try:
            check_parquet_pages(file, metadata, leaf, max_page_bytes=bound)
        except ParquetRefused as exc:
            if exc.too_large:
                raise DpquantError(413, "payload_too_large", str(exc)) from None
            raise _bad(str(exc)) from None
        row = 1
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_VALUES, columns=[column]):
                array = batch.column(0)
                values = array.to_numpy(zero_copy_only=False).astype(np.float64)
                if array.null_count:
                    nulls = array.is_null().to_numpy(zero_copy_only=False)
                    if not skip_missing:
                        first = row + int(np.argmax(nulls))
                        raise _bad(f"row {first}: missing value (use ?missing=skip to skip them)")
                    bad = ~np.isfinite(values) & ~nulls
                    if bad.any():
                        raise _bad(f"row {row + int(np.argmax(bad))}: not a finite number")
                    sink.skip(int(array.null_count))
                    stats.skipped += int(array.null_count)
                    values = values[~nulls]
                sink.add(values, row, lambda i: f"row {i}")
                row += len(array)
        except (pa.ArrowException, OSError):
            raise _bad(f"row {row}: unreadable Parquet data") from None
    return stats


# --------------------------------------------------------------------------- dispatch


def read_values(
    chunks: Iterable[bytes],
    sink: ValueSink,
    *,
    media_type: str,
    column: str | None,
    skip_missing: bool,
    max_page_bytes: int | None = None,
    header: bool = True,
) -> UploadStats:
    """Read one upload in any supported format into ``sink`` (``max_page_bytes``: see
    :func:`read_parquet`)."""
    if media_type == MEDIA_OCTET:
        return read_octet(chunks, sink)
    if media_type == MEDIA_JSON:
        return read_json(chunks, sink)
    if media_type == MEDIA_CSV:
        assert column is not None
        return read_csv(chunks, sink, column=column, skip_missing=skip_missing, header=header)
    if media_type == MEDIA_PARQUET:
        assert column is not None
        return read_parquet(
            chunks, sink, column=column, skip_missing=skip_missing, max_page_bytes=max_page_bytes
        )
    raise unsupported(VALUE_MEDIA_TYPES)
