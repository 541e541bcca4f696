"""Datasets: creation, visibility, value parsing and upload, and the public output grid."""

from __future__ import annotations

import math
import secrets
import threading
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Any, cast

import numpy as np
import psycopg
from numpy.typing import NDArray
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.audit.service import record
from app.codec.histogram import (
    HistogramBuilder,
    IntArray,
    decode_histogram,
    encode_histogram,
    merge_histograms,
)
from app.core.errors import DpquantError, invalid, not_found
from app.core.principal import Principal
from app.datasets.groups import Histograms, store_groups
from app.datasets.models import Dataset, DatasetColumn, DatasetData, DatasetUnit
from app.datasets.schemas import CategoricalColumn, DatasetCreate

FloatArray = NDArray[np.float64]

#: The default grid has about this many steps across [lower, upper].
DEFAULT_GRID_STEPS = 10**6
#: Grids finer than this many steps cannot be indexed exactly by doubles.
MAX_GRID_STEPS = 2**52


# --------------------------------------------------------------------------- grid


def default_granularity(lower: float, upper: float) -> float:
    """The largest power of ten that is <= (upper - lower) / 10^6."""
    step = (upper - lower) / DEFAULT_GRID_STEPS
    if not step > 0.0:
        raise invalid("body.upper", "the bounds are too close together for a default grid")
    exponent = math.floor(math.log10(step))
    while 10.0**exponent > step:
        exponent -= 1
    while 10.0 ** (exponent + 1) <= step:
        exponent += 1
    grid = 10.0**exponent
    if not grid > 0.0:
        raise invalid("body.upper", "the bounds are too close together for a default grid")
    return grid


def snap_to_grid(
    values: FloatArray, *, lower: float, upper: float, granularity: float
) -> FloatArray:
    """Round each value to the nearest grid point ``lower + k * granularity`` in [lower, upper].

    Post-processing (no privacy cost). The grid point is evaluated exactly in decimal from
    the shortest decimal forms of ``lower`` and ``granularity`` and then rounded once to a
    double, so outputs are a fixed, data-independent set of doubles (and print nicely:
    ``86.9279``, not ``86.92790000000001``); the low-order bits of a sampled double cannot
    reveal a data point. Monotone, so sorted input stays sorted. O(m).
    """
    d_lower, d_step = Decimal(repr(lower)), Decimal(repr(granularity))
    with localcontext() as ctx:
        ctx.prec = 60
        k_max = int((Decimal(repr(upper)) - d_lower) / d_step)
        k = np.clip(np.rint((np.asarray(values, dtype=np.float64) - lower) / granularity), 0, k_max)
        out = np.array([float(d_lower + int(ki) * d_step) for ki in k], dtype=np.float64)
    np.clip(out, lower, upper, out=out)
    return out


# --------------------------------------------------------------------------- create and read


def _granularity(lower: float, upper: float, granularity: float | None, field: str) -> float:
    """A numeric column's grid step: the default for its bounds, or the declared one if the
    bounds hold at least one step and at most MAX_GRID_STEPS."""
    if granularity is None:
        return default_granularity(lower, upper)
    if granularity > upper - lower:
        raise invalid(field if field.endswith("granularity") else f"{field}.granularity",
                      "must not exceed upper - lower")  # fmt: skip
    if (upper - lower) / granularity > MAX_GRID_STEPS:
        raise invalid(field if field.endswith("granularity") else f"{field}.granularity",
                      "is too fine for these bounds")  # fmt: skip
    return granularity


def columns_of(session: Session, dataset_id: uuid.UUID) -> list[DatasetColumn]:
    """The dataset's declared columns, in order."""
    stmt = (
        select(DatasetColumn)
        .where(DatasetColumn.dataset_id == dataset_id)
        .order_by(DatasetColumn.position)
    )
    return list(session.scalars(stmt))


def _name_taken(session: Session, name: str, *, other_than: uuid.UUID | None = None) -> bool:
    """True when a dataset that is not archived already has ``name``."""
    stmt = select(Dataset.id).where(Dataset.name == name, Dataset.archived_at.is_(None))
    if other_than is not None:
        stmt = stmt.where(Dataset.id != other_than)
    return session.scalars(stmt).first() is not None


