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
(see :func:`_fill_weights`), which makes a level cost O(min(k, 700 / c)) per node. The
inverse CDF sums blocks of 64 weights and scans only the blocks and one block's weights.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import ArrayLike

from app.mechanisms.base import (
    FloatArray,
    Mechanism,
    PrivacyNotion,
    make_rng,
    prepare,
)


def recursion_depth(m: int) -> int:
    """Number of levels of AQ's recursion tree on m quantiles (middle split ``ceil(r/2)``)."""
    depth = 0
    r = m
    while r > 0:
        depth += 1
        r = r // 2  # the larger child gets floor(r/2) quantiles (r - 1 - (r - 1)//2)
    return depth


#: Weights below ``2**-1000`` (widths normalised by the node's domain, so every weight <= 1)
#: are not formed; the row maximum must then be at least ``2**-900`` (else the exact log-domain
#: path is used), so every dropped weight is below ``2**-100`` times the row maximum — far
#: inside the package's exactness standard (each weight within ``2**-50`` x row max).
_LOG_CUT = 1000.0 * math.log(2.0)
_MIN_TOP = 2.0**-900


@numba.njit(cache=True, nogil=True, inline="always")
def _width(edges: FloatArray, lo: int, k: int, j: int, left: float, right: float) -> float:
    """Width of interval j of the node (points ``edges[lo:lo+k]``, domain [left, right])."""
    a = left if j == 0 else edges[lo + j - 1]
    b = right if j == k else edges[lo + j]
    return b - a


