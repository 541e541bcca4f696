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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray

from app.codec.histogram import HistogramBuilder
from app.core.errors import DpquantError, invalid
from app.datasets.upload import BATCH_VALUES, lines, too_many_values
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


Batch = Callable[[list[bytes] | None, NDArray[np.float64]], None]


def read_table_csv(
    chunks: Iterable[bytes],
    spec: TableSpec,
    on_batch: Batch,
    *,
    key: bytes | None,
    skip_missing: bool,
    max_values: int,
) -> BoundedUpload:
    """Read a CSV with a header row carrying every declared column (and the unit column):
    ``on_batch(unit hashes or None, values)`` gets the rows by blocks, one row of doubles
    per record (numeric columns in declared order). A row with an empty numeric cell is an
    error naming it, or skipped whole with ``skip_missing``; a categorical cell must be one
    of the column's public keys when it has them; an empty unit cell is an error. Rows are
    counted from 1 after the header; no message carries a cell."""
    reader = csv.reader(lines(chunks), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise _bad("the CSV has no header row") from None
    except csv.Error:
        raise _bad("malformed CSV header") from None
    names = [h.strip() for h in header]
    wanted = [*spec.numeric, *(name for name, _ in spec.categorical)]
    for name in wanted:
        if name not in names:
            raise _bad(f"the CSV header lacks the declared column {name!r}")
    if spec.unit is not None and spec.unit not in names:
        raise _bad("the CSV header lacks the dataset's privacy_unit column")
    vi = [names.index(name) for name in spec.numeric]
    ci = [(names.index(name), keys) for name, keys in spec.categorical]
    ui = None if spec.unit is None else names.index(spec.unit)
    last = max([*vi, *(i for i, _ in ci), *([] if ui is None else [ui])])
    width = len(vi)
    stats = BoundedUpload()
    units: list[bytes] = []
    rows: list[float] = []
    row_number = 0

    def flush() -> None:
        block = np.asarray(rows, dtype=np.float64).reshape(-1, width)
        on_batch(None if ui is None else list(units), block)
        units.clear()
        rows.clear()

    try:
        for row_number, row in enumerate(reader, start=1):
            if not row:
                continue
            if last >= len(row):
                raise _bad(f"row {row_number}: missing cell")
            if stats.rows + stats.skipped >= max_values:
                raise too_many_values(max_values)
            unit = ""
            if ui is not None:
                unit = row[ui].strip()
                if not unit:
                    raise _bad(f"row {row_number}: empty privacy unit")
            for i, keys in ci:
                if keys is not None and row[i].strip() not in keys:
                    raise _bad(f"row {row_number}: a categorical cell is not a declared key")
            texts = [row[i].strip() for i in vi]
            if not all(texts):
                if skip_missing:
                    stats.skipped += 1
                    continue
                raise _bad(f"row {row_number}: empty cell (use ?missing=skip to skip them)")
            for text in texts:
                try:
                    value = float(text)
                except ValueError:
                    raise _bad(f"row {row_number}: not a number") from None
                if not math.isfinite(value):
                    raise _bad(f"row {row_number}: not a finite number")
                rows.append(value)
            if ui is not None:
                assert key is not None
                units.append(unit_hash(key, unit))
            stats.rows += 1
            if len(rows) >= BATCH_VALUES:
                flush()
    except csv.Error:
        raise _bad(f"row {row_number + 1}: malformed CSV") from None
    if rows:
        flush()
    return stats


def _names(width: int) -> list[str]:
    return [f"v{i}" for i in range(width)]


def stage(conn: psycopg.Connection[Any], width: int) -> Batch:
    """A batch sink that copies rows into the temporary table ``upload_rows`` (unit hash,
    a 63-bit sort key from the CSPRNG, the values), inside ``conn``'s open transaction."""
    cols = ", ".join(f"{name} double precision NOT NULL" for name in _names(width))
    conn.execute(
        f"CREATE TEMPORARY TABLE upload_rows (unit bytea NOT NULL, r bigint NOT NULL, {cols}) "
        "ON COMMIT DROP"
    )
    rng = make_rng(None)
    names = ", ".join(_names(width))
    statement = f"COPY upload_rows (unit, r, {names}) FROM STDIN (FORMAT BINARY)"
    # PostgreSQL's binary COPY rows are fixed-width here: a field count, then each field as
    # a length and its big-endian bytes; a batch is one structured array (no Python per row).
    fields: list[tuple[str, str]] = [("count", ">i2"), ("ulen", ">i4"), ("unit", "S16")]
    fields += [("rlen", ">i4"), ("r", ">i8")]
    for i in range(width):
        fields += [(f"len{i}", ">i4"), (f"v{i}", ">f8")]
    row_type = np.dtype(fields)

    def copy_batch(units: list[bytes] | None, values: NDArray[np.float64]) -> None:
        assert units is not None
        rows = np.empty(len(units), dtype=row_type)
        rows["count"] = 2 + width
        rows["ulen"] = UNIT_HASH_BYTES
        rows["unit"] = np.frombuffer(b"".join(units), dtype="S16")
        rows["rlen"] = 8
        rows["r"] = rng.integers(0, 2**63 - 1, size=len(units), dtype=np.int64)
        for i in range(width):
            rows[f"len{i}"] = 8
            rows[f"v{i}"] = values[:, i]
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
) -> int:
    """Keep at most k rows per unit (counting, on an append, the rows already stored), feed
    the kept rows' values to ``builders`` (one per numeric column, in order) and record the
    units' new row counts. The caller holds the dataset row lock in ``conn``'s transaction.
    Returns the number of distinct units now stored."""
    params = {"id": dataset_id, "k": k, "append": append}
    query = _KEPT.format(values=", ".join(f"c.{v}" for v in _names(len(builders))))
    with conn.cursor(name=f"kept_{uuid.uuid4().hex}") as cur:
        cur.itersize = BATCH_VALUES
        cur.execute(query, params)
        while True:
            batch = cur.fetchmany(BATCH_VALUES)
            if not batch:
                break
            block = np.asarray(batch, dtype=np.float64).reshape(len(batch), len(builders))
            for i, builder in enumerate(builders):
                builder.add_values(np.ascontiguousarray(block[:, i]))
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
    "read_table_csv",
    "stage",
    "unit_hash",
]
