"""Issue 28, item 5: Parquet uploads are bounded before their data is read.

A "page bomb" (one page of zeros, tiny compressed, huge decompressed) is refused from its page
headers, even when the footer understates the column chunk's size; a "null bomb" (10⁶ nulls
with ``?missing=skip``) counts against ``DPQUANT_MAX_VALUES`` from the footer, and again
while reading should the footer understate the rows. In every refusal no data page is read
(``iter_batches`` is never called) and nothing is stored. Ordinary files, including one row
group far above the page bound, still upload. The peak-RSS figures at the issue's sizes are
measured by ``benchmarks/bench_upload.py --bombs``, not here.
"""

from __future__ import annotations

import io
import itertools
import re
import struct
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.datasets import parquet_scan, upload

from .conftest import ADMIN, Api

PARQUET = {"content-type": "application/vnd.apache.parquet"}
BOUND = 2 << 20  # the page bound these tests set (the default is 64 MiB)


def values_url(ds: dict[str, Any], query: str = "?column=x") -> str:
    return f"/v1/datasets/{ds['id']}/values{query}"


def to_parquet(table: pa.Table, **options: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    return buf.getvalue()


def page_bomb(rows: int) -> bytes:
    """``rows`` float64 zeros in ONE zstd-compressed data page: 8·rows bytes decompressed."""
    return to_parquet(
        pa.table({"x": np.zeros(rows)}),
        compression="zstd",
        use_dictionary=False,
        write_statistics=False,
        data_page_size=1 << 30,
        max_rows_per_page=rows,
        write_batch_size=rows,
        row_group_size=rows,
    )


def zigzag_varint(value: int, width: int = 0) -> bytes:
    """Thrift's compact encoding of an integer, padded with continuation bytes to ``width``."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    while len(out) < width:
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def patch_footer(body: bytes, old: int, new: int) -> bytes:
    """``body`` with every footer integer equal to ``old`` set to ``new`` (same byte length,
    so nothing else moves)."""
    length = struct.unpack("<I", body[-8:-4])[0]
    start = len(body) - 8 - length
    before = zigzag_varint(old)
    footer = body[start:-8]
    assert before in footer and len(zigzag_varint(new)) <= len(before)
    return body[:start] + footer.replace(before, zigzag_varint(new, len(before))) + body[-8:]


def respell_page_size(body: bytes) -> bytes:
    """``body`` (a :func:`page_bomb`) with the page header's uncompressed size written under
    the field id 65538, which Thrift's C++ reader wraps to the int16 2, i.e. the same field
    (pyarrow still reads the whole page: checked when this test was written)."""
    meta = pq.ParquetFile(io.BytesIO(body)).metadata.row_group(0).column(0)
    header = body.index(b"\x15" + zigzag_varint(0), meta.data_page_offset)  # field 1: type 0
    field = header + 2
    assert body[field] == 0x15  # field 2, i32, short form
    value_end = field + 1
    while body[value_end] & 0x80:
        value_end += 1
    value_end += 1
    longer = b"\x05" + zigzag_varint(65538) + body[field + 1 : value_end]
    out = body[:field] + longer + body[value_end:]
    grown = len(longer) - (value_end - field)
    return patch_footer(out, meta.total_compressed_size, meta.total_compressed_size + grown)


def footprint(db_engine: Any, ds: dict[str, Any]) -> tuple[Any, ...]:
    """What an upload can change: n, skipped count, version, stored data, ledger, audit."""
    with db_engine.connect() as conn:
        return tuple(
            conn.execute(
                text(
                    "SELECT d.n, d.values_skipped, d.data_version, "
                    "(SELECT count(*) FROM dataset_data v WHERE v.dataset_id = d.id), "
                    "(SELECT count(*) FROM ledger_entry l WHERE l.dataset_id = d.id), "
                    "(SELECT count(*) FROM audit_event a WHERE a.target_id = CAST(d.id AS text) "
                    "AND a.action = 'dataset.upload') FROM dataset d WHERE d.id = :d"
                ),
                {"d": ds["id"]},
            ).one()
        )


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records every ``ParquetFile.iter_batches`` call: the only way data pages are read."""
    calls: list[int] = []
    real = pq.ParquetFile.iter_batches

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    return calls


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upload, "MAX_PARQUET_PAGE_BYTES", BOUND)


