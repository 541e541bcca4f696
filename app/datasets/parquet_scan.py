"""Checks of a Parquet column's metadata before any data page is read.

The footer's record counts and every page header of the chosen column are read (a small
reader of Thrift's compact protocol, no data page), so that an upload or a local ingest can
refuse a column whose pages would not fit the memory bound before pyarrow allocates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any

#: Most pages of the chosen column in one file (413 above). At the writers' 20,000 rows a
#: page that is 2·10¹⁰ values, 20 times the default value limit. With the next two bounds it
#: keeps the header scan under half a minute of CPU (2²⁰ one-row pages: 11 s; 0.4 µs a byte
#: of a hostile header).
MAX_PARQUET_PAGES = 1 << 20
#: Most bytes of page headers of the chosen column in one file (413 above); real headers
#: take 30-100 bytes.
MAX_PARQUET_HEADER_BYTES = 64 << 20
#: Longest page header read (413 above): a numeric column's header (sizes, counts,
#: encodings, 8-byte min/max statistics) takes under 200 bytes.
MAX_PAGE_HEADER_BYTES = 1 << 12
#: pyarrow reads up to this many bytes past a column chunk's end (old parquet-mr files left
#: the dictionary page header out of the chunk's size, PARQUET-816); so does the scan.
_CHUNK_PADDING = 100
#: Deepest nesting of structs and lists accepted in a page header (a real one has 3 levels).
_MAX_HEADER_DEPTH = 16

# Thrift compact-protocol type codes (a boolean field keeps its value in its type code).
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = range(1, 9)
_LIST, _SET, _MAP, _STRUCT, _UUID = range(9, 14)
# Parquet page types that hold values.
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3


class ParquetRefused(Exception):
    """A Parquet column refused from its metadata, before any data page is read.

    ``too_large`` marks a broken bound (413) rather than a malformed file (422). The message
    names the problem and the row group (from 0, as pyarrow numbers them), never a value.
    """

    def __init__(self, problem: str, *, too_large: bool) -> None:
        super().__init__(problem)
        self.too_large = too_large


@dataclass(frozen=True)
class PageScan:
    """What :func:`check_parquet_pages` read of a column's page headers."""

    pages: int
    #: The largest page, stored or decompressed, in bytes.
    largest: int
    #: Headers plus decompressed pages: the sum of the chunks' ``total_uncompressed_size``
    #: when the footer is honest.
    uncompressed: int


class _Truncated(Exception):
    """The header runs past the bytes read so far."""


class _Compact:
    """Just enough of Thrift's compact protocol to read a Parquet ``PageHeader``.

    :meth:`struct` keeps a struct's i32 and struct fields by field id and skips the rest; like
    the reader pyarrow generates, it keeps the last occurrence of a field and skips a field of
    an unexpected type. Malformed input raises ``ValueError``.
    """

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Truncated
        value = self.data[self.pos]
        self.pos += 1
        return value

    def advance(self, count: int) -> None:
        if count < 0:
            raise ValueError("negative length")
        if self.pos + count > len(self.data):
            raise _Truncated
        self.pos += count

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def i32(self) -> int:
        """A zigzag varint as Thrift's C++ reader takes it: the low 32 bits, signed."""
        n = self.varint() & 0xFFFFFFFF
        return (n >> 1) ^ -(n & 1)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        if depth > _MAX_HEADER_DEPTH:
            raise ValueError("nested too deeply")
        fields: dict[int, Any] = {}
        field_id = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            kind = head & 0x0F
            field_id = field_id + (head >> 4) if head >> 4 else self.i32()
            field_id = (field_id + 0x8000) % 0x10000 - 0x8000  # an int16, wrapping as in C++
            if kind == _I32:
                fields[field_id] = self.i32()
            elif kind == _STRUCT:
                fields[field_id] = self.struct(depth + 1)
            else:
                self.skip(kind, depth)

    def skip(self, kind: int, depth: int, *, element: bool = False) -> None:
        if depth > _MAX_HEADER_DEPTH:
            raise ValueError("nested too deeply")
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            if element:  # a boolean element of a collection takes one byte
                self.advance(1)
        elif kind == _BYTE:
            self.advance(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind == _UUID:
            self.advance(16)
        elif kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):  # each element takes a byte at least: ends by truncation
                self.skip(head & 0x0F, depth + 1, element=True)
        elif kind == _MAP:
            size = self.varint()
            kinds = self.byte() if size else 0
            for _ in range(size):
                self.skip(kinds >> 4, depth + 1, element=True)
                self.skip(kinds & 0x0F, depth + 1, element=True)
        elif kind == _STRUCT:
            self.struct(depth + 1)
        else:
            raise ValueError("unknown type")


