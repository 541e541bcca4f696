"""Grid histograms: the incremental builder used by every upload path and the storage codec.

Pure numpy/zlib, no database. A histogram is ``(cells, counts)``: int64 arrays, cells strictly
increasing inside ``[0, K]``, counts >= 1. Its size is O(distinct cells), never O(n).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.codec.grid import cell_of, grid_steps

IntArray = NDArray[np.int64]

#: Grids with at most this many points are counted in one dense int64 array (128 MiB).
DENSE_MAX_CELLS = 2**24
#: In sparse mode, pending per-block (cell, count) pairs are merged once this many pile up.
SPARSE_MERGE_PAIRS = 2**22


class TooManyCells(ValueError):
    """The histogram has more distinct cells than allowed."""


class CountOverflow(ValueError):
    """A count or the total does not fit the allowed range."""


def merge_pairs(cells: list[IntArray], counts: list[IntArray]) -> tuple[IntArray, IntArray]:
    """Sum counts of equal cells across several (cell, count) lists; O(p log p) for p pairs."""
    if not cells:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    c = np.concatenate(cells)
    w = np.concatenate(counts)
    if c.size == 0:
        return c.astype(np.int64), w.astype(np.int64)
    order = np.argsort(c, kind="stable")
    c = c[order]
    w = w[order]
    starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    return c[starts].astype(np.int64), np.add.reduceat(w, starts).astype(np.int64)


class HistogramBuilder:
    """Accumulates values (or ready-made pairs) into a grid histogram in bounded memory.

    Dense mode (``K + 1 <= DENSE_MAX_CELLS``): one int64 counter per grid point, each block
    added with ``bincount``. Sparse mode: each block is reduced to its distinct cells
    (``np.unique``) and the pending pairs are merged into the sorted result whenever they
    outnumber it (amortised O(n log d) time, O(d + block) memory). Memory never depends on n.
    """

    def __init__(
        self, *, lower: float, upper: float, granularity: float, max_cells: int | None = None
    ) -> None:
        self.lower = lower
        self.upper = upper
        self.granularity = granularity
        self.k_max = grid_steps(lower, upper, granularity)
        self.max_cells = max_cells
        self.n = 0
        self.n_outside = 0
        self._dense: IntArray | None = None
        if self.k_max + 1 <= DENSE_MAX_CELLS:
            self._dense = np.zeros(self.k_max + 1, dtype=np.int64)
        self._cells: IntArray = np.empty(0, np.int64)
        self._counts: IntArray = np.empty(0, np.int64)
        self._pending_cells: list[IntArray] = []
        self._pending_counts: list[IntArray] = []
        self._pending = 0

    def add_values(self, values: NDArray[np.float64]) -> None:
        """Count finite float64 values (the caller has rejected NaN and infinities)."""
        if values.size == 0:
            return
        self.n_outside += int(
            np.count_nonzero(values < self.lower) + np.count_nonzero(values > self.upper)
        )
        self.n += int(values.size)
        cells = cell_of(values, self.lower, self.upper, self.granularity)
        if self._dense is not None:
            if cells.size * 8 >= self._dense.size:
                self._dense += np.bincount(cells, minlength=self._dense.size)
            else:
                u, c = np.unique(cells, return_counts=True)
                self._dense[u] += c
            return
        u, c = np.unique(cells, return_counts=True)
        self._push(u, c.astype(np.int64))

    def add_pairs(self, cells: ArrayLike, counts: ArrayLike) -> None:
        """Add validated (cell, count) pairs: cells inside [0, K], counts >= 1."""
        cells_a = np.asarray(cells, dtype=np.int64)
        counts_a = np.asarray(counts, dtype=np.int64)
        if cells_a.size == 0:
            return
        self.n += int(counts_a.sum(dtype=np.int64))
        if self._dense is not None:
            np.add.at(self._dense, cells_a, counts_a)
            return
        self._push(cells_a, counts_a)

    def _push(self, cells: IntArray, counts: IntArray) -> None:
        self._pending_cells.append(cells)
        self._pending_counts.append(counts)
        self._pending += int(cells.size)
        if self._pending >= max(SPARSE_MERGE_PAIRS, self._cells.size):
            self._merge()

    def _merge(self) -> None:
        self._cells, self._counts = merge_pairs(
            [self._cells, *self._pending_cells], [self._counts, *self._pending_counts]
        )
        self._pending_cells.clear()
        self._pending_counts.clear()
        self._pending = 0
        self._check_cells(int(self._cells.size))

    def _check_cells(self, distinct: int) -> None:
        if self.max_cells is not None and distinct > self.max_cells:
            raise TooManyCells(f"more than {self.max_cells} distinct grid cells")

    @property
    def distinct_cells_so_far(self) -> int:
        """Distinct cells counted so far (exact in dense mode; a lower bound in sparse mode)."""
        if self._dense is not None:
            return int(np.count_nonzero(self._dense))
        return int(self._cells.size)

    def result(self) -> tuple[IntArray, IntArray]:
        """The histogram: (cells strictly increasing, counts >= 1)."""
        if self._dense is not None:
            cells = np.flatnonzero(self._dense).astype(np.int64)
            counts = self._dense[cells]
        else:
            self._merge()
            cells, counts = self._cells, self._counts
        self._check_cells(int(cells.size))
        return cells, counts


def merge_histograms(
    a: tuple[IntArray, IntArray], b: tuple[IntArray, IntArray]
) -> tuple[IntArray, IntArray]:
    """The sum of two histograms (an append)."""
    return merge_pairs([a[0], b[0]], [a[1], b[1]])


# --------------------------------------------------------------------------- storage codec

MAGIC = b"DPQH"
VERSION = 1
#: magic, version, delta width, count width, reserved, d, first cell, total count.
_HEADER = struct.Struct("<4sBBBxQqQ")
_WIDTHS = (1, 2, 4, 8)


def _width(max_value: int) -> int:
    for w in _WIDTHS:
        if max_value < 1 << (8 * w):
            return w
    raise CountOverflow("value too large for 64 bits")


def _shuffled(values: IntArray, width: int) -> bytes:
    """Little-endian bytes of ``values`` at ``width``, byte planes first (compresses better)."""
    raw = values.astype(f"<u{width}").view(np.uint8).reshape(-1, width)
    return raw.T.tobytes()


def _unshuffled(buf: bytes, count: int, width: int) -> IntArray:
    planes = np.frombuffer(buf, dtype=np.uint8).reshape(width, count)
    return np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(count).astype(np.int64)


@dataclass(frozen=True)
class EncodedHistogram:
    """The stored form: ``blob`` plus the figures kept next to it."""

    blob: bytes
    distinct: int
    total: int


def encode_histogram(cells: IntArray, counts: IntArray, *, level: int = 6) -> EncodedHistogram:
    """Compress a histogram: header + zlib(byte-shuffled cell deltas, byte-shuffled counts).

    Cell gaps and counts are stored at the narrowest of 1/2/4/8 bytes that holds their
    largest value; byte planes are written one after the other so that zlib sees long runs
    (most gaps are 1 and most high bytes are 0).
    """
    d = int(cells.size)
    total = int(counts.sum(dtype=np.int64)) if d else 0
    if d == 0:
        return EncodedHistogram(_HEADER.pack(MAGIC, VERSION, 1, 1, 0, 0, 0), 0, 0)
    gaps = np.diff(cells)
    gap_width = _width(int(gaps.max())) if gaps.size else 1
    count_width = _width(int(counts.max()))
    payload = _shuffled(gaps, gap_width) + _shuffled(counts, count_width)
    header = _HEADER.pack(MAGIC, VERSION, gap_width, count_width, d, int(cells[0]), total)
    return EncodedHistogram(header + zlib.compress(payload, level), d, total)


def decode_histogram(blob: bytes) -> tuple[IntArray, IntArray]:
    """Inverse of :func:`encode_histogram`."""
    magic, version, gap_width, count_width, d, first, _total = _HEADER.unpack_from(blob)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a version 1 grid histogram")
    if d == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    payload = zlib.decompress(blob[_HEADER.size :])
    split = (d - 1) * gap_width
    gaps = _unshuffled(payload[:split], d - 1, gap_width)
    counts = _unshuffled(payload[split:], d, count_width)
    cells = np.empty(d, dtype=np.int64)
    cells[0] = first
    np.cumsum(gaps, out=cells[1:])
    cells[1:] += first
    return cells, counts
