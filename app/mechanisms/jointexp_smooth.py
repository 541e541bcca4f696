"""Smoothed JointExp: JointExp on data jittered upward inside one public resolution step.

Why (Lalanne, Garivier, Gribonval, "Private quantiles estimation in the
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
   ``{0 .. R - 1}``, independently per record (:func:`jitter_cells`). A cell of at most
   ``2 R`` records (``LIGHT_FACTOR R``) draws its offsets one by one, each the top ``b`` bits
   of one raw generator word (:func:`app.mechanisms.rng.uniform_bits`), exactly uniform. A
   heavier cell draws its refined histogram directly: its count ``c`` is split over the
   binary tree of its sub-cells, each non-empty node sending ``Binomial(c', 1/2)`` of its
   ``c'`` records to its lower half (``R - 1`` draws at most, whatever ``c``). That is the law
   of the histogram of ``c`` independent uniform offsets (each record draws each bit of its
   offset with probability 1/2), i.e. ``Multinomial(c; 1/R, .., 1/R)``.
2. Stretch the two end cells (:func:`warp`): their sub-cells lie ``S = 2^s`` positions apart,
   ``S`` the smallest power of two at least ``BOUND_SHARE K1`` (``2^-7`` of the grid;
   :func:`stretch_bits`, public quantities only), so each end cell spans ``R S`` positions,
   the others ``R``, on a grid of ``2 R S + (K1 - 2) R`` points.
3. Run JointExp (:func:`app.mechanisms.jointexp.jointexp_core`, the exact grid sampler) on the
   refined, stretched histogram.
4. Return the original cell whose positions hold each output ``y`` (:func:`unwarp_cells`;
   ``floor(y / R)`` between the ends).

Why the stretch. The exponential mechanism weighs an output interval by its width. Values
clamped to a bound pile up on its grid cell, and on a fine grid that cell's R sub-cells are
shared by the whole pile, while the gaps between the records below span thousands of grid
steps: at the service's default grid (2·10^6 + 1 points), n = 2,845 and 16 % of the
records at the upper bound, the pile's intervals are ~10^5 times narrower, and the joint
draw gives up ~60 missed points per quantile to sit in wide gaps instead, pulling every
estimate below the pile down with it (measured: 113 missed points per quantile at m = 57,
ε = 0.74, against 27 on the same data without the pile; docs/experiments.md §10.17).
The bounds are where clamping piles values, and they are public: weighing each end cell as
``2^-7`` of the grid (a base measure fixed before the data are seen) removes the pull
(25 missed points there) and costs data without a pile almost nothing (the end cells then
hold ``2^-6`` of the measure and no record).

The jitter is *upward* and narrower than one grid step, so it never moves a record out of its
cell (the stretch keeps each cell's positions together and in order): the refined quantile
of level q lies in the cell holding the original quantile (the smallest cell whose CDF
reaches q), and step 4 lands exactly there. A symmetric jitter would put the answer one cell
too low about half of the time. Continuous data lose nothing: every
output is still a point of the original grid.

On raw values (``fn``, used by the experiments): each clamped value moves to ``x + w u`` with
``u`` uniform on the 53-bit grid of [0, 1) (raw words), except values at a bound, which move
over ``W = max(BOUND_SHARE (upper - lower), w)`` beyond it (``lower - W u``, ``upper + W u``);
JointExp runs with public bounds ``[lower - W, upper + W]`` and outputs are clipped to
``[lower, upper]`` (a pile at a bound is answered by the bound itself). ``w`` is the method
parameter ``smoothing`` (public, in data units; give the data's resolution, e.g. 1 for
integers); the default ``(upper - lower) * 2^-20`` is of the order of the service's default
grid step.

Privacy: ε-DP for swap and add/remove neighbours, like JointExp. Fix the offsets of every
record (couple the noise: the same offset for every record the two neighbours share, the
changed record keeps its offset under swap, the extra record under add/remove gets its own).
For every fixed offset vector the jittered data sets are again neighbours under the same
relation, with the same public n (swap) and the same public bounds, quantiles and (stretched)
grid, so JointExp's guarantee applies: ``P[M(X) in S | u] <= e^ε P[M(X') in S | u]``. Averaging over
``u`` (independent of the data) gives ``P[M(X) in S] <= e^ε P[M(X') in S]``. JointExp sees
only the refined histogram, so any way of drawing it with the law of the i.i.d. per-record
offsets' histogram is the same mechanism: offsets drawn cell by cell in sorted order
(light cells), or each heavy cell's count vector drawn as ``Multinomial(c; 1/R, .., 1/R)``
by the binomial tree (cells independent, as their records' offsets are). Which path a cell
takes depends on its count, but either path draws the same law, so the choice changes
nothing in the output's law. The stretch is a fixed increasing map of (cell, offset) pairs
to positions, chosen from public quantities (the grid size and ``R``): it maps neighbours to
neighbours and changes only JointExp's base measure, which any data-independent measure may
be. Step 4 and the clip
are post-processing. Floating point: the
light path is exact (integer words); the heavy path uses numpy's binomial sampler with
``p = 1/2`` (exact in binary), which computes in double precision (inversion for
``c' / 2 <= 30``, which also restarts on the far tail beyond ten standard deviations; BTPE
rejection above), so the split's law equals the multinomial only in exact arithmetic, as
JointExp's own sampler (docs/mechanisms.md, "What floating point still does"), whose caveat
applies with d the number of distinct refined cells (at most ``min(n, d R)``). If the draws
of one run depart from their exact laws by total variation ``eta`` in all, the guarantee
becomes ``(ε, (1 + e^ε) eta)``: the refined histogram's law moves by at most ``eta``.

Cost: the jitter does O(min(n, d R)) work, d the number of distinct cells, and never grows
with the count of one cell: a light cell takes at most ``2 R`` raw words, a heavy one at
most ``R - 1`` binomial draws (each O(1) expected time), plus a sort of the at most
``min(n, d R)`` refined cells; measured with the production generator, one cell of R = 2^10
sub-cells takes 0.05 ms at n = 10 and 0.8-0.9 ms at n = 5·10^7 and 10^9 (one raw word per
record before: 2.0 s and 49 s). Then JointExp on up to ``min(n, d R) <= 2^22`` distinct
refined cells. The bound ``d R <= 2^22`` is public (unless n <= 2^22 is public under swap),
but the work within it still depends on the data (through d and ``min(n, d R)``), and so
does JointExp's own run time. The price of the work bound: on a fine grid (the service's
default, 2·10^6 + 1 points) with more than 2^22 records or add/remove neighbours, R = 2 and
the smoothing is weak; a grid step equal to the data's resolution (e.g. granularity 1 for
integers) keeps R = 2^10. The raw-value path (``fn``, experiments only) still draws one
53-bit word per value: it sorts the n jittered values anyway.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import (
    BOUND_SHARE,
    GridHistogram,
    Support,
    stretch_bits,
    stretched_points,
    support_from_grid,
    support_from_values,
    unwarp_cells,
    warp,
)
from app.mechanisms.jointexp import jointexp_core
from app.mechanisms.registry import Mechanism, PrivacyNotion, pure_dp_rho
from app.mechanisms.rng import make_rng, uniform_bits
from app.mechanisms.validation import FloatArray, IntArray, check_bounds

#: Sub-steps per grid step: at most 2^SUBSTEP_BITS (fewer when the refined grid would pass
#: 2^53 points, or to bound the work, see :func:`substep_bits`).
SUBSTEP_BITS = 10
#: Work bound: the refined support has at most min(n, grid_points * 2^b) cells; b is lowered
#: until that is at most REFINED_MAX (from public quantities only).
REFINED_MAX = 1 << 22
#: Records (light path) or tree nodes (heavy path) per vectorised chunk: bounds the temporary
#: arrays to a few tens of MB.
CHUNK = 1 << 21
#: A cell with at most ``min(LIGHT_FACTOR * 2^bits, CHUNK)`` records is jittered record by
#: record with exact raw words; a heavier cell is split by at most 2^bits - 1 binomial draws
#: (:func:`jitter_cells`). 2: where the two paths cost the same (measured with the production
#: generator, R = 2^10: ~0.17 ms per cell of 2R records either way, the split ~0.2 ms per cell
#: whatever its count), so no cell costs more than about one split, and the exact path covers
#: every cell it can without being the slower one.
LIGHT_FACTOR = 2
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


def _jitter_light(
    cells: IntArray, counts: IntArray, r: np.int64, bits: int, rng: np.random.Generator
) -> tuple[list[IntArray], list[IntArray]]:
    """Exact path: one raw word per record (top ``bits`` bits), in cell order, by chunks of at
    most CHUNK records (a light cell holds at most CHUNK records)."""
    keys: list[IntArray] = []
    cnts: list[IntArray] = []
    i, d = 0, cells.size
    while i < d:
        j, total = i, 0
        while j < d and (j == i or total + int(counts[j]) <= CHUNK):
            total += int(counts[j])
            j += 1
        rec = np.repeat(cells[i:j].astype(np.int64) * r, counts[i:j])
        rec += uniform_bits(bits, total, rng).astype(np.int64)
        u, uc = np.unique(rec, return_counts=True)
        keys.append(u)
        cnts.append(uc.astype(np.int64))
        i = j
    return keys, cnts


def _split_heavy(
    cells: IntArray, counts: IntArray, bits: int, rng: np.random.Generator
) -> tuple[list[IntArray], list[IntArray]]:
    """Binomial path: split each count top-down over the binary tree of its 2^bits sub-cells.

    At level l every non-empty node (a cell with the top l bits of the offset fixed) holding
    ``c`` records sends ``Binomial(c, 1/2)`` of them to its lower half and the rest to its
    upper half: the law of ``c`` records each drawing its next offset bit uniformly and
    independently. One vectorised ``rng.binomial`` call per level and group of cells; empty
    nodes are dropped, so a cell costs at most ``2^bits - 1`` draws (one per inner node of the
    tree) whatever its count. Cells are grouped so that a level holds at most about CHUNK
    nodes (``min(c, 2^bits)`` per cell).
    """
    keys: list[IntArray] = []
    cnts: list[IntArray] = []
    cap = np.minimum(counts, np.int64(1) << np.int64(min(bits, 62)))  # leaves per cell, at most
    i, d = 0, cells.size
    while i < d:
        j, total = i, 0
        while j < d and (j == i or total + int(cap[j]) <= CHUNK):
            total += int(cap[j])
            j += 1
        k = cells[i:j].astype(np.int64)
        c = counts[i:j].astype(np.int64)
        for _ in range(bits):
            low = rng.binomial(c, 0.5).astype(np.int64)
            k = np.stack((2 * k, 2 * k + 1), axis=1).reshape(-1)  # children in key order
            c = np.stack((low, c - low), axis=1).reshape(-1)
            live = c > 0
            k, c = k[live], c[live]
        keys.append(k)
        cnts.append(c)
        i = j
    return keys, cnts


def jitter_cells(
    cells: IntArray, counts: IntArray, bits: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Move each record of cell ``k`` to ``k * 2^bits + o``, o uniform on [0, 2^bits) per record.

    Returns the refined (cells, counts): cells strictly increasing, int64, counts summing per
    original cell to its count. The law of the refined histogram is that of independent
    uniform per-record offsets, which is what the privacy argument needs; the work is
    O(min(n, d 2^bits)) for d = len(cells), never O(count of one cell):

    * a *light* cell (count <= ``min(LIGHT_FACTOR * 2^bits, CHUNK)``) draws one raw generator
      word per record (the top ``bits`` bits, :func:`app.mechanisms.rng.uniform_bits`; exact),
      in cell order;
    * a *heavy* cell's count ``c`` is split over its sub-cells by a top-down tree of
      ``Binomial(c', 1/2)`` draws (:func:`_split_heavy`; numpy's binomial sampler in double
      precision: ``Multinomial(c; 2^-bits, ..)``, the law of the offsets' histogram, in exact
      arithmetic), at most ``2^bits - 1`` draws whatever ``c``.

    The light cells are drawn first, then the heavy ones; the result has at most
    ``min(n, len(cells) * 2^bits)`` cells.
    """
    cells = np.asarray(cells, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if bits == 0:
        return cells.copy(), counts.copy()
    r = np.int64(1) << np.int64(bits)
    # light up to LIGHT_FACTOR * 2^bits records (capped at CHUNK for the temporaries' size)
    heavy = counts > min(LIGHT_FACTOR << bits, CHUNK)
    keys, cnts = _jitter_light(cells[~heavy], counts[~heavy], r, bits, rng)
    if heavy.any():
        hk, hc = _split_heavy(cells[heavy], counts[heavy], bits, rng)
        keys += hk
        cnts += hc
    if not keys:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    fine, fc = np.concatenate(keys), np.concatenate(cnts)
    if heavy.any() and not heavy.all():  # two sorted runs over disjoint cells: merge them
        order = np.argsort(fine, kind="stable")
        fine, fc = fine[order], fc[order]
    return fine, fc


def jointexp_smooth_core(
    sup: Support,
    rng: np.random.Generator,
    *,
    bits: int | None = None,
    stretch: int | None = None,
) -> IntArray:
    """The grid mechanism on a prepared grid support (see the module docstring).

    ``bits`` overrides :func:`substep_bits` and ``stretch`` :func:`stretch_bits` (tests use
    small values to enumerate laws).
    """
    if not sup.grid:
        raise MechanismInputError("hist", "jointexp_smooth's core runs on a grid support")
    grid_points = int(sup.edges[-1])
    if bits is None:  # n is public under swap only
        b = substep_bits(grid_points, sup.n if sup.neighbors == "swap" else None)
    else:
        b = int(bits)
    s = stretch_bits(grid_points, b) if stretch is None else int(stretch)
    points = stretched_points(grid_points, b, s)
    if points > 2**53:
        raise MechanismInputError("grid_points", "the refined grid would exceed 2**53 points")
    cells = sup.edges[1:-1].astype(np.int64)
    counts = np.diff(sup.cum)
    if cells.size == 0:  # no records (a grouped release's empty group): nothing to jitter
        fine = Support(
            edges=np.array([0.0, float(points)]), cum=np.zeros(1, dtype=np.int64),
            quantiles=sup.quantiles, epsilon=sup.epsilon, neighbors=sup.neighbors, grid=True,
        )  # fmt: skip
    else:
        fine_cells, fine_counts = jitter_cells(cells, counts, b, rng)
        fine = support_from_grid(
            GridHistogram(warp(fine_cells, grid_points, b, s), fine_counts, points),
            sup.quantiles,
            epsilon=sup.epsilon,
            neighbors=sup.neighbors,
        )
    out = np.asarray(jointexp_core(fine, rng), dtype=np.int64)
    return unwarp_cells(out, grid_points, b, s)  # the cell of each position; order preserved


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
    wide = max(BOUND_SHARE * (hi - lo), w)
    floor, ceiling = lo - wide, hi + wide
    if not (np.isfinite(floor) and np.isfinite(ceiling)):
        raise MechanismInputError("upper", "the bounds are too far apart for the raw-value path")
    gen = make_rng(rng)
    # validate (and clamp) once through the ordinary path, then jitter the clamped values:
    # those at a bound over a share BOUND_SHARE of the range beyond it, the others upward by w
    base = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lo, upper=hi, neighbors=neighbors
    )
    values = np.repeat(base.edges[1:-1], np.diff(base.cum))
    u = uniform_bits(53, values.size, gen).astype(np.float64) * 2.0**-53
    jittered = np.where(
        values <= lo, lo - wide * u, np.where(values >= hi, hi + wide * u, values + w * u)
    )
    sup = support_from_values(
        jittered, base.quantiles, epsilon=epsilon, lower=floor, upper=max(ceiling, top),
        neighbors=neighbors,
    )  # fmt: skip
    est = np.asarray(jointexp_core(sup, gen), dtype=np.float64)
    return np.clip(est, lo, hi)


JOINTEXP_SMOOTH = Mechanism(
    name="jointexp_smooth",
    fn=jointexp_smooth,
    core=jointexp_smooth_core,
    notion=PrivacyNotion.PURE_DP,
    summary="JointExp on data jittered upward within one grid step, the bounds' cells weighed "
    "as 2^-7 of the grid: for tied or clamped data (after Lalanne et al. 2022).",
    method_params=("smoothing",),
    zcdp_fn=lambda epsilon, _delta, _m: pure_dp_rho(epsilon),
    zcdp_basis="epsilon-DP (JointExp on randomly jittered records: a mixture of exponential "
    "mechanisms, whose bounded range is not claimed): rho = epsilon^2/2",
)

__all__: list[str] = [
    "BOUND_SHARE",
    "JOINTEXP_SMOOTH",
    "jitter_cells",
    "jointexp_smooth",
    "jointexp_smooth_core",
    "stretch_bits",
    "stretched_points",
    "substep_bits",
    "unwarp_cells",
    "warp",
]
