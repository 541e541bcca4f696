"""Smoothed JointExp: JointExp on data jittered upward inside one public resolution step.

Why (issue 10 item 6; Lalanne, Garivier, Gribonval, "Private quantiles estimation in the
presence of atoms", 2022). On data with atoms (integers, ratings, points clamped to a bound)
JointExp's utility ``-sum_j |P_{i_j} - P_{i_{j-1}} - n_j|`` is flat: when the atoms are
larger than the target gaps ``n_j``, every sequence whose non-zero steps are all ``>= n_j``
has utility ``-(n - sum_j n_j) - 2 * (sum over the zero steps of n_j)``, whichever atoms it
uses, so JointExp spreads its output over many atoms. Moving every record by an independent
random offset turns each atom into a continuum of positions and restores a sharp optimum.

The mechanism, on a grid histogram (:meth:`Mechanism.run_grid`, the service's path):

1. Refine every grid step into ``R = 2^b`` sub-steps, ``b = min(10, 53 - ceil(log2 K1))``
   (K1 = grid_points: the refined grid has at most 2^53 points), lowered where needed so
   that the refined support has at most 2^22 cells: unless n <= 2^22 under swap neighbours
   (where n is public), ``K1 R <= 2^22`` (:func:`substep_bits`; public quantities only).
   Each record in cell ``k`` moves to the sub-cell ``k R + o`` with ``o`` uniform on
   ``{0 .. R - 1}``, independently per record: ``o`` is the top ``b`` bits of one raw
   generator word (:func:`app.mechanisms.rng.uniform_bits`), exactly uniform.
2. Run JointExp (:func:`app.mechanisms.jointexp.jointexp_core`, the exact grid sampler) on the
   refined histogram with grid_points ``K1 R``.
3. Return ``floor(y / R)`` for every output ``y``: back on the original grid.

The jitter is *upward* and narrower than one grid step, so it never moves a record out of its
cell: the refined quantile of level q lies in the cell holding the original quantile (the
smallest cell whose CDF reaches q), and step 3 lands exactly there. A symmetric jitter would
put the answer one cell too low about half of the time. Continuous data lose nothing: every
output is still a point of the original grid.

On raw values (``fn``, used by the experiments): each clamped value moves to ``x + w u`` with
``u`` uniform on the 53-bit grid of [0, 1) (raw words), JointExp runs with public bounds
``[lower, upper + w]``, and outputs are clipped to ``upper`` (an atom at the upper bound spreads
into ``[upper, upper + w)`` and is answered by ``upper`` itself). ``w`` is the method parameter
``smoothing`` (public, in data units; give the data's resolution, e.g. 1 for integers); the
default ``(upper - lower) * 2^-20`` is of the order of the service's default grid step.

Privacy: ε-DP for swap and add/remove neighbours, like JointExp. Fix the offsets of every
record (couple the noise: the same offset for every record the two neighbours share, the
changed record keeps its offset under swap, the extra record under add/remove gets its own).
For every fixed offset vector the jittered data sets are again neighbours under the same
relation, with the same public n (swap) and the same public bounds and quantiles, so
JointExp's guarantee applies: ``P[M(X) in S | u] <= e^ε P[M(X') in S | u]``. Averaging over
``u`` (independent of the data) gives ``P[M(X) in S] <= e^ε P[M(X') in S]``. The multiset of
jittered records has the same law whether the offsets are drawn per record or per position
(they are i.i.d.), so drawing them cell by cell is the same mechanism. Steps 3 and the clip
are post-processing. The floating-point caveat of JointExp (docs/mechanisms.md, "What
floating point still does") applies with d the number of distinct refined cells
(at most ``min(n, d R)``).

Cost: one raw word per record (O(n), unlike JointExp's O(d)), then JointExp on up to
``min(n, d R) <= 2^22`` distinct refined cells. The price of the work bound: on a fine grid
(the service's default, 2·10^6 + 1 points) with more than 2^22 records or add/remove
neighbours, R = 2 and the smoothing is weak; a grid step equal to the data's resolution
(e.g. granularity 1 for integers) keeps R = 2^10.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import GridHistogram, Support, support_from_grid, support_from_values
from app.mechanisms.jointexp import jointexp_core
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.rng import make_rng, uniform_bits
from app.mechanisms.validation import FloatArray, IntArray, check_bounds

#: Sub-steps per grid step: at most 2^SUBSTEP_BITS (fewer when the refined grid would pass
#: 2^53 points, or to bound the work, see :func:`substep_bits`).
SUBSTEP_BITS = 10
#: Work bound: the refined support has at most min(n, grid_points * 2^b) cells; b is lowered
#: until that is at most REFINED_MAX (from public quantities only).
REFINED_MAX = 1 << 22
#: Records jittered per vectorised chunk (bounds the temporary arrays to a few tens of MB).
CHUNK = 1 << 21
#: Default raw-value width as a fraction of (upper - lower).
DEFAULT_RELATIVE_WIDTH = 2.0**-20


def substep_bits(grid_points: int, n: int | None = None) -> int:
    """``b``: each grid step is refined into ``2^b`` sub-steps. Public quantities only.

    ``b = min(SUBSTEP_BITS, 53 - ceil(log2 grid_points))`` (the refined grid stays within 2^53
    exact points), and, unless ``n`` is given and ``n <= REFINED_MAX``, also
    ``b <= floor(log2(REFINED_MAX / grid_points))`` so that the refined support (at most
    ``min(n, grid_points 2^b)`` cells) stays below REFINED_MAX. ``n`` may be passed only when
    it is public, i.e. under swap neighbours; under add/remove b depends on the grid alone.
    """
    k1 = int(grid_points)
    b = max(0, min(SUBSTEP_BITS, 53 - (k1 - 1).bit_length()))
    if n is None or n > REFINED_MAX:
        cap = 0
        while k1 << (cap + 1) <= REFINED_MAX:
            cap += 1
        b = min(b, cap)
    return b


def jitter_cells(
    cells: IntArray, counts: IntArray, bits: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Move each record of cell ``k`` to ``k * 2^bits + o``, o uniform on [0, 2^bits) per record.

    Returns the refined (cells, counts), cells strictly increasing. One raw generator word per
    record, drawn in cell order (the law of the refined histogram is that of independent
    per-record offsets, which is what the privacy argument needs). O(n) words; the result has
    at most ``min(n, len(cells) * 2^bits)`` cells.
    """
    if bits == 0:
        return cells.astype(np.int64), counts.astype(np.int64)
    r = np.int64(1 << bits)
    keys: list[IntArray] = []
    cnts: list[IntArray] = []
    i, d = 0, cells.size
    while i < d:
        c = int(counts[i])
        if c > CHUNK:  # one heavy cell: histogram of its offsets, in pieces
            acc = np.zeros(int(r), dtype=np.int64)
            left = c
            while left:
                take = min(left, CHUNK)
                acc += np.bincount(uniform_bits(bits, take, rng).astype(np.int64), minlength=int(r))
                left -= take
            nz = np.flatnonzero(acc)
            keys.append(np.int64(cells[i]) * r + nz.astype(np.int64))
            cnts.append(acc[nz])
            i += 1
            continue
        j, total = i, 0
        while j < d and total + int(counts[j]) <= CHUNK:
            total += int(counts[j])
            j += 1
        rec = np.repeat(cells[i:j].astype(np.int64) * r, counts[i:j])
        rec += uniform_bits(bits, total, rng).astype(np.int64)
        u, uc = np.unique(rec, return_counts=True)
        keys.append(u)
        cnts.append(uc.astype(np.int64))
        i = j
    # chunks cover disjoint, increasing cell ranges: the concatenation is strictly increasing
    return np.concatenate(keys), np.concatenate(cnts)


