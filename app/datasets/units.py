"""Value uploads for datasets with a privacy unit: at most k rows per unit, across appends.

A dataset that names a ``privacy_unit`` column takes its values as CSV with a header row that
carries that column and the value column. Each row's unit id is kept only as HMAC-SHA256
under the dataset's random ``unit_key`` (16 bytes of it), never in clear, and never reaches a
log, an error or a response (errors name the row, never a value or an id).

Contribution bounding runs in PostgreSQL, so memory stays bounded whatever the upload's size
(the bounding needs every row of a unit together): the rows stream into a temporary table
with a 63-bit sort key from the CSPRNG (:func:`app.mechanisms.rng.make_rng`), and each unit
keeps its ``k - already`` rows of smallest key (``already``: the rows the stored values keep
of it, from ``dataset_unit``; 0 on a replace), a uniformly random subset of its rows. The
kept values feed the histogram builder through a server-side cursor; ``dataset_unit`` is
updated in the same transaction, after the dataset row is locked, so concurrent appends
serialise and a unit never exceeds k.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg

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


_CREATE = (
    "CREATE TEMPORARY TABLE upload_rows (unit bytea NOT NULL, r bigint NOT NULL, "
    "value double precision NOT NULL) ON COMMIT DROP"
)


def stage_csv(
    conn: psycopg.Connection[Any],
    chunks: Iterable[bytes],
    *,
    key: bytes,
    unit_column: str,
    value_column: str,
    skip_missing: bool,
    max_values: int,
) -> BoundedUpload:
    """Stream a CSV with a header row into the temporary table ``upload_rows`` (unit hash,
    random sort key, value), inside ``conn``'s open transaction. Rows are counted from 1
    after the header; an empty value cell is skipped with ``skip_missing`` (and counted),
    an empty unit cell is an error naming its row."""
    reader = csv.reader(lines(chunks), strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise _bad("the CSV has no header row") from None
    except csv.Error:
        raise _bad("malformed CSV header") from None
    names = [h.strip() for h in header]
    if value_column not in names:
        raise invalid("query.column", "no such column in the CSV header")
    if unit_column not in names:
        raise _bad("the CSV header lacks the dataset's privacy_unit column")
    vi, ui = names.index(value_column), names.index(unit_column)
    stats = BoundedUpload()
    rng = make_rng(None)
    units: list[bytes] = []
    values: list[float] = []
    row_number = 0
    with conn.cursor() as cur:
        cur.execute(_CREATE)
        with cur.copy("COPY upload_rows (unit, r, value) FROM STDIN") as copy:

            def flush() -> None:
                keys = rng.integers(0, 2**63 - 1, size=len(values), dtype=np.int64)
                for u, r, v in zip(units, keys.tolist(), values, strict=True):
                    copy.write_row((u, r, v))
                units.clear()
                values.clear()

            try:
                for row_number, row in enumerate(reader, start=1):
                    if not row:
                        continue
                    if max(vi, ui) >= len(row):
                        raise _bad(f"row {row_number}: missing cell")
                    unit = row[ui].strip()
                    if not unit:
                        raise _bad(f"row {row_number}: empty privacy unit")
                    text = row[vi].strip()
                    if stats.rows + stats.skipped >= max_values:
                        raise too_many_values(max_values)
                    if not text:
                        if skip_missing:
                            stats.skipped += 1
                            continue
                        raise _bad(f"row {row_number}: empty cell (use ?missing=skip to skip them)")
                    try:
                        value = float(text)
                    except ValueError:
                        raise _bad(f"row {row_number}: not a number") from None
                    if not math.isfinite(value):
                        raise _bad(f"row {row_number}: not a finite number")
                    units.append(unit_hash(key, unit))
                    values.append(value)
                    stats.rows += 1
                    if len(values) >= BATCH_VALUES:
                        flush()
            except csv.Error:
                raise _bad(f"row {row_number + 1}: malformed CSV") from None
            if values:
                flush()
    return stats


_KEPT = """
    SELECT c.value FROM (
        SELECT unit, value, row_number() OVER (PARTITION BY unit ORDER BY r) AS rn
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
    builder: HistogramBuilder,
    stats: BoundedUpload,
    *,
    dataset_id: uuid.UUID,
    k: int,
    append: bool,
) -> int:
    """Keep at most k rows per unit (counting, on an append, the rows already stored), feed
    the kept values to ``builder`` and record the units' new row counts. The caller holds the
    dataset row lock in ``conn``'s transaction. Returns the number of distinct units now
    stored."""
    params = {"id": dataset_id, "k": k, "append": append}
    with conn.cursor(name=f"kept_{uuid.uuid4().hex}") as cur:
        cur.itersize = BATCH_VALUES
        cur.execute(_KEPT, params)
        while True:
            batch = cur.fetchmany(BATCH_VALUES)
            if not batch:
                break
            builder.add_values(np.fromiter((r[0] for r in batch), np.float64, len(batch)))
            stats.kept += len(batch)
    with conn.cursor() as cur:
        if not append:
            cur.execute("DELETE FROM dataset_unit WHERE dataset_id = %s", (dataset_id,))
        cur.execute(_APPEND_UNITS if append else _REPLACE_UNITS, params)
        cur.execute("SELECT count(*) FROM dataset_unit WHERE dataset_id = %s", (dataset_id,))
        row = cur.fetchone()
    return int(row[0]) if row else 0


__all__ = ["UNIT_HASH_BYTES", "BoundedUpload", "bound_rows", "stage_csv", "unit_hash"]
