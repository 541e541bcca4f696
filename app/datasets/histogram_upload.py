"""Reading grid-histogram uploads: (cell, count) pairs for one column or for every numeric
column of a table.

One column: little-endian int64 pairs (16 bytes each) or ``{"cells": [...], "counts":
[...]}``. Several columns (named, in order, by the request): each column's section is an
int64 pair count P followed by its P pairs; in JSON, an object keyed by column name whose
values have the one-column shape. Every check names the column and the pair; no message
carries a count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.codec.histogram import HistogramBuilder
from app.core.errors import DpquantError, invalid
from app.datasets.upload import blocks, too_many_values

PAIR_BYTES = 16


def _bad(problem: str) -> DpquantError:
    return invalid("body", problem)


class PairSink:
    """Validates (cell, count) pairs and adds them to a builder, enforcing the value limit.
    ``label``: how messages name the column (empty for a one-column upload)."""

    def __init__(self, builder: HistogramBuilder, *, max_values: int, label: str = "") -> None:
        self.builder = builder
        self.max_values = max_values
        self.label = label
        self.pairs = 0

    def _fail(self, problem: str) -> DpquantError:
        return _bad(f"{self.label}: {problem}" if self.label else problem)

    def add(self, cells: NDArray[np.int64], counts: NDArray[np.int64]) -> None:
        k_max = self.builder.k_max
        bad = (cells < 0) | (cells > k_max)
        if bad.any():
            where = self.pairs + int(np.argmax(bad))
            raise self._fail(f"pair {where}: cell outside the grid [0, {k_max}]")
        bad = counts < 1
        if bad.any():
            where = self.pairs + int(np.argmax(bad))
            raise self._fail(f"pair {where}: count must be at least 1")
        # counts >= 1 and each <= 2^63 - 1: compare before summing to avoid overflow
        if int(counts.max(initial=0)) > self.max_values or (
            self.builder.n + int(counts.sum(dtype=np.float64)) > self.max_values
        ):
            raise too_many_values(self.max_values)
        self.builder.add_pairs(cells, counts)
        self.pairs += int(cells.size)


def _pairs(data: bytes, offset: int, count: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    pairs = np.frombuffer(data, dtype="<i8", count=2 * count, offset=offset).reshape(-1, 2)
    return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)


def read_histogram_octet(chunks: Iterable[bytes], sink: PairSink) -> None:
    """Little-endian int64 pairs ``(cell, count)``, 16 bytes each; pair i counts from 0."""
    carry = b""
    seen = False
    for block in blocks(chunks):
        seen = True
        data = carry + block if carry else block
        usable = len(data) - len(data) % PAIR_BYTES
        carry = data[usable:]
        if usable:
            sink.add(*_pairs(data, 0, usable // PAIR_BYTES))
    if not seen:
        raise _bad("the upload is empty")
    if carry:
        raise _bad("octet-stream length must be a multiple of 16 (int64 cell, int64 count)")


def read_sections_octet(chunks: Iterable[bytes], sinks: Sequence[PairSink]) -> None:
    """One section per sink, in order: a little-endian int64 pair count P >= 1, then P
    pairs. Streamed: memory is one block whatever the sections' sizes."""
    carry = b""
    section = 0
    remaining = 0  # pairs still due in the current section; 0: its count comes next
    for block in blocks(chunks):
        data = carry + block if carry else block
        pos = 0
        while True:
            if remaining == 0:
                if section == len(sinks):
                    if pos < len(data):
                        raise _bad(f"more than {len(sinks)} sections (one per named column)")
                    break
                if len(data) - pos < 8:
                    break
                remaining = int.from_bytes(data[pos : pos + 8], "little", signed=True)
                pos += 8
                if remaining < 1:
                    raise sinks[section]._fail("the section's pair count must be at least 1")
            take = min(remaining, (len(data) - pos) // PAIR_BYTES)
            if take == 0:
                break
            sinks[section].add(*_pairs(data, pos, take))
            pos += take * PAIR_BYTES
            remaining -= take
            if remaining == 0:
                section += 1
        carry = data[pos:]
    if section < len(sinks) or carry:
        where = sinks[min(section, len(sinks) - 1)].label
        raise _bad(
            f"the body ends inside {where}'s section: each named column needs an int64 pair "
            "count, then that many 16-byte (cell, count) pairs"
        )


def _load(body: bytes) -> Any:
    def reject(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(body, parse_constant=reject)
    except (ValueError, RecursionError):
        raise _bad("malformed JSON") from None


def _json_pairs(data: Any, sink: PairSink, where: str) -> None:
    if not isinstance(data, dict) or set(data) != {"cells", "counts"}:
        raise invalid(where, 'expected {"cells": [...], "counts": [...]}')
    arrays = []
    for name in ("cells", "counts"):
        items = data[name]
        if not isinstance(items, list):
            raise invalid(f"{where}.{name}", "expected an array of integers")
        for i, v in enumerate(items):
            if type(v) is not int or not -(2**63) <= v < 2**63:
                raise invalid(f"{where}.{name}", f"index {i}: not a 64-bit integer")
        arrays.append(np.asarray(items, dtype=np.int64))
    if arrays[0].size != arrays[1].size:
        raise invalid(f"{where}.counts", f"must have as many entries as {where}.cells")
    if arrays[0].size == 0:
        raise invalid(where, "the histogram is empty")
    sink.add(arrays[0], arrays[1])


def read_histogram_json(body: bytes, sink: PairSink) -> None:
    """``{"cells": [...], "counts": [...]}`` of equal length, integers only."""
    _json_pairs(_load(body), sink, "body")


def read_sections_json(body: bytes, sinks: dict[str, PairSink]) -> None:
    """``{"<column>": {"cells": [...], "counts": [...]}, ...}``: exactly the named columns."""
    data = _load(body)
    if not isinstance(data, dict):
        raise _bad('expected {"<column>": {"cells": [...], "counts": [...]}, ...}')
    for name in data:
        if name not in sinks:
            raise invalid("body", f"column {name!r} is not named by ?column=")
    for name, sink in sinks.items():
        if name not in data:
            raise invalid("body", f"no histogram for column {name!r}")
        _json_pairs(data[name], sink, f"body.{name}")