def jointexp_smooth_core(
    sup: Support, rng: np.random.Generator, *, bits: int | None = None
) -> IntArray:
    """The grid mechanism on a prepared grid support (see the module docstring).

    ``bits`` overrides :func:`substep_bits` (tests use a small refinement to enumerate laws).
    """
    if not sup.grid:
        raise MechanismInputError("hist", "jointexp_smooth's core runs on a grid support")
    grid_points = int(sup.edges[-1])
    if bits is None:  # n is public under swap only
        b = substep_bits(grid_points, sup.n if sup.neighbors == "swap" else None)
    else:
        b = int(bits)
    if grid_points * (1 << b) > 2**53:
        raise MechanismInputError("grid_points", "the refined grid would exceed 2**53 points")
    cells = sup.edges[1:-1].astype(np.int64)
    counts = np.diff(sup.cum)
    fine_cells, fine_counts = jitter_cells(cells, counts, b, rng)
    fine = support_from_grid(
        GridHistogram(fine_cells, fine_counts, grid_points << b),
        sup.quantiles,
        epsilon=sup.epsilon,
        neighbors=sup.neighbors,
    )
    out = np.asarray(jointexp_core(fine, rng), dtype=np.int64)
    return out >> np.int64(b)  # floor(y / 2^b); order preserved