def _name_conflict() -> DpquantError:
    return DpquantError(409, "name_taken", "a dataset with this name already exists")


def create_dataset(
    session: Session, *, body: DatasetCreate, actor: Principal | None = None
) -> Dataset:
    """Insert the dataset (its initial grant is the caller's: the ledger depends on datasets,
    not the other way round). Names are unique among datasets that are not archived."""
    columns: list[DatasetColumn] = []
    for position, spec in enumerate(body.table()):
        if isinstance(spec, CategoricalColumn):
            columns.append(
                DatasetColumn(name=spec.name, position=position, type=spec.type, keys=spec.keys)
            )
            continue
        field = "body.granularity" if body.columns is None else f"body.columns[{position}]"
        columns.append(
            DatasetColumn(
                name=spec.name,
                position=position,
                type=spec.type,
                lower=spec.lower,
                upper=spec.upper,
                granularity=_granularity(spec.lower, spec.upper, spec.granularity, field),
            )
        )
    first = next(c for c in columns if c.numeric)
    assert first.lower is not None and first.upper is not None and first.granularity is not None
    if _name_taken(session, body.name):
        raise _name_conflict()
    dataset = Dataset(
        id=uuid.uuid4(),
        name=body.name,
        description=body.description,
        lower=first.lower,
        upper=first.upper,
        neighbors=body.neighbors,
        granularity=first.granularity,
        n=None,
        n_outside=None,
        n_cells=None,
        values_skipped=None,
        data_version=0,
        created_at=datetime.now(UTC),
        values_uploaded_at=None,
        frozen_at=None,
        archived_at=None,
        size_hint=body.size_hint,
        privacy_unit=body.privacy_unit,
        accounting=body.accounting,
        accounting_delta=body.delta if body.accounting == "zcdp" else None,
        max_rows_per_unit=body.max_rows_per_unit,
        max_groups_per_unit=body.max_groups_per_unit,
        unit_key=secrets.token_bytes(32) if body.privacy_unit is not None else None,
    )
    dataset.columns = columns
    session.add(dataset)
    try:
        session.flush()
    except IntegrityError:
        raise _name_conflict() from None
    record(
        session,
        actor=actor,
        action="dataset.create",
        target_type="dataset",
        target_id=dataset.id,
        details={
            "name": dataset.name,
            "lower": dataset.lower,
            "upper": dataset.upper,
            "neighbors": dataset.neighbors,
            "granularity": dataset.granularity,
            "size_hint": dataset.size_hint,
            "privacy_unit": dataset.privacy_unit,
            "max_rows_per_unit": dataset.max_rows_per_unit,
            "max_groups_per_unit": dataset.max_groups_per_unit,
            "columns": [c.name for c in columns],
        },
    )
    return dataset


def ensure_live(dataset: Dataset) -> None:
    """409 ``dataset_archived`` once the dataset is archived (no uploads, grants, queries)."""
    if dataset.archived_at is not None:
        raise DpquantError(
            409,
            "dataset_archived",
            "this dataset is archived: its ledger and releases can be read, nothing else",
        )


def update_dataset(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    name: str | None,
    description: str | None,
    size_hint: int | None = None,
    set_size_hint: bool = False,
) -> Dataset:
    """Rename, re-describe and/or set the public size hint (``set_size_hint``; None removes
    it) of a dataset that is not archived (recorded in the audit log)."""
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    ensure_live(dataset)
    changes: dict[str, Any] = {}
    if name is not None and name != dataset.name:
        if _name_taken(session, name, other_than=dataset.id):
            raise _name_conflict()
        changes["name"] = {"from": dataset.name, "to": name}
        dataset.name = name
    if description is not None and description != dataset.description:
        changes["description"] = "changed"
        dataset.description = description
    if set_size_hint and size_hint != dataset.size_hint:
        changes["size_hint"] = {"from": dataset.size_hint, "to": size_hint}
        dataset.size_hint = size_hint
    if changes:
        try:
            session.flush()
        except IntegrityError:
            raise _name_conflict() from None
        record(
            session,
            actor=principal,
            action="dataset.update",
            target_type="dataset",
            target_id=dataset.id,
            details=changes,
        )
    return dataset