@numba.njit(cache=True, nogil=True)
def _fill_weights(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Linear-domain weights ``(width_j / (right - left)) e^{-c |j - target|}`` near the target.

    Writes the weights of intervals ``j0 .. j0 + cnt - 1`` into ``buf[0:cnt]`` and returns
    ``(j0, cnt, row_max)``. No transcendental per point: ``e^{-c d}`` for integer distances
    ``d = 64 h + l`` is the product of two tabulated exponentials (``A[h] B[l]``) and a
    fractional factor, so each weight carries at most ~5 roundings (< 2**-50 relative).
    Intervals whose factor is below ``2**-1000`` are outside ``[j0, j0 + cnt)``.
    """
    k = hi - lo
    inv = 1.0 / (right - left)
    ti = math.floor(target)
    if ti > k:
        ti = k
    fl = target - ti
    span = _LOG_CUT / c
    dmax = k + 1 if span >= k + 1 else int(span)
    j0 = ti - dmax if ti - dmax > 0 else 0
    j1 = ti + 1 + dmax if ti + 1 + dmax < k else k
    na = dmax // 64 + 2
    tab_a = np.empty(na, dtype=np.float64)
    for h in range(na):
        tab_a[h] = math.exp(-c * 64.0 * h)
    tab_b = np.empty(64, dtype=np.float64)
    for h in range(64):
        tab_b[h] = math.exp(-c * h)
    f_left = math.exp(-c * fl)  # j <= ti: |j - target| = fl + (ti - j)
    f_right = math.exp(-c * (1.0 - fl))  # j > ti: |j - target| = (1 - fl) + (j - ti - 1)
    # Interior intervals (1 <= j <= k - 1) read two adjacent data points; the end intervals
    # j = 0 and j = k (bounded by the node's domain) are patched in afterwards. Distances are
    # walked in blocks of 64 so that the inner loop is a contiguous multiply by tab_b.
    top = 0.0
    jl_lo = max(j0, 1)
    jl_hi = min(ti, k - 1)  # left side: d = ti - j in [ti - jl_hi, ti - jl_lo]
    if jl_hi >= jl_lo:
        d = ti - jl_hi
        while d <= ti - jl_lo:
            h = d >> 6
            base = inv * f_left * tab_a[h]
            stop = min((h + 1) << 6, ti - jl_lo + 1)
            for dd in range(d, stop):
                j = ti - dd
                w = (edges[lo + j] - edges[lo + j - 1]) * base * tab_b[dd & 63]
                buf[j - j0] = w
                top = max(top, w)
            d = stop
    jr_lo = max(ti + 1, 1)
    jr_hi = min(j1, k - 1)  # right side: d = j - ti - 1
    if jr_hi >= jr_lo:
        d = jr_lo - ti - 1
        while d <= jr_hi - ti - 1:
            h = d >> 6
            base = inv * f_right * tab_a[h]
            stop = min((h + 1) << 6, jr_hi - ti)
            off = lo + ti + 1
            for dd in range(d, stop):
                w = (edges[off + dd] - edges[off + dd - 1]) * base * tab_b[dd & 63]
                buf[ti + 1 + dd - j0] = w
                top = max(top, w)
            d = stop
    sl = inv * f_left
    sr = inv * f_right
    for j in (0, k):
        if j0 <= j <= j1:
            if j <= ti:
                d = ti - j
                w = _width(edges, lo, k, j, left, right) * sl * tab_a[d >> 6] * tab_b[d & 63]
            else:
                d = j - ti - 1
                w = _width(edges, lo, k, j, left, right) * sr * tab_a[d >> 6] * tab_b[d & 63]
            buf[j - j0] = w
            top = max(top, w)
    return j0, j1 - j0 + 1, top


@numba.njit(cache=True, nogil=True)
def _fill_weights_log(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    buf: FloatArray,
) -> tuple[int, int, float]:
    """Exact fallback: all k + 1 weights formed in log space and max-normalised (max = 1)."""
    k = hi - lo
    top = -np.inf
    for j in range(k + 1):
        w = _width(edges, lo, k, j, left, right)
        s = (math.log(w) if w > 0.0 else -np.inf) - c * abs(j - target)
        buf[j] = s
        if s > top:
            top = s
    for j in range(k + 1):
        s = buf[j]
        buf[j] = math.exp(s - top) if s > -np.inf else 0.0
    return 0, k + 1, 1.0 if top > -np.inf else 0.0


@numba.njit(cache=True, nogil=True)
def _node_pick(  # pragma: no cover - compiled
    edges: FloatArray,
    lo: int,
    hi: int,
    left: float,
    right: float,
    target: float,
    c: float,
    u: float,
    buf: FloatArray,
) -> int:
    """Sample interval j in 0..k of the node with probability proportional to its weight.

    Interval j is ``[L_j, R_j)`` with ``L_0 = left``, ``L_j = edges[lo + j - 1]``,
    ``R_j = edges[lo + j]``, ``R_k = right``; its weight is ``width_j e^{-c |j - target|}``.
    Zero widths have weight 0 and are never returned. One uniform ``u``, inverse CDF.
    Returns -1 only if every weight is zero (impossible when right > left).
    """
    j0, cnt, top = _fill_weights(edges, lo, hi, left, right, target, c, buf)
    if not top >= _MIN_TOP:
        j0, cnt, top = _fill_weights_log(edges, lo, hi, left, right, target, c, buf)
    # Inverse CDF in two stages: block sums of 64 weights (a reassociated, vectorisable
    # reduction: positive terms, so the error bound is that of sequential summation), then a
    # scan over blocks and one scan inside the chosen block.
    nb = (cnt + 63) >> 6
    sums = np.empty(nb, dtype=np.float64)
    _block_sums(buf, cnt, sums)
    total = 0.0
    for b in range(nb):
        total += sums[b]
    goal = u * total
    acc = 0.0
    before = 0.0  # sum of the blocks preceding the chosen one
    chosen = -1
    for b in range(nb):
        sb = sums[b]
        if sb > 0.0:
            chosen = b
            before = acc
            if acc + sb > goal:
                break
            acc += sb
    if chosen < 0:
        return -1
    # If no block crossed the goal (u * total rounded up to total) the last positive block is
    # chosen and its last positive weight returned below.
    acc = before
    last = -1
    for i in range(chosen << 6, min(cnt, (chosen + 1) << 6)):
        w = buf[i]
        if w > 0.0:
            acc += w
            last = i
            if acc > goal:
                return j0 + i
    # Rounding between the block sum and its elements: the block's last positive weight.
    return j0 + last


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _block_sums(buf: FloatArray, cnt: int, out: FloatArray) -> None:  # pragma: no cover
    """out[b] = sum(buf[64 b : min(cnt, 64 b + 64)])."""
    for b in range(out.size):
        s = 0.0
        for i in range(b << 6, min(cnt, (b + 1) << 6)):
            s += buf[i]
        out[b] = s


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

    Complexity: O(n log n) for the sort plus O(n log m) for the recursion; O(n) memory.

    Raises:
        MechanismInputError: for invalid data, quantiles, epsilon, bounds or neighbours.
    """
    prep = prepare(data, quantiles, epsilon=epsilon, lower=lower, upper=upper, neighbors=neighbors)
    gen = make_rng(rng)
    edges = prep.edges
    qs = prep.quantiles
    m = int(qs.size)
    n = prep.n
    eps_level = prep.epsilon / recursion_depth(m)
    swap = prep.neighbors == "swap"
    buf = np.empty(n + 1, dtype=np.float64)
    out = np.empty(m, dtype=np.float64)

    # A node: (lo, hi) edges index range of its points, [left, right] its domain, [qa, qb) its
    # quantile indices, (q_lo, q_hi) the global quantiles bounding it. Invariants: the nodes
    # of one level have disjoint index ranges and disjoint domains (up to shared endpoints),
    # and every point of a node lies in its domain.
    level: list[tuple[int, int, float, float, int, int, float, float]] = [
        (1, n + 1, prep.lower, prep.upper, 0, m, 0.0, 1.0)
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
                j = int(_node_pick(edges, lo, hi, left, right, rel * k, c, gen.random(), buf))
                if j < 0:
                    raise FloatingPointError("exponential-mechanism weights are all zero")
                a_j = left if j == 0 else float(edges[lo + j - 1])
                b_j = right if j == k else float(edges[lo + j])
                v = a_j + gen.random() * (b_j - a_j)
                if v >= b_j:  # keep [a_j, b_j) half-open under rounding
                    v = float(np.nextafter(b_j, -np.inf))
                v = max(v, a_j)
            else:  # zero-width domain (probability ~0): the only possible output
                j, v = 0, left
            out[mid] = v
            if qa < mid:
                nxt.append((lo, lo + j, left, v, qa, mid, q_lo, float(qs[mid])))
            if mid + 1 < qb:
                nxt.append((lo + j, hi, v, right, mid + 1, qb, float(qs[mid]), q_hi))
        level = nxt
    # Outputs are nondecreasing by construction (children live inside [left, v] / [v, right]);
    # clip and sort only guard rounding.
    np.clip(out, prep.lower, prep.upper, out=out)
    out.sort()
    return out


AQ = Mechanism(
    name="aq",
    fn=aq,
    notion=PrivacyNotion.PURE_DP,
    summary="ApproximateQuantiles: recursive exponential-mechanism splitting (Kaplan et al. 2022).",
)
