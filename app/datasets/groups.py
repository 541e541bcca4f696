"""Per-key histograms of a table's categorical columns: what grouped releases read.

At upload, after the bounding, every kept row adds its numeric cells to the histogram of
(categorical column, its key there, numeric column). Keys are coded as small integers while
reading (:class:`KeyCodes`); the counts of (code, cell) pairs are kept sorted and merged as
they come (:class:`PairCounts`), so memory grows with the distinct pairs, never with n, and
10⁴ keys cost no more than their pairs (one dense counter per key would take 10⁴ grids).

Key values are data: they are stored server-side only, and reach a reader only as the keys a
release names (public keys, declared or typed by the caller).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import delete, distinct, func, select
from sqlalchemy.orm import Session

from app.codec.grid import cell_of
from app.codec.histogram import decode_histogram, encode_histogram, merge_histograms
from app.core.errors import DpquantError, invalid
from app.core.text import text_problem
from app.datasets.models import DatasetColumn, DatasetGroupData

IntArray = NDArray[np.int64]
#: The most distinct keys a categorical column may hold in the data (as declared keys).
MAX_KEYS = 10_000
#: Pending pairs are merged into the sorted counts once they outnumber them (and this many).
MERGE_PAIRS = 1 << 20


def refuse_body(problem: str) -> NoReturn:
    """An upload's key problem as a 422 on ``body`` (the default of :class:`KeyCodes`)."""
    raise invalid("body", problem)


class KeyCodes:
    """Codes 0, 1, ... for one categorical column's keys, in order of first sight (-1: a
    missing cell, which belongs to no group). A key PostgreSQL cannot store as text (a NUL
    character, an unpaired surrogate) or one past ``limit`` keys is refused through
    ``refuse``, by its problem, never by its value."""

    def __init__(
        self,
        name: str,
        limit: int = MAX_KEYS,
        refuse: Callable[[str], NoReturn] = refuse_body,
    ) -> None:
        self.name = name
        self.limit = limit
        self.refuse = refuse
        self.codes: dict[str, int] = {}
        self.keys: list[str] = []

    def code(self, key: object) -> int:
        if key is None:
            return -1
        assert isinstance(key, str)
        found = self.codes.get(key)
        if found is not None:
            return found
        problem = text_problem(key)
        if problem is not None:
            self.refuse(f"column {self.name!r}: a key {problem}")
        if len(self.keys) >= self.limit:
            self.refuse(f"column {self.name!r} holds more than {self.limit} distinct keys")
        self.codes[key] = len(self.keys)
        self.keys.append(key)
        return len(self.keys) - 1


@dataclass
class PairCounts:
    """Counts of (key code, grid cell) pairs, sorted by code then cell."""

    codes: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    cells: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    counts: IntArray = field(default_factory=lambda: np.empty(0, np.int64))
    _pending: list[tuple[IntArray, IntArray, IntArray]] = field(default_factory=list)
    _pending_size: int = 0

    def add(self, codes: IntArray, cells: IntArray, counts: IntArray | None = None) -> None:
        """Count each (code, cell) once (or ``counts`` times); codes < 0 are skipped."""
        keep = codes >= 0
        if not keep.all():
            codes, cells = codes[keep], cells[keep]
            counts = None if counts is None else counts[keep]
        if codes.size == 0:
            return
        if counts is None:
            counts = np.ones(codes.size, np.int64)
        self._pending.append(_reduce(codes, cells, counts))
        self._pending_size += int(self._pending[-1][0].size)
        if self._pending_size >= max(MERGE_PAIRS, self.codes.size):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        parts = [(self.codes, self.cells, self.counts), *self._pending]
        self.codes, self.cells, self.counts = _reduce(
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )
        self._pending.clear()
        self._pending_size = 0

    def per_code(self) -> dict[int, tuple[IntArray, IntArray]]:
        """Each code's histogram (cells strictly increasing, counts >= 1)."""
        self._merge()
        out: dict[int, tuple[IntArray, IntArray]] = {}
        if self.codes.size == 0:
            return out
        starts = np.flatnonzero(np.r_[True, self.codes[1:] != self.codes[:-1]])
        ends = np.r_[starts[1:], self.codes.size]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            out[int(self.codes[a])] = (self.cells[a:b].copy(), self.counts[a:b].copy())
        return out


