"""AQ: ApproximateQuantiles (Kaplan, Schnapp & Stemmer, ICML 2022).

Algorithm. Sort the clamped data once. A *node* is a contiguous index range of the sorted data,
an interval ``[left, right]`` of the output domain that contains those points, and a
contiguous run of the requested quantiles. The root holds all n points, ``[lower, upper]`` and
all m quantiles. At a node with points ``y_1 <= ... <= y_k`` the middle requested quantile
(1-based ``ceil(r/2)``-th of its ``r`` quantiles) is estimated by the single-quantile
exponential mechanism on the node alone: with the node's *relative* quantile
``q' = (q - Q_lo) / (Q_hi - Q_lo)`` (``Q_lo``, ``Q_hi`` the global quantiles that bound the
node, 0 and 1 at the root — the affine rescaling of KSS) the output ``v in [left, right]`` has
Lebesgue density proportional to ``exp(-c |#{y_i <= v} - q' k|)``. Then the points ``<= v``
with ``[left, v]`` and the quantiles below go to the left child, the points ``> v`` with
``[v, right]`` and the quantiles above to the right child. Children are index ranges into the
one sorted array: nothing is copied or re-sorted.

The bounds' cells. The public bounds are where clamping piles records up, and a pile
defeats AQ twice: the exponential mechanism weighs an output interval by its width, and the
pile's interval is one grid cell (raw values: zero width, never output) against gaps of
thousands of cells below; and a node made mostly of the pile has its rescaled targets inside
the pile's ranks, which no output at or below the pile meets (about half the pile off either
way). AQ took the gaps: hundreds of times the error on continuous data (docs/experiments.md
§10.5, §10.18). So AQ runs on a stretched grid: each end cell spans ``S = 2^s`` positions
(``s`` from :func:`app.mechanisms.histogram.stretch_bits` with no refinement: ``S >= 2^-7
K1`` on grids of at least 129 points, 1 below), the other cells one position each, and each
record of an end cell sits at one of its cell's positions, uniformly and independently (the
per-record jitter of :mod:`app.mechanisms.jointexp_smooth`); each output is mapped back to
the cell whose positions hold it. Inside a pile the positions then run through its ranks.
On raw values the domain reaches ``W = 2^-7 (upper - lower)`` beyond each bound, the records
at a bound are moved ``u W`` beyond it (``u`` uniform, per record) and the outputs are
clipped to the bounds. Privacy: the base measure depends on public figures only (and, in a
child node, on earlier outputs on the stretched grid, which the composition below
conditions on); with the offsets of shared records coupled, the spread data sets of two
neighbours are neighbours for every offsets, so the calibration below holds for each and
for their average; mapping back and clipping are post-processing.

Privacy calibration (derived here for both relations; checked in the tests by exact density
ratios). Let ``D`` be the number of levels of the recursion tree, which depends only on m
(``D = floor(log2 m) + 1``, never more than the ``ceil(log2 m) + 1`` levels budgeted by KSS),
and give every level ``eps_L = epsilon / D``.
Condition on all outputs of earlier levels: the nodes of a level are then fixed and their point
sets are disjoint (``<= v`` / ``> v`` splits), and each node's target ``q' k`` uses only its own
size ``k``. For one node, removing or adding a point changes the utility by at most
``Delta_i = max(q', 1 - q')`` and a swap inside the node by at most 1, so its density ratio is
at most ``exp(2 c Delta_i)`` resp. ``exp(2 c)``.

* add/remove: one point lies in at most one node of a level, so ``c = eps_L / (2 Delta_i)``
  makes every level eps_L-DP (parallel composition).
* swap: the removed and the added point can lie in two different nodes of one level (each sees
  an add/remove change) or in the same node (a swap). On a level with a single node
  ``c = eps_L / 2`` suffices (loss ``2c max(1, Delta) <= eps_L``). On a level with several nodes
  ``c = eps_L / (4 Delta_i)``: two nodes lose at most ``eps_L / 2`` each, and a swap inside one
  node loses ``2c = eps_L / (2 Delta_i) <= eps_L`` since ``Delta_i >= 1/2``.

Levels compose adaptively (basic composition of pure DP), so the whole release is
``epsilon``-DP under the requested relation. For m = 1 the algorithm is exactly the
single-quantile exponential mechanism with ``c = epsilon / (2 Delta)`` (``Delta = 1`` swap,
``max(q, 1 - q)`` add/remove), i.e. IndExp with one quantile.

Complexity: the sort is O(n log n); every level touches each point at most once (disjoint
index ranges), so the recursion is O(n D) = O(n log m) time and O(n) extra memory (one weight
buffer). Per point there is no transcendental call: the factors ``e^{-c d}`` come from two
small tables per node, and points whose factor is below ``2**-1000`` are not visited at all
(see :func:`app.mechanisms.exponential.fill_weights`), which makes a level cost
O(min(k, 700 / c)) per node. The inverse CDF sums blocks of 64 weights and scans only the
blocks and one block's weights.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.exponential import node_pick
from app.mechanisms.histogram import (
    BOUND_SHARE,
    Support,
    stretch_bits,
    stretched_points,
    support_from_values,
    unwarp_cells,
)
from app.mechanisms.jointexp_smooth import jitter_cells
from app.mechanisms.registry import Mechanism, PrivacyNotion, bounded_range_rho
from app.mechanisms.rng import make_rng, uniform_bits, uniform_integer
from app.mechanisms.validation import FloatArray, IntArray

#: An end cell's records are spread one raw word each up to this many; beyond, by
#: :func:`app.mechanisms.jointexp_smooth.jitter_cells` (one word each up to 2^(s+1), else its
#: binomial split).
SPREAD_LIGHT_MAX = 4096


def recursion_depth(m: int) -> int:
    """Number of levels of AQ's recursion tree on m quantiles (middle split ``ceil(r/2)``)."""
    depth = 0
    r = m
    while r > 0:
        depth += 1
        r = r // 2  # the larger child gets floor(r/2) quantiles (r - 1 - (r - 1)//2)
    return depth