def jointexp_smooth(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
    smoothing: float | None = None,
) -> FloatArray:
    """Smoothed JointExp on raw values: jitter each clamped value up by ``U[0, w)``, JointExp.

    Guarantee: epsilon-DP (swap and add/remove), see the module docstring.
    Complexity: O(n log n) (the jittered values are almost all distinct), as JointExp on
    continuous data.

    Args:
        smoothing: the jitter width ``w`` in data units (public; > 0). Best set to the data's
            resolution (1 for integers); default ``(upper - lower) * 2^-20``.
        Other arguments as :func:`app.mechanisms.jointexp.jointexp`.

    Returns:
        The m estimates, ascending, inside [lower, upper].
    """
    lo, hi = check_bounds(lower, upper)
    if smoothing is None:
        w = (hi - lo) * DEFAULT_RELATIVE_WIDTH
    else:
        if isinstance(smoothing, bool) or not isinstance(smoothing, int | float | np.floating):
            raise MechanismInputError("smoothing", "must be a number")
        w = float(smoothing)
        if not (np.isfinite(w) and w > 0.0):
            raise MechanismInputError("smoothing", "must be a finite number > 0")
    top = hi + w
    if not np.isfinite(top):
        raise MechanismInputError("smoothing", "upper + smoothing must be a finite double")
    if not top > hi:
        top = float(np.nextafter(hi, np.inf))
    gen = make_rng(rng)
    # validate (and clamp) once through the ordinary path, then jitter the clamped values
    base = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lo, upper=hi, neighbors=neighbors
    )
    values = np.repeat(base.edges[1:-1], np.diff(base.cum))
    u = uniform_bits(53, values.size, gen).astype(np.float64) * 2.0**-53
    jittered = values + w * u
    sup = support_from_values(
        jittered, base.quantiles, epsilon=epsilon, lower=lo, upper=top, neighbors=neighbors
    )
    est = np.asarray(jointexp_core(sup, gen), dtype=np.float64)
    return np.minimum(est, hi)


JOINTEXP_SMOOTH = Mechanism(
    name="jointexp_smooth",
    fn=jointexp_smooth,
    core=jointexp_smooth_core,
    notion=PrivacyNotion.PURE_DP,
    summary="JointExp on data jittered upward within one grid step: for tied or clamped data "
    "(after Lalanne et al. 2022).",
    method_params=("smoothing",),
)

__all__: list[str] = [
    "JOINTEXP_SMOOTH",
    "jitter_cells",
    "jointexp_smooth",
    "jointexp_smooth_core",
    "substep_bits",
]