@pytest.fixture
def thousand_values(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client.app.state.settings, "max_values", 1000)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- page bombs


@pytest.mark.usefixtures("small_pages")
@pytest.mark.parametrize("footer", ["honest", "understated", "respelled header"])
def test_page_bomb_is_refused_from_its_page_header_before_any_data_page_is_read(
    footer: str, api: Api, client: TestClient, db_engine: Any, reads: list[int]
) -> None:
    rows = 4 * BOUND // 8  # one page of 8 MiB: 4 times the bound
    body = page_bomb(rows)
    chunk = pq.ParquetFile(io.BytesIO(body)).metadata.row_group(0).column(0)
    assert len(body) < 16_000 and chunk.total_uncompressed_size > 4 * BOUND
    if footer == "understated":  # the footer claims a 1000-byte chunk; the page header does not
        body = patch_footer(body, chunk.total_uncompressed_size, 1000)
        lying = pq.ParquetFile(io.BytesIO(body)).metadata.row_group(0).column(0)
        assert lying.total_uncompressed_size == 1000
    elif footer == "respelled header":
        body = respell_page_size(body)
    for prior in (None, [1.0, 2.0, 3.0]):
        ds = api.dataset(values=prior)
        before = footprint(db_engine, ds)
        r = client.put(values_url(ds), content=body, headers=ADMIN | PARQUET)
        assert r.status_code == 413 and r.json()["type"] == "payload_too_large", r.text
        detail = r.json()["detail"]
        assert f"Parquet pages are limited to {BOUND} bytes" in detail
        declared = re.search(r"has one of (\d+) bytes", detail)  # the page header's figure
        assert declared is not None and 8 * rows < int(declared[1]) < 8 * rows + 16
        assert footprint(db_engine, ds) == before
        assert client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()["n"] == (
            None if prior is None else 3
        )
    assert reads == []


@pytest.mark.usefixtures("small_pages")
def test_ordinary_files_upload_even_with_row_groups_far_above_the_page_bound(
    api: Api, client: TestClient, db_engine: Any
) -> None:
    rows = 1 << 20  # one row group of 8 MiB, 4 times the bound, in pyarrow's default pages
    values = np.random.default_rng(1).uniform(-10, 110, rows)
    for options in ({}, {"data_page_version": "2.0", "compression": "zstd"}):
        body = to_parquet(pa.table({"x": values}), row_group_size=rows, **options)
        meta = pq.ParquetFile(io.BytesIO(body)).metadata
        assert meta.num_row_groups == 1
        assert meta.row_group(0).column(0).total_uncompressed_size > 4 * BOUND
        ds = api.dataset()
        r = client.put(values_url(ds), content=body, headers=ADMIN | PARQUET)
        assert r.status_code == 200 and r.json()["n"] == rows, r.text
    rows = (BOUND - 16) // 8  # one page just under the bound (with its definition levels)
    r = client.put(values_url(api.dataset()), content=page_bomb(rows), headers=ADMIN | PARQUET)
    assert r.status_code == 200 and r.json()["n"] == rows, r.text


# --------------------------------------------------------------------------- null bombs


@pytest.mark.usefixtures("thousand_values")
def test_null_bomb_counts_against_max_values_before_reading(
    api: Api, client: TestClient, db_engine: Any, reads: list[int]
) -> None:
    column = pa.concat_arrays([pa.nulls(10**6, pa.float64()), pa.array([1.0, 2.0, 3.0])])
    body = to_parquet(pa.table({"x": column}))
    assert len(body) < 100_000
    ds = api.dataset()
    before = footprint(db_engine, ds)
    r = client.put(values_url(ds, "?column=x&missing=skip"), content=body, headers=ADMIN | PARQUET)
    assert r.status_code == 413 and r.json()["type"] == "payload_too_large", r.text
    assert r.json()["detail"] == "more than 1000 values"
    assert footprint(db_engine, ds) == before and before[0] is None
    assert reads == []