def aq_core(
    sup: Support, rng: np.random.Generator, *, stretch: int | None = None
) -> FloatArray | IntArray:
    """AQ on a prepared support, the bounds' cells stretched and their records spread over
    them (module docstring).

    Grid: the run on the stretched grid, each output mapped back to its cell (``stretch``
    overrides :func:`stretch_bits`; tests use it on small grids). Values: the run on the
    domain ``[lower - W, upper + W]``, the outputs clipped to the bounds.
    """
    if sup.grid:
        k1 = int(sup.edges[-1])
        s = stretch_bits(k1, 0) if stretch is None else int(stretch)
        if s == 0 or k1 < 3:
            return _aq_tree(sup, rng)
        at = np.asarray(_aq_tree(_stretched_grid(sup, k1, s, rng), rng), dtype=np.int64)
        return unwarp_cells(at, k1, 0, s)
    lo, hi = sup.lower, sup.upper
    reach = BOUND_SHARE * (hi - lo)
    if not (np.isfinite(lo - reach) and np.isfinite(hi + reach)):  # bounds near the doubles' end
        return _aq_tree(sup, rng)
    values: FloatArray = np.clip(
        np.asarray(_aq_tree(_spread_values(sup, reach, rng), rng), np.float64), lo, hi
    )
    return values


def _with_arrays(sup: Support, edges: FloatArray, cum: IntArray) -> Support:
    """``sup``'s quantiles, epsilon and neighbours on other intervals and positions."""
    return Support(
        edges=edges, cum=cum, quantiles=sup.quantiles, epsilon=sup.epsilon,
        neighbors=sup.neighbors, grid=sup.grid,
    )  # fmt: skip