def _page_header(file: IO[bytes], pos: int, end: int, group: int) -> tuple[dict[int, Any], int]:
    """The page header at ``pos`` (which must end before ``end``) and its length."""
    size = 256
    while True:
        want = min(size, end - pos)
        file.seek(pos)
        data = file.read(want)
        reader = _Compact(data)
        try:
            return reader.struct(), reader.pos
        except _Truncated:
            if len(data) < end - pos and size < MAX_PAGE_HEADER_BYTES:
                size *= 4
                continue
            if len(data) >= MAX_PAGE_HEADER_BYTES:
                raise ParquetRefused(
                    f"Parquet page headers are limited to {MAX_PAGE_HEADER_BYTES} bytes "
                    f"(row group {group})",
                    too_large=True,
                ) from None
            raise ParquetRefused(
                f"row group {group}: a page header runs past its column chunk", too_large=False
            ) from None
        except (ValueError, RecursionError):
            raise ParquetRefused(
                f"row group {group}: malformed Parquet page header", too_large=False
            ) from None


def _int_field(fields: dict[int, Any], field_id: int) -> int | None:
    value = fields.get(field_id)
    return value if isinstance(value, int) else None


def parquet_leaf(parquet: Any, column: str) -> int | None:
    """The index of ``column`` among the leaf columns of ``parquet`` (a
    ``pyarrow.parquet.ParquetFile``) if it is one top-level, unrepeated column, else None."""
    schema = parquet.schema
    found = []
    for i in range(len(schema)):
        leaf = schema.column(i)
        if leaf.path == column and leaf.name == column and leaf.max_repetition_level == 0:
            found.append(i)
    return found[0] if len(found) == 1 else None


def parquet_rows(metadata: Any, leaf: int) -> int:
    """Records of leaf column ``leaf`` by the footer, missing values included: over all row
    groups, the larger of a row group's rows and its column chunk's values."""
    total = 0
    for group in range(metadata.num_row_groups):
        meta = metadata.row_group(group)
        total += max(meta.num_rows, meta.column(leaf).num_values, 0)
    return total


def check_parquet_pages(
    file: IO[bytes],
    metadata: Any,
    leaf: int,
    *,
    max_page_bytes: int,
    max_pages: int = MAX_PARQUET_PAGES,
) -> PageScan:
    """Read every page header of leaf column ``leaf`` that pyarrow would read, no data page.

    Refuses (:class:`ParquetRefused`, 413) a page whose stored or decompressed size declared
    in its header exceeds ``max_page_bytes``, more than ``max_pages`` pages or
    :data:`MAX_PARQUET_HEADER_BYTES` of headers; malformed headers or a column chunk outside
    the file are refused as malformed (422). The headers are read, not the footer's
    column-chunk sizes, because a footer can understate those: pyarrow allocates what the
    page header declares. Like pyarrow, each chunk is read from its first page until its
    data pages have declared the chunk's ``num_values`` values or its bytes (plus
    :data:`_CHUNK_PADDING`) run out.
    """
    file.seek(0, 2)
    size = file.tell()
    pages = headers = largest = uncompressed = 0
    for group in range(metadata.num_row_groups):
        chunk = metadata.row_group(group).column(leaf)
        start = chunk.data_page_offset
        dictionary = chunk.dictionary_page_offset
        if chunk.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
            start = dictionary
        length = chunk.total_compressed_size
        if start < 0 or length < 0 or start + length > size:
            raise ParquetRefused(
                f"row group {group}: column chunk outside the file", too_large=False
            )
        end = min(start + length + _CHUNK_PADDING, size)
        pos, seen = start, 0
        while seen < chunk.num_values and pos < end:
            header, header_bytes = _page_header(file, pos, end, group)
            kind, decompressed, stored = (_int_field(header, i) for i in (1, 2, 3))
            if kind is None or stored is None or decompressed is None:
                raise ParquetRefused(
                    f"row group {group}: incomplete Parquet page header", too_large=False
                )
            if stored < 0 or decompressed < 0:
                raise ParquetRefused(
                    f"row group {group}: negative Parquet page size", too_large=False
                )
            page = max(stored, decompressed)
            if page > max_page_bytes:
                raise ParquetRefused(
                    f"Parquet pages are limited to {max_page_bytes} bytes; row group {group} "
                    f"of the column has one of {page} bytes (write smaller pages)",
                    too_large=True,
                )
            pages += 1
            headers += header_bytes
            if pages > max_pages or headers > MAX_PARQUET_HEADER_BYTES:
                raise ParquetRefused(
                    f"a Parquet column may have at most {max_pages} pages and "
                    f"{MAX_PARQUET_HEADER_BYTES} bytes of page headers",
                    too_large=True,
                )
            if kind in (_DATA_PAGE, _DATA_PAGE_V2):
                data_header = header.get(5 if kind == _DATA_PAGE else 8)
                values = _int_field(data_header, 1) if isinstance(data_header, dict) else None
                if values is None or values < 0:
                    raise ParquetRefused(
                        f"row group {group}: data page without a value count", too_large=False
                    )
                seen += values
            largest = max(largest, page)
            uncompressed += header_bytes + decompressed
            pos += header_bytes + stored
    return PageScan(pages=pages, largest=largest, uncompressed=uncompressed)
