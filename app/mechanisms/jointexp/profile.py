"""What a forward pass records of its rows for choosing a tilt: speed only.

Each row's maximum on the pass's common log scale, where it lies, and a coarse profile
(log values at ``PROFILE_POINTS`` columns spread over its span). Only the tilt choice reads
them (:func:`~app.mechanisms.jointexp.strategy.choose_tilt`), after an untilted linear pass
broke the range rule; the pass that then runs checks its own range, so nothing here
decides the law.
"""

from __future__ import annotations

import math

import numpy as np

from app.mechanisms.jointexp import kernels_linear as KL
from app.mechanisms.validation import FloatArray, IntArray

PROFILE_POINTS = 33  # columns per row a probe records for choosing a tilt


class Profile:
    """Per-row maxima, modes and profiles of one pass of ``m`` rows."""

    def __init__(self, m: int) -> None:
        # each row's maximum (common log scale) and where it is (a position)
        self.gmaxes = np.zeros(m)
        self.modes = np.zeros(m)
        # the values as recorded, their shift, and whether they are linear (see values)
        self.pos = np.zeros((m, PROFILE_POINTS))
        self.raw = np.full((m, PROFILE_POINTS), -math.inf)
        self.shift = np.zeros(m)
        self.linear = np.zeros(m, dtype=np.bool_)

    def record(
        self, j: int, lo: int, values: FloatArray, shift: float, logs: bool, pos: IntArray
    ) -> None:
        """Row j's profile: ``values`` (its sum over levels from global column ``lo``) at
        PROFILE_POINTS spread columns (:func:`~app.mechanisms.jointexp.kernels_linear.
        profile_columns`), for :attr:`values`."""
        if values.size == 0:
            return
        KL.profile_columns(values, pos, lo, self.pos[j - 1], self.raw[j - 1])
        self.shift[j - 1] = shift
        self.linear[j - 1] = not logs

    def slots(self, j: int) -> tuple[FloatArray, FloatArray]:
        """Where row j's profile goes (positions, values), for a kernel to fill."""
        return self.pos[j - 1], self.raw[j - 1]

    def copy_row(self, j: int, other: Profile) -> None:
        """Row j as ``other`` recorded it."""
        self.gmaxes[j - 1] = other.gmaxes[j - 1]
        self.modes[j - 1] = other.modes[j - 1]
        self.pos[j - 1] = other.pos[j - 1]
        self.raw[j - 1] = other.raw[j - 1]
        self.shift[j - 1] = other.shift[j - 1]
        self.linear[j - 1] = other.linear[j - 1]

    @property
    def values(self) -> FloatArray:
        """Each row's profile as logs on the common scale (-inf where none was recorded).

        Linear rows' values are logged here, once for all rows, rather than per row while
        the pass runs: only the tilt choice reads them, after a linear pass tripped. The
        same doubles as logging each row's values as it is formed (numpy's log is
        elementwise, then the row's ``shift`` is added).
        """
        vals = self.raw.copy()
        lin = self.linear
        if lin.any():
            with np.errstate(divide="ignore"):
                vals[lin] = np.log(vals[lin])
        return np.asarray(vals + self.shift[:, None], dtype=np.float64)