def _stretched_grid(sup: Support, k1: int, s: int, rng: np.random.Generator) -> Support:
    """The support on the stretched grid: inner cells moved by ``S - 1``, each record of an
    end cell at one of its ``S`` positions, uniformly and independently (the first cell's
    positions ``0 .. S - 1``, the last cell's from ``S + K1 - 2``; :func:`warp`)."""
    edges, cum = sup.edges, sup.cum
    d = edges.size - 2
    shift = float((1 << s) - 1)
    points = float(stretched_points(k1, 0, s))
    first = 1 if d and edges[1] == 0.0 else 0  # records in the first cell: one distinct value
    last = 1 if d > first and edges[-2] == float(k1 - 1) else 0
    if not (first or last):  # nothing to spread: every cell moves by S - 1
        moved = edges + shift
        moved[0], moved[-1] = 0.0, points
        return _with_arrays(sup, moved, cum)
    keys: list[FloatArray] = [np.zeros(1)]
    cums: list[IntArray] = [np.zeros(1, np.int64)]
    if first:  # positions 0 .. S - 1; the first cell's records are the first cum[1]
        spread, spread_counts = _spread_cell(int(cum[1]), s, rng)
        keys.append(spread)
        cums.append(np.cumsum(spread_counts))
    keys.append(edges[1 + first : d + 1 - last] + shift)
    cums.append(cum[1 + first : d + 1 - last])  # the records at or below each inner cell
    if last:  # positions from S + K1 - 2; the last cell's records are the last n - cum[d-1]
        spread, spread_counts = _spread_cell(int(cum[d] - cum[d - 1]), s, rng)
        keys.append(spread + float((1 << s) + k1 - 2))
        cums.append(cum[d - 1] + np.cumsum(spread_counts))
    keys.append(np.array([points]))
    moved, new_cum = np.concatenate(keys), np.concatenate(cums)
    return _with_arrays(sup, moved, new_cum)


def _spread_cell(count: int, s: int, rng: np.random.Generator) -> tuple[FloatArray, IntArray]:
    """``count`` records at independent uniform offsets ``0 .. 2^s - 1``: the distinct
    offsets (as doubles, increasing) and their counts. One raw word per record up to
    SPREAD_LIGHT_MAX records (no set-up: a grouped release spreads its groups' end cells one
    by one), else :func:`jitter_cells` (the same law)."""
    if count <= SPREAD_LIGHT_MAX:
        offsets, offset_counts = np.unique(uniform_bits(s, count, rng), return_counts=True)
        return offsets.astype(np.float64), offset_counts.astype(np.int64)
    fine, fine_counts = jitter_cells(np.zeros(1, np.int64), np.array([count]), s, rng)
    return fine.astype(np.float64), fine_counts


def _spread_values(sup: Support, reach: float, rng: np.random.Generator) -> Support:
    """The support with the records at ``lower`` moved to ``lower - reach u`` and those at
    ``upper`` to ``upper + reach u`` (``u`` uniform on [0, 1), 53 bits, per record), in the
    domain ``[lower - reach, upper + reach]``."""
    lo, hi = sup.lower, sup.upper
    values = sup.edges[1:-1]
    counts = np.diff(sup.cum)
    at_lo, at_hi = values <= lo, values >= hi
    n_lo, n_hi = int(counts[at_lo].sum()), int(counts[at_hi].sum())
    u = uniform_bits(53, n_lo + n_hi, rng).astype(np.float64) * 2.0**-53
    below, below_counts = np.unique(lo - reach * u[:n_lo], return_counts=True)
    above, above_counts = np.unique(hi + reach * u[n_lo:], return_counts=True)
    inner = ~(at_lo | at_hi)
    keys = np.concatenate(([lo - reach], below, values[inner], above, [hi + reach]))
    cnts = np.concatenate((below_counts, counts[inner], above_counts)).astype(np.int64)
    cum = np.zeros(cnts.size + 1, dtype=np.int64)
    np.cumsum(cnts, out=cum[1:])
    return _with_arrays(sup, keys, cum)