@pytest.mark.usefixtures("thousand_values")
def test_values_and_skipped_nulls_share_the_limit(
    api: Api, client: TestClient, db_engine: Any
) -> None:
    def body(values: int, nulls: int) -> bytes:
        x = np.r_[np.arange(values, dtype=float), np.zeros(nulls)]
        mask = np.r_[np.zeros(values, bool), np.ones(nulls, bool)]
        return to_parquet(pa.table({"x": pa.array(x, mask=mask)}))

    url = values_url(api.dataset(), "?column=x&missing=skip")
    r = client.put(url, content=body(991, 10), headers=ADMIN | PARQUET)
    assert r.status_code == 413 and r.json()["detail"] == "more than 1000 values"
    r = client.put(url, content=body(990, 10), headers=ADMIN | PARQUET)
    assert r.status_code == 200 and (r.json()["n"], r.json()["values_skipped"]) == (990, 10)
    r = client.post(url, content=body(9, 2), headers=ADMIN | PARQUET)  # 990 + 11 > 1000
    assert r.status_code == 413 and r.json()["detail"] == "more than 1000 values"
    r = client.post(url, content=body(9, 1), headers=ADMIN | PARQUET)
    assert r.status_code == 200 and (r.json()["n"], r.json()["values_skipped"]) == (999, 11)
    # CSV: skipped empty cells count too
    csv = ("x,y\n" + ",0\n" * 1500 + "1,0\n").encode()
    r = client.put(
        values_url(api.dataset(), "?column=x&missing=skip"),
        content=csv,
        headers=ADMIN | {"content-type": "text/csv"},
    )
    assert r.status_code == 413 and r.json()["detail"] == "more than 1000 values"


@pytest.mark.usefixtures("thousand_values")
def test_a_footer_that_understates_the_rows_is_caught_while_reading(
    api: Api, client: TestClient, db_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload, "parquet_rows", lambda metadata, leaf: 0)
    column = pa.concat_arrays([pa.nulls(5000, pa.float64()), pa.array([1.0])])
    body = to_parquet(pa.table({"x": column}), row_group_size=500)
    ds = api.dataset()
    before = footprint(db_engine, ds)
    r = client.put(values_url(ds, "?column=x&missing=skip"), content=body, headers=ADMIN | PARQUET)
    assert r.status_code == 413 and r.json()["detail"] == "more than 1000 values", r.text
    assert footprint(db_engine, ds) == before


# --------------------------------------------------------------------------- the header scan


def test_page_scan_agrees_with_pyarrow_for_every_writer_option() -> None:
    """The scan's page-by-page sums equal the footer's (honest) chunk sizes, for each page
    version, codec, encoding, statistics, page index and checksum option, with nested and
    string columns before and after the one read."""
    rng = np.random.default_rng(2)
    n = 50_000
    x = rng.normal(size=n)
    table = pa.table(
        {
            "s": pa.array([str(i) for i in range(n)]),
            "nested": pa.StructArray.from_arrays(
                [pa.array(np.arange(n)), pa.array(x)], names=["a", "x"]
            ),
            "x": pa.array(x, mask=np.arange(n) % 5 == 0),
            "lists": pa.array([[1.0, 2.0]] * n),
            "i": pa.array(rng.integers(0, 50, n).astype(np.int32)),
        }
    )
    options: dict[str, list[Any]] = {
        "compression": ["snappy", "zstd", "gzip", "brotli", "lz4", "none"],
        "data_page_version": ["1.0", "2.0"],
        "use_dictionary": [True, False],
        "write_statistics": [True, False],
        "write_page_index": [False, True],
        "write_page_checksum": [False, True],
    }
    combos = list(itertools.product(*options.values()))
    for combo in combos[::5]:
        kwargs = dict(zip(options, combo, strict=True))
        body = io.BytesIO(to_parquet(table, row_group_size=20_000, **kwargs))
        parquet = pq.ParquetFile(body)
        for column in ("x", "i"):
            leaf = parquet_scan.parquet_leaf(parquet, column)
            assert leaf is not None
            meta = parquet.metadata
            scan = parquet_scan.check_parquet_pages(body, meta, leaf, max_page_bytes=BOUND)
            assert scan.uncompressed == sum(
                meta.row_group(g).column(leaf).total_uncompressed_size
                for g in range(meta.num_row_groups)
            ), (kwargs, column)
            assert scan.pages >= 3 and 0 < scan.largest <= BOUND
            assert parquet_scan.parquet_rows(meta, leaf) == n
    assert parquet_scan.parquet_leaf(parquet, "nested") is None
    assert parquet_scan.parquet_leaf(parquet, "lists") is None


