"""Reading per-key histogram uploads (what ``dpquant ingest --group-by`` sends).

The body (octet-stream, streamed) is a sequence of keys, each: a little-endian uint32 byte
length L (1 to 800), L bytes of UTF-8 key, then one section per named numeric column in the
request's order (an int64 pair count P >= 1, then P little-endian int64 (cell, count)
pairs). Every check names the key's position and the column, never a key or a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
from numpy.typing import NDArray

from app.codec.histogram import HistogramBuilder
from app.core.errors import DpquantError, invalid
from app.core.text import text_problem
from app.datasets.groups import MAX_KEYS
from app.datasets.histogram_upload import PAIR_BYTES, PairSink
from app.datasets.upload import blocks

IntArray = NDArray[np.int64]
#: The longest key in bytes (200 characters of up to 4 UTF-8 bytes).
MAX_KEY_BYTES = 800
#: Pairs read per batch of one section.
BATCH_PAIRS = 1 << 16


def _bad(problem: str) -> DpquantError:
    return invalid("body", problem)


class _Reader:
    """``read(n)``: exactly n bytes from a stream of chunks, or None at a clean end."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._blocks: Iterator[bytes] = iter(blocks(chunks))
        self._buf = b""
        self._pos = 0

    def read(self, n: int, what: str) -> bytes | None:
        while len(self._buf) - self._pos < n:
            nxt = next(self._blocks, None)
            if nxt is None:
                if len(self._buf) == self._pos:
                    return None
                raise _bad(f"the body ends inside {what}")
            self._buf = self._buf[self._pos :] + nxt
            self._pos = 0
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out


def read_groups_octet(
    chunks: Iterable[bytes],
    *,
    columns: list[str],
    builders: list[HistogramBuilder],
    declared: frozenset[str] | None,
    max_values: int,
    max_cells: int,
) -> dict[str, list[tuple[IntArray, IntArray]]]:
    """Every key's histograms, one per named column (in order). ``declared``: the column's
    public keys, if it has them (a key outside them is refused). ``builders`` make fresh
    builders on each column's grid (one per key and column)."""
    reader = _Reader(chunks)
    out: dict[str, list[tuple[IntArray, IntArray]]] = {}
    index = 0
    while True:
        head = reader.read(4, f"key {index}'s length")
        if head is None:
            break
        if index >= MAX_KEYS:
            raise _bad(f"more than {MAX_KEYS} keys")
        length = int.from_bytes(head, "little")
        if not 1 <= length <= MAX_KEY_BYTES:
            raise _bad(f"key {index}: its length must be 1 to {MAX_KEY_BYTES} bytes")
        raw = reader.read(length, f"key {index}")
        assert raw is not None
        try:
            key = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"key {index}: not UTF-8") from None
        if len(key) > 200:
            raise _bad(f"key {index}: longer than 200 characters")
        if (problem := text_problem(key)) is not None:
            raise _bad(f"key {index}: {problem}")
        if key in out:
            raise _bad(f"key {index}: repeats an earlier key")
        if declared is not None and key not in declared:
            raise _bad(f"key {index}: not one of the column's declared keys")
        hists = []
        for name, template in zip(columns, builders, strict=True):
            builder = HistogramBuilder(
                lower=template.lower, upper=template.upper,
                granularity=template.granularity, max_cells=max_cells,
            )  # fmt: skip
            sink = PairSink(builder, max_values=max_values, label=f"key {index}, column {name!r}")
            _section(reader, sink)
            hists.append(builder.result())
        out[key] = hists
        index += 1
    if not out:
        raise _bad("the upload holds no key")
    return out


def _section(reader: _Reader, sink: PairSink) -> None:
    head = reader.read(8, f"{sink.label}'s pair count")
    if head is None:
        raise _bad(f"the body ends before {sink.label}'s section")
    remaining = int.from_bytes(head, "little", signed=True)
    if remaining < 1:
        raise sink._fail("the section's pair count must be at least 1")
    while remaining:
        take = min(remaining, BATCH_PAIRS)
        data = reader.read(take * PAIR_BYTES, f"{sink.label}'s pairs")
        if data is None:
            raise _bad(f"the body ends inside {sink.label}'s pairs")
        pairs = np.frombuffer(data, dtype="<i8").reshape(-1, 2)
        sink.add(pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64))
        remaining -= take


def encode_groups(groups: dict[str, list[tuple[IntArray, IntArray]]]) -> Iterator[bytes]:
    """The body :func:`read_groups_octet` reads (what ``dpquant ingest`` sends)."""
    for key, hists in groups.items():
        raw = key.encode("utf-8")
        yield len(raw).to_bytes(4, "little") + raw
        for cells, counts in hists:
            yield int(cells.size).to_bytes(8, "little", signed=True)
            pairs = np.empty((cells.size, 2), dtype="<i8")
            pairs[:, 0], pairs[:, 1] = cells, counts
            yield pairs.tobytes()


def check_within(
    groups: dict[str, list[tuple[IntArray, IntArray]]],
    stored: list[tuple[IntArray, IntArray]],
    columns: list[str],
) -> None:
    """422 unless, per column, the keys' counts summed per cell stay within the column's
    stored histogram (a row counts in one key at most; rows without a key in none)."""
    for i, name in enumerate(columns):
        cells = np.concatenate([h[i][0] for h in groups.values()])
        counts = np.concatenate([h[i][1] for h in groups.values()])
        order = np.argsort(cells, kind="stable")
        cells, counts = cells[order], counts[order]
        starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]])
        cells, counts = cells[starts], np.add.reduceat(counts, starts)
        have_cells, have_counts = stored[i]
        at = np.searchsorted(have_cells, cells)
        found = (at < have_cells.size) & (have_cells[np.minimum(at, have_cells.size - 1)] == cells)
        ok = found & (counts <= have_counts[np.minimum(at, have_cells.size - 1)])
        if not ok.all():
            raise _bad(
                f"column {name!r}: the keys' counts exceed the column's stored values in some "
                "cell (upload the column's histogram first, from the same rows)"
            )


__all__ = ["MAX_KEY_BYTES", "check_within", "encode_groups", "read_groups_octet"]