def archive_dataset(session: Session, *, principal: Principal, dataset_id: uuid.UUID) -> Dataset:
    """Archive a dataset: delete its values, keep its ledger and releases, free its name.

    Idempotent (an archived dataset stays as it is). Takes the dataset row lock, so it
    serialises with uploads and reservations: a release reserved before it keeps its debit;
    one whose run had not started when the values went is marked ``failed``
    (``dataset_archived``) by its worker.
    """
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    if dataset.archived_at is not None:
        return dataset
    session.execute(delete(DatasetData).where(DatasetData.dataset_id == dataset.id))
    dataset.archived_at = datetime.now(UTC)
    session.flush()
    # delivered at commit: every release worker drops the dataset's cached arrays
    session.execute(select(func.pg_notify(ARCHIVED_CHANNEL, str(dataset.id))))
    record(
        session,
        actor=principal,
        action="dataset.archive",
        target_type="dataset",
        target_id=dataset.id,
        details={"name": dataset.name},
    )
    return dataset


def get_visible(
    session: Session, *, principal: Principal, dataset_id: uuid.UUID, for_update: bool = False
) -> Dataset:
    """The dataset if it exists and lies inside the key's scope; 404 otherwise."""
    if not principal.can_see(dataset_id):
        raise not_found("dataset")
    stmt = select(Dataset).where(Dataset.id == dataset_id)
    if for_update:
        stmt = stmt.with_for_update().execution_options(populate_existing=True)
    dataset = session.scalars(stmt).first()
    if dataset is None:
        raise not_found("dataset")
    return dataset


def list_visible(
    session: Session, *, principal: Principal, offset: int, limit: int
) -> list[Dataset]:
    """Datasets inside the key's scope, newest first."""
    stmt = select(Dataset)
    if principal.datasets is not None:
        stmt = stmt.where(Dataset.id.in_(principal.datasets))
    elif principal.scope is not None:
        stmt = stmt.where(Dataset.id == principal.scope)
    stmt = stmt.order_by(Dataset.created_at.desc(), Dataset.id).offset(offset).limit(limit)
    return list(session.scalars(stmt))


# --------------------------------------------------------------------------- histograms

#: The column of a dataset created in the one-column shape (and of every earlier one).
DEFAULT_COLUMN = "value"

Histogram = tuple[IntArray, IntArray]


def ensure_writable(dataset: Dataset, *, append: bool = False) -> None:
    """409 once the dataset is archived; a replace also once it is frozen by its first
    release. Appends stay open: a release records the data version it ran on, and a unit
    that already has its k rows gets no more (app.datasets.units)."""
    ensure_live(dataset)
    if dataset.frozen_at is not None and not append:
        raise DpquantError(
            409,
            "dataset_frozen",
            "values cannot be replaced after the first release (append with POST /values)",
        )


def column_builder(column: DatasetColumn, *, max_cells: int) -> HistogramBuilder:
    """An empty histogram on a numeric column's public grid."""
    assert column.lower is not None and column.upper is not None
    assert column.granularity is not None
    return HistogramBuilder(
        lower=column.lower,
        upper=column.upper,
        granularity=column.granularity,
        max_cells=max_cells,
    )


def new_builder(dataset: Dataset, *, max_cells: int) -> HistogramBuilder:
    """An empty histogram on ``dataset``'s public grid."""
    return HistogramBuilder(
        lower=dataset.lower,
        upper=dataset.upper,
        granularity=dataset.granularity,
        max_cells=max_cells,
    )