def uvarint(value: int) -> bytes:
    """Thrift's unsigned varint (lengths, sizes)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def one_chunk(length: int, num_values: int = 10) -> Any:
    """Footer metadata of one column chunk of ``length`` bytes at offset 4."""
    chunk = SimpleNamespace(
        has_dictionary_page=False,
        dictionary_page_offset=None,
        data_page_offset=4,
        total_compressed_size=length,
        num_values=num_values,
    )
    group = SimpleNamespace(column=lambda leaf: chunk)
    return SimpleNamespace(num_row_groups=1, row_group=lambda g: group)


def test_hostile_page_headers_are_refused_without_crashing() -> None:
    i32 = zigzag_varint
    data_page = b"\x15" + i32(0)  # field 1 (type): DATA_PAGE
    sizes = b"\x15" + i32(100) + b"\x15" + i32(100)  # fields 2, 3: decompressed, stored
    values = b"\x2c" + b"\x15" + i32(10) + b"\x00"  # field 5 (a struct): its field 1
    ok = data_page + sizes + values + b"\x00"
    # (header, bytes after it in the file, refused as too large?, words of the message)
    cases = [
        (ok[:5], b"", False, "runs past"),
        (data_page + b"\x00", bytes(64), False, "incomplete"),
        (
            data_page + b"\x15" + i32(-1) + b"\x15" + i32(1) + values + b"\x00",
            b"",
            False,
            "negative",
        ),
        (data_page + sizes + b"\x00", b"", False, "value count"),
        (data_page + sizes + b"\x2c\x15" + i32(-5) + b"\x00\x00", b"", False, "value count"),
        (data_page + b"\x1c" * 40, bytes(64), False, "malformed"),  # structs 40 deep
        (data_page + b"\x19" + b"\x19" * 40, bytes(64), False, "malformed"),  # lists 40 deep
        (data_page + b"\x1e", bytes(64), False, "malformed"),  # unknown type 14
        (data_page + b"\x18" + b"\xff" * 11, bytes(64), False, "malformed"),  # 11-byte varint
        # a 5000-byte binary field (id 15) before the sizes: a header above 4096 bytes
        (data_page + b"\xe8" + uvarint(5000) + bytes(5000), bytes(64), True, "4096 bytes"),
        # field 2 (3 MiB) spelled as field 65538, which Thrift's C++ reader wraps to 2
        (
            data_page + b"\x05" + i32(65538) + i32(3 * BOUND) + b"\x15" + i32(100) + values,
            b"\x00",
            True,
            f"one of {3 * BOUND} bytes",
        ),
        # the last occurrence of a field wins: a big field 2 after the small one
        (ok[:-1] + b"\x05" + i32(2) + i32(3 * BOUND) + b"\x00", b"", True, f"one of {3 * BOUND}"),
    ]
    for header, tail, too_large, words in cases:
        body = io.BytesIO(b"PAR1" + header + tail)
        with pytest.raises(parquet_scan.ParquetRefused) as refused:
            parquet_scan.check_parquet_pages(body, one_chunk(len(header)), 0, max_page_bytes=BOUND)
        assert refused.value.too_large is too_large, (header, refused.value)
        assert words in str(refused.value), (header, refused.value)
    body = io.BytesIO(b"PAR1" + ok + bytes(100))
    scan = parquet_scan.check_parquet_pages(body, one_chunk(len(ok) + 100), 0, max_page_bytes=BOUND)
    assert (scan.pages, scan.largest, scan.uncompressed) == (1, 100, len(ok) + 100)