def _reduce(
    codes: IntArray, cells: IntArray, counts: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """Sum the counts of equal (code, cell) pairs; sorted by code, then cell."""
    order = np.lexsort((cells, codes))
    codes, cells, counts = codes[order], cells[order], counts[order]
    new = np.r_[True, (codes[1:] != codes[:-1]) | (cells[1:] != cells[:-1])]
    starts = np.flatnonzero(new)
    return codes[starts], cells[starts], np.add.reduceat(counts, starts).astype(np.int64)


@dataclass
class GroupColumn:
    """One numeric column's grid, for the per-key counts."""

    name: str
    lower: float
    upper: float
    granularity: float


class GroupSink:
    """The per-key histograms of an upload: every (categorical column, numeric column)."""

    def __init__(
        self, numeric: list[GroupColumn], categorical: list[str], *, max_cells: int
    ) -> None:
        self.numeric = numeric
        self.keys = [KeyCodes(name) for name in categorical]
        self.max_cells = max_cells
        self.pairs = [[PairCounts() for _ in numeric] for _ in categorical]

    @property
    def active(self) -> bool:
        return bool(self.keys)

    def add(self, values: NDArray[np.float64], codes: IntArray) -> None:
        """``values``: rows x numeric columns; ``codes``: rows x categorical columns."""
        if not self.keys or values.shape[0] == 0:
            return
        for i, col in enumerate(self.numeric):
            cells = cell_of(np.ascontiguousarray(values[:, i]), col.lower, col.upper,
                            col.granularity)  # fmt: skip
            for g in range(len(self.keys)):
                self.pairs[g][i].add(np.ascontiguousarray(codes[:, g], dtype=np.int64), cells)

    def histograms(self) -> dict[tuple[str, str, str], tuple[IntArray, IntArray]]:
        """(categorical column, key, numeric column) -> (cells, counts)."""
        out: dict[tuple[str, str, str], tuple[IntArray, IntArray]] = {}
        for g, keys in enumerate(self.keys):
            for i, col in enumerate(self.numeric):
                for code, hist in self.pairs[g][i].per_code().items():
                    if hist[0].size > self.max_cells:
                        raise DpquantError(
                            413, "payload_too_large",
                            f"more than {self.max_cells} distinct grid cells in one group",
                        )  # fmt: skip
                    out[(keys.name, keys.keys[code], col.name)] = hist
        return out


def sink_for(columns: Sequence[DatasetColumn], *, max_cells: int) -> GroupSink:
    """The per-key sink of a table's schema (inactive without categorical columns)."""
    numeric = [
        GroupColumn(c.name, float(c.lower), float(c.upper), float(c.granularity))
        for c in columns
        if c.numeric and c.lower is not None and c.upper is not None and c.granularity
    ]
    categorical = [c.name for c in columns if not c.numeric]
    return GroupSink(numeric, categorical, max_cells=max_cells)


Histograms = dict[tuple[str, str, str], tuple[IntArray, IntArray]]


def store_groups(
    session: Session,
    *,
    dataset_id: uuid.UUID,
    columns: Sequence[DatasetColumn],
    groups: Histograms | None,
    append: bool,
) -> None:
    """Replace (or add to) the per-key histograms, in the caller's transaction (under the
    dataset row lock). ``groups`` None: an upload that carries no keys (a histogram, which
    only replaces): they are forgotten, and grouped releases are refused until rows are
    uploaded again."""
    categorical = [c for c in columns if not c.numeric]
    if not categorical:
        return
    if groups is None:
        session.execute(delete(DatasetGroupData).where(DatasetGroupData.dataset_id == dataset_id))
        for c in categorical:
            c.keys_stored = None
        return
    if append:
        stored = session.scalars(
            select(DatasetGroupData).where(DatasetGroupData.dataset_id == dataset_id)
        ).all()
        current = {(r.group_column, r.group_key, r.column_name): r for r in stored}
        for where, hist in groups.items():
            row = current.get(where)
            if row is None:
                session.add(_row(dataset_id, where, hist))
            else:
                row.data = encode_histogram(
                    *merge_histograms(decode_histogram(row.data), hist), level=1
                ).blob
    else:
        session.execute(delete(DatasetGroupData).where(DatasetGroupData.dataset_id == dataset_id))
        session.flush()
        session.add_all([_row(dataset_id, where, hist) for where, hist in groups.items()])
    session.flush()
    for c in categorical:
        c.keys_stored = int(
            session.scalar(
                select(func.count(distinct(DatasetGroupData.group_key)))
                .where(DatasetGroupData.dataset_id == dataset_id)
                .where(DatasetGroupData.group_column == c.name)
            )
            or 0
        )


def store_key_histograms(
    session: Session,
    *,
    dataset_id: uuid.UUID,
    group_column: DatasetColumn,
    columns: Sequence[str],
    groups: dict[str, list[tuple[IntArray, IntArray]]],
) -> None:
    """Replace one categorical column's per-key histograms by uploaded ones (``columns``:
    the numeric columns each key's list follows), under the caller's dataset row lock."""
    session.execute(
        delete(DatasetGroupData)
        .where(DatasetGroupData.dataset_id == dataset_id)
        .where(DatasetGroupData.group_column == group_column.name)
    )
    session.flush()
    session.add_all(
        [
            _row(dataset_id, (group_column.name, key, name), hist)
            for key, hists in groups.items()
            for name, hist in zip(columns, hists, strict=True)
        ]
    )
    group_column.keys_stored = len(groups)
    session.flush()


def _row(
    dataset_id: uuid.UUID, where: tuple[str, str, str], hist: tuple[IntArray, IntArray]
) -> DatasetGroupData:
    group_column, key, column = where
    return DatasetGroupData(
        dataset_id=dataset_id,
        group_column=group_column,
        group_key=key,
        column_name=column,
        data=encode_histogram(hist[0], hist[1], level=1).blob,
    )


__all__ = [
    "MAX_KEYS",
    "GroupColumn",
    "GroupSink",
    "Histograms",
    "KeyCodes",
    "PairCounts",
    "sink_for",
    "store_groups",
    "store_key_histograms",
]
