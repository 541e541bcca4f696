"""The public grid of a dataset: ``lower + k * granularity`` for ``k = 0..K`` (numpy only).

A dataset is stored as counts per grid cell. The map from a value to its cell
(:func:`cell_of`) is per record and data-independent: it depends only on the public bounds
and granularity, so it is post-processing of each record and costs no privacy. It moves each
value by at most one grid step (half a step plus the rounding of one double division), which
is the whole accuracy cost of the grid.

Conventions (pinned; the release path and ``dpquant ingest`` rely on them):

- ``K = int((Decimal(repr(upper)) - Decimal(repr(lower))) / Decimal(repr(g)))``, evaluated
  in decimal with 60 significant digits, exactly as ``snap_to_grid`` does; the grid has
  ``K + 1`` points (:func:`grid_size`).
- ``cell_of(x) = clip(floor((clip(x, lower, upper) - lower) / g + 0.5), 0, K)`` in IEEE
  double arithmetic: one subtraction, one division, one addition, one floor. Spark SQL
  evaluates the same expression over ``DOUBLE`` with the same IEEE operations (Java's
  ``double`` is IEEE 754 binary64 with round-to-nearest-even, strict since Java 17), so the
  cells it computes are bit-identical (``tests/ingest`` proves it on adversarial inputs).
- ``grid_value(k) = float(Decimal(repr(lower)) + k * Decimal(repr(g)))``: the exact decimal
  grid point rounded once to a double — the numbers ``snap_to_grid`` releases.
"""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Significant digits of the decimal context (as in ``snap_to_grid``).
DECIMAL_DIGITS = 60
#: Powers of ten that are exact doubles (10**22 is the largest).
_EXACT_POWERS = 22
#: Integers below this magnitude are exact doubles.
_EXACT_INT = 2**53


def grid_steps(lower: float, upper: float, granularity: float) -> int:
    """``K``: the largest k with ``lower + k * granularity <= upper``, computed in decimal."""
    with localcontext() as ctx:
        ctx.prec = DECIMAL_DIGITS
        return int((Decimal(repr(upper)) - Decimal(repr(lower))) / Decimal(repr(granularity)))


def grid_size(lower: float, upper: float, granularity: float) -> int:
    """The number of grid points, ``K + 1``."""
    return grid_steps(lower, upper, granularity) + 1


def cell_of(values: ArrayLike, lower: float, upper: float, granularity: float) -> NDArray[np.int64]:
    """Each value's grid cell: clamp to [lower, upper], then the nearest index in [0, K].

    Args:
        values: finite numbers (callers reject NaN and infinities first; NaN would map to 0).
        lower, upper, granularity: the dataset's public grid.

    Returns:
        int64 cells, same shape as ``values``. ``floor(t + 0.5)`` rounds half up, which Spark
        SQL's ``FLOOR`` reproduces exactly (numpy's ``rint`` rounds half to even).

    O(n), no allocation beyond two temporaries of the input's size.
    """
    k_max = grid_steps(lower, upper, granularity)
    t = np.clip(np.asarray(values, dtype=np.float64), lower, upper)
    t -= lower
    t /= granularity
    t += 0.5
    np.floor(t, out=t)
    np.clip(t, 0, k_max, out=t)
    return t.astype(np.int64)


def grid_value(k: int, lower: float, granularity: float) -> float:
    """The grid point ``lower + k * granularity``, exact in decimal, rounded once to a double."""
    with localcontext() as ctx:
        ctx.prec = DECIMAL_DIGITS
        return float(Decimal(repr(lower)) + int(k) * Decimal(repr(granularity)))


def _scaled(x: float) -> tuple[int, int]:
    """``(m, e)`` with ``x == m * 10**-e`` exactly for the shortest decimal form of x."""
    sign, digits, exponent = Decimal(repr(x)).as_tuple()
    assert isinstance(exponent, int)  # finite
    mantissa = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    return mantissa, -exponent


def grid_values(cells: ArrayLike, lower: float, granularity: float) -> NDArray[np.float64]:
    """:func:`grid_value` of each cell, vectorised; bit-identical to the scalar function.

    Fast path (the common one): with ``lower = a·10^-e`` and ``g = b·10^-e`` for integers
    a, b, the grid point is the integer ``a + k·b`` scaled by ``10^-e``. When that integer
    stays below 2^53 and ``10^|e|`` is an exact double (|e| <= 22), one IEEE division (or
    multiplication) of two exact doubles is correctly rounded — the same double as the
    decimal route. Otherwise each distinct cell goes through the decimal route.
    """
    ks = np.asarray(cells, dtype=np.int64)
    if ks.size == 0:
        return np.empty(ks.shape, dtype=np.float64)
    a, ea = _scaled(lower)
    b, eb = _scaled(granularity)
    e = max(ea, eb)
    a *= 10 ** (e - ea)
    b *= 10 ** (e - eb)
    k_lo, k_hi = int(ks.min()), int(ks.max())
    biggest = max(abs(a), abs(k_lo * b), abs(k_hi * b), abs(a + k_lo * b), abs(a + k_hi * b))
    if biggest < _EXACT_INT and abs(e) <= _EXACT_POWERS:
        numer = (a + ks.astype(np.float64) * b) if b else np.full(ks.shape, float(a))
        # a, k*b and a + k*b are integers below 2^53: every intermediate above is exact.
        if e >= 0:
            return numer / float(10**e)
        return numer * float(10 ** (-e))
    unique, inverse = np.unique(ks, return_inverse=True)
    points = np.array([grid_value(int(k), lower, granularity) for k in unique], dtype=np.float64)
    return points[inverse].reshape(ks.shape)
