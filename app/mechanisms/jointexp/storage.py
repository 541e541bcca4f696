"""Where a forward pass keeps its rows: whole, compact, or as checkpoints to recompute from.

Rows are stored while they fit a memory budget (``MEMORY_BUDGET_BYTES``); beyond it, those
stored stay and of the later rows only every ~sqrt(m)-th is kept, the others recomputed
block by block during the backward pass (:meth:`RowStore.get`, by the pass's own step: the
same operations on the same values, so the same doubles). Linear rows with repeat levels
may also be kept compact (level 1 and the sum over levels); a draw replays the levels at the
interval it picks (:func:`stored_levels_at`), again as the same doubles. Law-relevant only
in that a recomputed or replayed value must equal the value first formed, which both
functions' docstrings argue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.jointexp.rows import Row
from app.mechanisms.validation import FloatArray

MEMORY_BUDGET_BYTES = 256 * 2**20  # rows kept in full while they fit; checkpoints beyond
#: Linear rows are stored whole (every repeat level) while the stored rows take at most this
#: much, and compact beyond (level 1 and the sum over levels; a draw replays the levels at
#: the interval it picks, :func:`stored_levels_at`). Replaying walks the chain of compact rows
#: down to a whole one in Python, ~1 us per row for each draw (~11 % of a run at n = 10^3,
#: m = 99). Whole rows cost memory that a plain process gives back to the OS after each run
#: and faults in again on the next: 32 MiB kept that case whole (24 MiB instead of 4) and
#: ran 5x slower in a plain process. 1 MiB keeps the small queries whole (n = 10^3, m = 9:
#: 0.4 MiB); at d = 10^6 rows of 8 MiB and more are compacted from the second one on.
COMPACT_FROM_BYTES = 2**20


class RowStore:
    """The rows of one pass of ``m`` rows, kept within ``budget`` bytes (see the module)."""

    def __init__(self, m: int, budget: int) -> None:
        self.m = m
        self.budget = budget
        self.block = max(1, math.isqrt(m - 1) + 1)  # ~sqrt(m) rows per checkpoint block
        self.rows: dict[int, Row] = {}
        self.cache: dict[int, Row] = {}
        self.checkpointing = False
        self.switch = 0  # the first row stored past the budget (0: none yet)
        self.stored_bytes = 0

    def clear(self) -> None:
        """Forget every row (a pass that goes on as a probe keeps none)."""
        self.rows, self.cache, self.stored_bytes = {}, {}, 0

    def is_checkpoint(self, j: int) -> bool:
        """Whether row j is a checkpoint: kept whole, a block is recomputed from it."""
        return j == 1 or j == self.m or (j - 1) % self.block == 0 or j == self.switch

    def store(self, j: int, row: Row) -> None:
        self.rows[j] = row
        self.stored_bytes += row.nbytes
        if not self.checkpointing and self.stored_bytes > self.budget:
            # The rows stored so far stay: the draws reach them without recomputing. From
            # row j on only checkpoints are kept, row j among them (whole: the block after
            # it is recomputed from it). Dropping every stored row here instead made the
            # draws recompute the whole pass once the rows passed the budget: n = 10^6 with
            # 20 % at one inner point, m = 99, stores ~360 MB of compact rows; ~70 % of
            # them fit 256 MiB and need no recomputing.
            self.checkpointing = True
            self.switch = j

    def served(self, j: int, row: Row, linear: bool) -> None:
        """Row ``j`` (``row``) has served row j + 1: drop it past the budget unless it is a
        checkpoint, or keep a linear row compact once the stored rows take memory."""
        if self.checkpointing and not self.is_checkpoint(j) and j in self.rows:
            self.stored_bytes -= self.rows.pop(j).nbytes
        elif (
            linear
            and not self.checkpointing
            and self.stored_bytes > COMPACT_FROM_BYTES
            and row.levels.shape[0] > 1
            and not self.is_checkpoint(j)
            and j in self.rows
        ):
            # The draws need its sum over levels and, at the one interval each picks, its
            # levels, which level 1 of this and the earlier rows determine
            # (stored_levels_at). Checkpoint rows stay whole (a block is recomputed from
            # them), and so do all rows while the stored rows take little memory
            # (COMPACT_FROM_BYTES).
            self.stored_bytes -= row.nbytes
            self.rows[j] = row.compact()
            self.stored_bytes += self.rows[j].nbytes

    def get(self, j: int, step: Callable[[Row, int], Row]) -> Row:
        """Row j, recomputing its checkpoint block by ``step`` when it was not kept."""
        if j in self.rows:
            return self.rows[j]
        if j in self.cache:
            return self.cache[j]
        j0 = max(jj for jj in self.rows if jj < j)
        self.cache = {}
        row = self.rows[j0]
        for jj in range(j0 + 1, j + 1):
            row = step(row, jj)
            self.cache[jj] = row
        return row


class RowSource(Protocol):
    """A pass whose rows can be read back (:class:`~app.mechanisms.jointexp.forward.Forward`)."""

    @property
    def w(self) -> FloatArray: ...

    @property
    def prune(self) -> float: ...

    def get(self, j: int) -> Row: ...


_NO_LEVELS = np.zeros(0)


def stored_levels_at(fwd: RowSource, j: int, g: int, nlev: int) -> FloatArray:
    """alpha(j, g, k) for k = 1..nlev of a linear row, as its pass formed them, exactly.

    A compact row keeps level 1 only; level k + 1 at interval g is level k of row j - 1 at g
    times ``w_g * (stay_j / (k + 1))``, kept where not below the pass's prune floor times
    level 1 (as :func:`~app.mechanisms.jointexp.kernels_linear.linear_levels_step` forms
    it): the same floating-point operations on the same values, so the same doubles. The
    chain of compact rows down to a complete one (or to level 1) is walked here; the levels
    are formed back up it in one compiled call
    (:func:`~app.mechanisms.jointexp.kernels_linear.replay_levels`).
    """
    firsts: list[float] = []
    stays: list[float] = []
    base = _NO_LEVELS
    need = nlev
    while True:
        row = fwd.get(j)
        v = g - row.lo
        inside = 0 <= v < row.levels.shape[1]
        if not row.nlev:  # complete: its levels at g end the chain
            base = row.levels_at(v, need) if inside else np.zeros(need)
            break
        firsts.append(float(row.levels[0, v]) if inside else 0.0)
        stays.append(row.stay)
        if need == 1:
            break
        j -= 1
        need -= 1
    out = np.empty(nlev)
    KL.replay_levels(np.array(firsts), np.array(stays), base, float(fwd.w[g]), fwd.prune, out)
    return out
