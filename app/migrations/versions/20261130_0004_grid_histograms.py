"""grid histograms: datasets are stored as (cell, count) pairs on their public grid

Until this revision ``dataset_data.data`` held the sorted values as little-endian float64
(8 bytes per value). From it on, it holds the dataset's grid histogram, compressed (O(distinct
cells) bytes): each value clamped to [lower, upper] and mapped to the nearest grid point
``lower + k * granularity``. ``dataset`` gains ``n_cells`` (distinct cells) and
``values_skipped`` (missing cells skipped at upload).

Upgrade converts every stored dataset (n and n_outside are unchanged: the histogram holds all
n values). Downgrade expands each histogram back to sorted float64 values — the grid points,
not the original values, which the histogram no longer has.

The grid and codec code is copied here (not imported from ``app``) so that this revision
keeps meaning the same thing when the application changes; it must match
``app/codec/grid.py`` and ``app/codec/histogram.py`` at version 1 of the format.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 09:50:00
"""

import struct
import zlib
from collections.abc import Sequence
from decimal import Decimal, localcontext

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HEADER = struct.Struct("<4sBBBxQqQ")


def _k_max(lower: float, upper: float, g: float) -> int:
    with localcontext() as ctx:
        ctx.prec = 60
        return int((Decimal(repr(upper)) - Decimal(repr(lower))) / Decimal(repr(g)))


def _cells(values: np.ndarray, lower: float, upper: float, g: float) -> np.ndarray:
    t = (np.clip(values, lower, upper) - lower) / g + 0.5
    return np.clip(np.floor(t), 0, _k_max(lower, upper, g)).astype(np.int64)


def _width(v: int) -> int:
    return next(w for w in (1, 2, 4, 8) if v < 1 << (8 * w))


def _shuffled(values: np.ndarray, width: int) -> bytes:
    return values.astype(f"<u{width}").view(np.uint8).reshape(-1, width).T.tobytes()


def _encode(cells: np.ndarray, counts: np.ndarray) -> bytes:
    d = int(cells.size)
    if d == 0:
        return _HEADER.pack(b"DPQH", 1, 1, 1, 0, 0, 0)
    gaps = np.diff(cells)
    gw = _width(int(gaps.max())) if gaps.size else 1
    cw = _width(int(counts.max()))
    header = _HEADER.pack(b"DPQH", 1, gw, cw, d, int(cells[0]), int(counts.sum()))
    return header + zlib.compress(_shuffled(gaps, gw) + _shuffled(counts, cw), 1)


def _decode(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    magic, version, gw, cw, d, first, _ = _HEADER.unpack_from(blob)
    assert magic == b"DPQH" and version == 1
    if d == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    payload = zlib.decompress(blob[_HEADER.size :])

    def plane(buf: bytes, count: int, width: int) -> np.ndarray:
        raw = np.frombuffer(buf, np.uint8).reshape(width, count).T
        return np.ascontiguousarray(raw).view(f"<u{width}").reshape(count).astype(np.int64)

    gaps = plane(payload[: (d - 1) * gw], d - 1, gw)
    counts = plane(payload[(d - 1) * gw :], d, cw)
    cells = np.concatenate(([first], first + np.cumsum(gaps))).astype(np.int64)
    return cells, counts


def _grid_value(k: int, lower: float, g: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 60
        return float(Decimal(repr(lower)) + int(k) * Decimal(repr(g)))


def _rows(conn: sa.Connection) -> list[tuple[object, float, float, float]]:
    return [
        (r[0], r[1], r[2], r[3])
        for r in conn.execute(
            sa.text(
                "SELECT d.id, d.lower, d.upper, d.granularity FROM dataset d "
                "JOIN dataset_data v ON v.dataset_id = d.id ORDER BY d.id"
            )
        )
    ]


def _blob(conn: sa.Connection, dataset_id: object) -> bytes:
    return bytes(
        conn.execute(
            sa.text("SELECT data FROM dataset_data WHERE dataset_id = :d"), {"d": dataset_id}
        ).scalar_one()
    )


def upgrade() -> None:
    op.add_column("dataset", sa.Column("n_cells", sa.BigInteger(), nullable=True))
    op.add_column("dataset", sa.Column("values_skipped", sa.BigInteger(), nullable=True))
    conn = op.get_bind()
    for dataset_id, lower, upper, g in _rows(conn):  # one dataset in memory at a time
        values = np.frombuffer(_blob(conn, dataset_id), dtype="<f8")
        cells, counts = np.unique(_cells(values, lower, upper, g), return_counts=True)
        conn.execute(
            sa.text("UPDATE dataset_data SET data = :b WHERE dataset_id = :d"),
            {"b": _encode(cells.astype(np.int64), counts.astype(np.int64)), "d": dataset_id},
        )
        conn.execute(
            sa.text("UPDATE dataset SET n_cells = :c, values_skipped = 0 WHERE id = :d"),
            {"c": int(cells.size), "d": dataset_id},
        )
    # The histogram is compressed already: keep PostgreSQL from trying again (pglz).
    op.execute("ALTER TABLE dataset_data ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    conn = op.get_bind()
    for dataset_id, lower, _upper, g in _rows(conn):
        cells, counts = _decode(_blob(conn, dataset_id))
        points = np.array([_grid_value(int(k), lower, g) for k in cells], dtype=np.float64)
        values = np.repeat(points, counts).astype("<f8")
        conn.execute(
            sa.text("UPDATE dataset_data SET data = :b WHERE dataset_id = :d"),
            {"b": values.tobytes(), "d": dataset_id},
        )
    op.execute("ALTER TABLE dataset_data ALTER COLUMN data SET STORAGE EXTENDED")
    op.drop_column("dataset", "values_skipped")
    op.drop_column("dataset", "n_cells")