def _aq_tree(sup: Support, rng: np.random.Generator) -> FloatArray | IntArray:
    """AQ's recursion on a prepared support (distinct values with counts; values or grid).

    A node is a run ``edges[lo:hi]`` of distinct values with the domain ``[left, right]``;
    positions inside it are cumulative counts. On a grid support the domain is the grid
    points ``left .. right - 1`` (``right`` exclusive), the split point ``v`` is a uniform
    integer inside the chosen block, and the children get ``left .. v`` and ``v .. right - 1``
    (points ``<= v`` left, ``> v`` right, as for values).
    """
    edges = sup.edges
    cum = sup.cum
    qs = sup.quantiles
    m = int(qs.size)
    d = sup.d
    eps_level = sup.epsilon / recursion_depth(m)
    swap = sup.neighbors == "swap"
    grid = sup.grid
    buf = np.empty(d + 1, dtype=np.float64)
    out = np.empty(m, dtype=np.float64)

    # A node: (lo, hi) edges index range of its distinct values, [left, right] its domain
    # (grid: right exclusive), [qa, qb) its quantile indices, (q_lo, q_hi) the global
    # quantiles bounding it. Invariants: the nodes of one level have disjoint index ranges
    # and disjoint domains (up to shared endpoints); every value of a node lies in its domain.
    level: list[tuple[int, int, float, float, int, int, float, float]] = [
        (1, d + 1, float(edges[0]), float(edges[-1]), 0, m, 0.0, 1.0)
    ]
    while level:
        nxt: list[tuple[int, int, float, float, int, int, float, float]] = []
        single = len(level) == 1
        for lo, hi, left, right, qa, qb, q_lo, q_hi in level:
            mid = qa + (qb - qa - 1) // 2
            rel = (float(qs[mid]) - q_lo) / (q_hi - q_lo)
            rel = min(max(rel, 0.0), 1.0)
            sens = max(rel, 1.0 - rel)  # add/remove sensitivity of the node's utility
            if not swap:
                c = eps_level / (2.0 * sens)
            elif single:
                c = eps_level / 2.0
            else:
                c = eps_level / (4.0 * sens)
            k = hi - lo
            if right > left:
                j = node_pick(edges, cum, lo, hi, left, right, rel, c, rng, buf)
                if j < 0:
                    raise FloatingPointError("exponential-mechanism weights are all zero")
                a_j = left if j == 0 else float(edges[lo + j - 1])
                b_j = right if j == k else float(edges[lo + j])
                if grid:
                    v = float(uniform_integer(int(a_j), int(b_j), rng))
                else:
                    v = a_j + rng.random() * (b_j - a_j)
                    if v >= b_j:  # keep [a_j, b_j) half-open under rounding
                        v = float(np.nextafter(b_j, -np.inf))
                    v = max(v, a_j)
            else:  # zero-width domain (probability ~0 for values): the only possible output
                j, v = 0, left
            out[mid] = v
            if qa < mid:
                nxt.append(
                    (lo, lo + j, left, v + 1.0 if grid else v, qa, mid, q_lo, float(qs[mid]))
                )
            if mid + 1 < qb:
                nxt.append((lo + j, hi, v, right, mid + 1, qb, float(qs[mid]), q_hi))
        level = nxt
    # Outputs are nondecreasing by construction (children live inside [left, v] / [v, right]);
    # clip and sort only guard rounding.
    np.clip(out, sup.lower, sup.upper, out=out)
    out.sort()
    if grid:
        return out.astype(np.int64)
    return out


def aq(
    data: ArrayLike,
    quantiles: ArrayLike,
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str = "swap",
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """ApproximateQuantiles: recursive middle-quantile splitting with the exponential mechanism.

    Guarantee: epsilon-DP under the requested neighbour relation (swap or add/remove), with
    the per-level calibration derived in the module docstring (epsilon / D per level,
    ``c = eps_L / (4 max(q', 1-q'))`` on multi-node swap levels, ``eps_L / 2`` on single-node
    swap levels, ``eps_L / (2 max(q', 1-q'))`` under add/remove).

    Complexity: O(n log n) to sort and count, then O(d log m) for the recursion over the d
    distinct values; O(d) memory.

    Raises:
        MechanismInputError: for invalid data, quantiles, epsilon, bounds or neighbours.
    """
    sup = support_from_values(
        data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors
    )
    return np.asarray(aq_core(sup, make_rng(rng)), dtype=np.float64)


AQ = Mechanism(
    name="aq",
    fn=aq,
    core=aq_core,
    notion=PrivacyNotion.PURE_DP,
    summary="ApproximateQuantiles: recursive exponential-mechanism splitting (Kaplan et al. 2022).",
    zcdp_fn=lambda epsilon, _delta, m: (
        recursion_depth(m) * bounded_range_rho(epsilon / recursion_depth(m))
    ),
    zcdp_basis="D levels (D = floor(log2 m) + 1), each (epsilon/D)-bounded-range (its nodes' "
    "loss ranges add up to at most epsilon/D): rho = D (epsilon/D)^2/8 = epsilon^2/(8D)",
)