def driver(source: Session | psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The psycopg connection under ``source`` (a session's, inside its transaction)."""
    if not isinstance(source, Session):
        return source
    driver = source.connection().connection.driver_connection
    if driver is None:  # pragma: no cover - a pooled connection always has one
        raise RuntimeError("no database connection")
    return cast("psycopg.Connection[Any]", driver)


def _fetch_histogram(
    conn: psycopg.Connection[Any], *, dataset_id: uuid.UUID, column: str = DEFAULT_COLUMN
) -> tuple[int, Histogram] | None:
    """(data version, histogram of ``column``) read in PostgreSQL's binary format, or None."""
    with conn.cursor(binary=True) as cursor:
        cursor.execute(
            "SELECT d.data_version, v.data FROM dataset d "
            "JOIN dataset_data v ON v.dataset_id = d.id "
            "WHERE d.id = %s AND v.column_name = %s AND d.n IS NOT NULL",
            (dataset_id, column),
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return int(row[0]), decode_histogram(bytes(row[1]))


def store_histogram(
    session: Session,
    *,
    principal: Principal,
    dataset_id: uuid.UUID,
    histogram: Histogram,
    n_outside: int | None,
    skipped: int,
    append: bool,
    max_values: int,
    max_cells: int,
    upload: str = "values",
    media_type: str | None = None,
    size_bytes: int | None = None,
    rows_dropped: int | None = None,
    units: int | None = None,
    column: str | None = None,
    more: dict[str, tuple[Histogram, int | None]] | None = None,
    bounded_by: str | None = None,
    groups: Histograms | None = None,
) -> Dataset:
    """Replace (or, with ``append``, add to) the dataset's histogram, atomically.

    Takes the dataset row lock, so concurrent writers and the first release serialise;
    409 once the dataset is frozen or archived. ``n_outside`` None means unknown (histogram
    uploads); an append onto an unknown count stays unknown. The audit event records that
    an upload happened (``upload`` kind, replace or append, media type, body bytes) and
    nothing about the values: not even n, which is private under add_remove.
    ``rows_dropped`` and ``units``: a privacy-unit upload's bounding figures (admins only).
    ``column``: the numeric column ``histogram`` is of (default: the first); ``more``: the
    other numeric columns' (histogram, n_outside) of a table upload (every column holds the
    same rows, so the same n). ``bounded_by``: who kept the units at k rows (``server``:
    ``dataset_unit`` holds the counts; ``sender``: a bounded histogram, whose replace
    forgets every per-unit count). ``groups``: the per-key histograms of a table with
    categorical columns (:func:`~app.datasets.groups.store_groups`; None for uploads that
    carry no keys).
    """
    dataset = get_visible(session, principal=principal, dataset_id=dataset_id, for_update=True)
    ensure_writable(dataset, append=append)
    numeric = [c for c in dataset.columns if c.numeric]
    first = numeric[0] if column is None else next(c for c in numeric if c.name == column)
    parts = {first.name: (histogram, n_outside), **(more or {})}
    total: int | None = None
    for col in numeric:
        if col.name not in parts:
            continue
        (cells, counts), outside = parts[col.name]
        if append and dataset.n is not None:
            current = _fetch_histogram(driver(session), dataset_id=dataset_id, column=col.name)
            if current is not None:
                cells, counts = merge_histograms(current[1], (cells, counts))
            outside = None if outside is None or col.n_outside is None else outside + col.n_outside
        if cells.size == 0:
            raise invalid("body", "the upload contains no values")
        if cells.size > max_cells:
            raise DpquantError(
                413, "payload_too_large", f"more than {max_cells} distinct grid cells"
            )
        encoded = encode_histogram(cells, counts, level=1)
        if encoded.total > max_values:
            raise DpquantError(413, "payload_too_large", f"more than {max_values} values")
        stored = session.get(DatasetData, (dataset.id, col.name))
        if stored is None:
            session.add(DatasetData(dataset_id=dataset.id, column_name=col.name, data=encoded.blob))
        else:
            stored.data = encoded.blob
        col.n_outside, col.n_cells = outside, encoded.distinct
        if col is first:
            total = encoded.total
            dataset.n_outside, dataset.n_cells = outside, encoded.distinct
    store_groups(
        session, dataset_id=dataset.id, columns=dataset.columns, groups=groups,
        append=append and dataset.n is not None,
    )  # fmt: skip
    if append and dataset.n is not None:
        skipped += dataset.values_skipped or 0
    dataset.n = total
    dataset.values_skipped = skipped
    if bounded_by == "sender":  # the sender's own figures, if it gave them
        dataset.units, dataset.rows_dropped = units, rows_dropped
        session.execute(delete(DatasetUnit).where(DatasetUnit.dataset_id == dataset.id))
    elif units is not None:
        dataset.units = units
        earlier = (dataset.rows_dropped or 0) if append else 0
        dataset.rows_dropped = earlier + (rows_dropped or 0)
    if bounded_by is not None:
        dataset.bounded_by = bounded_by
    dataset.data_version += 1
    dataset.values_uploaded_at = datetime.now(UTC)
    session.flush()
    record(
        session,
        actor=principal,
        action="dataset.upload",
        target_type="dataset",
        target_id=dataset.id,
        details={
            "kind": upload,
            "mode": "append" if append else "replace",
            "media_type": media_type,
            "bytes": size_bytes,
        },
    )
    return dataset


#: NOTIFY channel: a dataset was archived (payload: its id); release workers drop its values.
ARCHIVED_CHANNEL = "dpquant_dataset_archived"


class ValuesCache:
    """A per-process LRU of loaded arrays, keyed by ``(dataset id, data version, kind)``.

    Safe without invalidation: a key names immutable content (ids are never reused, every
    upload bumps the version, and only committed versions can be read). Bounded in bytes.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, tuple[NDArray[Any], ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> tuple[NDArray[Any], ...] | None:
        """The cached arrays, or None."""
        with self._lock:
            arrays = self._items.get(key)
            if arrays is not None:
                self._items.move_to_end(key)
            return arrays

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held."""
        return self._bytes

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def drop_dataset(self, dataset_id: uuid.UUID) -> int:
        """Forget every array of ``dataset_id`` (it was archived); returns the bytes freed."""
        with self._lock:
            gone = [key for key in self._items if key[0] == dataset_id]
            freed = 0
            for key in gone:
                freed += sum(a.nbytes for a in self._items.pop(key))
            self._bytes -= freed
            return freed

    def put(self, key: CacheKey, arrays: tuple[NDArray[Any], ...]) -> None:
        """Remember ``arrays`` (skipped when larger than the whole cache)."""
        size = sum(a.nbytes for a in arrays)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = arrays
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= sum(a.nbytes for a in evicted)


CacheKey = tuple[uuid.UUID, int, str]

#: The process-wide cache; its size is set from ``DPQUANT_VALUES_CACHE_BYTES`` when a release
#: worker starts (the processes that load values). Archiving a dataset drops its arrays in
#: every worker (:data:`ARCHIVED_CHANNEL`).
VALUES_CACHE = ValuesCache(max_bytes=256 * 1024 * 1024)


def _current_version(conn: psycopg.Connection[Any], *, dataset_id: uuid.UUID) -> int | None:
    row = conn.execute(
        "SELECT data_version FROM dataset WHERE id = %s AND n IS NOT NULL", (dataset_id,)
    ).fetchone()
    return None if row is None else int(row[0])


def load_histogram(
    source: Session | psycopg.Connection[Any],
    *,
    dataset_id: uuid.UUID,
    version: int | None = None,
    column: str = DEFAULT_COLUMN,
) -> tuple[int, IntArray, IntArray] | None:
    """The dataset's data version, cells (strictly increasing) and counts (>= 1), or None
    when nothing was uploaded. The arrays are read-only (shared by the process cache).

    ``source``: a session (read inside its transaction) or a psycopg connection (a release
    worker's). One small version query (skipped when the caller read ``version``, the data
    version of a dataset with values, in a statement of its own); the histogram comes from
    :data:`VALUES_CACHE` or is fetched in PostgreSQL's binary format and decoded (about
    25 ms for 10^6 distinct cells).
    """
    if version is None:
        version = _current_version(driver(source), dataset_id=dataset_id)
    if version is None:
        return None
    key = (dataset_id, version, "histogram" if column == DEFAULT_COLUMN else f"histogram:{column}")
    cached = VALUES_CACHE.get(key)
    if cached is not None:
        return version, cached[0], cached[1]
    fetched = _fetch_histogram(driver(source), dataset_id=dataset_id, column=column)
    if fetched is None:
        return None
    version, (cells, counts) = fetched
    cells.flags.writeable = False  # shared through the cache: nobody may change them
    counts.flags.writeable = False
    VALUES_CACHE.put(key, (cells, counts))
    return version, cells, counts
