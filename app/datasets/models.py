"""The ``dataset`` and ``dataset_data`` tables."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base


class Dataset(Base):
    """A dataset's public description; its row is the lock that serialises releases.

    ``n``, ``n_outside`` (values outside [lower, upper] before clamping), ``n_cells`` (distinct
    grid cells) and ``values_skipped`` (empty CSV cells / Parquet nulls skipped with
    ``?missing=skip``) are computed at upload and shown to admins only. ``data_version``
    increases with every upload so a release can tell whether the values it loaded before
    taking the lock are still current.
    """

    __tablename__ = "dataset"
    __table_args__ = (
        CheckConstraint("lower < upper", name="bounds"),
        CheckConstraint("granularity > 0", name="granularity"),
        CheckConstraint("neighbors IN ('swap', 'add_remove')", name="neighbors"),
        CheckConstraint("size_hint IS NULL OR size_hint > 0", name="size_hint"),
        # Names are unique among the datasets that are not archived (migration 0005).
        Index(
            "uq_dataset_name_live",
            "name",
            unique=True,
            postgresql_where=text("archived_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text)
    lower: Mapped[float] = mapped_column(Double)
    upper: Mapped[float] = mapped_column(Double)
    neighbors: Mapped[str] = mapped_column(String(16))
    granularity: Mapped[float] = mapped_column(Double)
    n: Mapped[int | None] = mapped_column(BigInteger)
    n_outside: Mapped[int | None] = mapped_column(BigInteger)
    n_cells: Mapped[int | None] = mapped_column(BigInteger)
    values_skipped: Mapped[int | None] = mapped_column(BigInteger)
    data_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    values_uploaded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    frozen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Archived: values deleted, ledger and releases kept, name free, no uploads or queries.
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    #: Admin-declared public size (migration 0006): what the planner uses under add_remove,
    #: where n is private. Never derived from the values.
    size_hint: Mapped[int | None] = mapped_column(BigInteger)


class DatasetData(Base):
    """The values of one dataset as a grid histogram, compressed in one ``bytea``.

    ``data`` is :func:`app.codec.histogram.encode_histogram` output: a 32-byte header
    (magic ``DPQH``, version 1, widths, distinct cells d, first cell, total count) and zlib
    of the byte-shuffled cell gaps and counts; O(d) bytes, independent of n. The column's
    storage is EXTERNAL (no second compression by PostgreSQL).
    """

    __tablename__ = "dataset_data"

    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
