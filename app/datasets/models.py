"""The ``dataset`` and ``dataset_data`` tables."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

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
        CheckConstraint("max_rows_per_unit BETWEEN 1 AND 10000", name="max_rows_per_unit"),
        CheckConstraint("max_groups_per_unit BETWEEN 1 AND 10000", name="max_groups_per_unit"),
        CheckConstraint(
            "privacy_unit IS NOT NULL OR (max_rows_per_unit = 1 AND max_groups_per_unit = 1)",
            name="unit_bounds",
        ),
        CheckConstraint(
            "bounded_by IS NULL OR bounded_by IN ('server', 'sender')", name="bounded_by"
        ),
        CheckConstraint("accounting IN ('pure', 'zcdp')", name="accounting"),
        CheckConstraint(
            "(accounting = 'zcdp') = (accounting_delta IS NOT NULL) "
            "AND (accounting_delta IS NULL OR (accounting_delta > 0 AND accounting_delta < 1))",
            name="accounting_delta",
        ),
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
    #: How releases compose: ``pure`` (epsilon and delta sum) or ``zcdp`` (rho sums; the
    #: guarantee is stated at ``accounting_delta``). Fixed at creation.
    accounting: Mapped[str] = mapped_column(String(8), server_default="pure")
    accounting_delta: Mapped[Decimal | None] = mapped_column(Numeric)
    #: Set by ``dpquant restore`` to the backup's time: releases are refused until an admin
    #: confirms what was spent since (the restored ledger does not hold it).
    restore_hold_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
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
    #: The column naming the person in uploads (migration 0012); NULL: each row is a unit.
    privacy_unit: Mapped[str | None] = mapped_column(String(200))
    #: k: rows one unit may contribute; releases are calibrated for a unit of k rows.
    max_rows_per_unit: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    #: L: groups one unit may touch (group-by).
    max_groups_per_unit: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    #: The per-dataset HMAC key under which unit ids are kept (never in clear).
    unit_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    #: Who kept the units at k rows (migration 0015): ``server`` (per-unit counts kept,
    #: appends allowed) or ``sender`` (a histogram bounded by ``dpquant ingest``).
    bounded_by: Mapped[str | None] = mapped_column(String(16))
    #: Rows dropped by the bounding, and distinct units kept (admins only).
    rows_dropped: Mapped[int | None] = mapped_column(BigInteger)
    units: Mapped[int | None] = mapped_column(BigInteger)
    #: The public schema, in declared order (migration 0014).
    columns: Mapped[list[DatasetColumn]] = relationship(
        order_by="DatasetColumn.position", lazy="selectin", cascade="all, delete-orphan"
    )


class DatasetData(Base):
    """The values of one dataset as a grid histogram, compressed in one ``bytea``.

    ``data`` is :func:`app.codec.histogram.encode_histogram` output: a 32-byte header
    (magic ``DPQH``, version 1, widths, distinct cells d, first cell, total count) and zlib
    of the byte-shuffled cell gaps and counts; O(d) bytes, independent of n. The column's
    storage is EXTERNAL (no second compression by PostgreSQL).
    """

    __tablename__ = "dataset_data"

    dataset_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("dataset.id"), primary_key=True)
    #: The numeric column these counts are of (migration 0014; ``value`` for one-column sets).
    column_name: Mapped[str] = mapped_column(
        String(200), primary_key=True, server_default=text("'value'")
    )
    data: Mapped[bytes] = mapped_column(LargeBinary)


class DatasetGroupData(Base):
    """The values of one numeric column within one key of one categorical column, as a grid
    histogram (the codec of :class:`DatasetData`), built at upload after the bounding
    (migration 0020): what a grouped release reads."""

    __tablename__ = "dataset_group_data"

    dataset_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("dataset.id", ondelete="CASCADE"), primary_key=True
    )
    group_column: Mapped[str] = mapped_column(String(200), primary_key=True)
    column_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    group_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class DatasetUnit(Base):
    """How many rows the stored values keep of one privacy unit (its id as HMAC-SHA256
    under the dataset's ``unit_key``): what keeps a unit at k rows across appends."""

    __tablename__ = "dataset_unit"
    __table_args__ = (CheckConstraint("rows >= 1", name="dataset_unit_rows"),)

    dataset_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("dataset.id", ondelete="CASCADE"), primary_key=True
    )
    unit_hash: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    rows: Mapped[int] = mapped_column(Integer)


class DatasetColumn(Base):
    """One declared column of a dataset's public schema (migration 0014).

    Numeric types (``numeric``, ``integer``) carry public bounds and an output grid and are
    stored as one grid histogram each (``DatasetData``); a categorical column carries its
    optional public key list. ``n_outside`` and ``n_cells`` describe the stored values
    (admins only).
    """

    __tablename__ = "dataset_column"
    __table_args__ = (
        CheckConstraint(
            "type IN ('numeric', 'integer', 'categorical')", name="dataset_column_type"
        ),
        CheckConstraint(
            "(type = 'categorical') = (lower IS NULL AND upper IS NULL AND granularity IS NULL)",
            name="dataset_column_bounds",
        ),
        UniqueConstraint("dataset_id", "position", name="uq_dataset_column_position"),
    )

    dataset_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("dataset.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(16))
    lower: Mapped[float | None] = mapped_column(Double)
    upper: Mapped[float | None] = mapped_column(Double)
    granularity: Mapped[float | None] = mapped_column(Double)
    keys: Mapped[list[str] | None] = mapped_column(JSONB)
    n_outside: Mapped[int | None] = mapped_column(BigInteger)
    n_cells: Mapped[int | None] = mapped_column(BigInteger)
    #: categorical: distinct keys in the stored per-key histograms (admins only; migration
    #: 0020); NULL: none built (values uploaded as a histogram, or none yet).
    keys_stored: Mapped[int | None] = mapped_column(BigInteger)

    @property
    def numeric(self) -> bool:
        return self.type != "categorical"
