"""Brute-force reference distributions, straight from the paper's formulas (test helper)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats

from app.mechanisms.histogram import Support, support_from_values


def dense_edges(data: object, lower: float, upper: float) -> np.ndarray:
    """``[a, x_(1), ..., x_(n), b]``: every data point, clamped and sorted (ties repeated)."""
    x = np.sort(np.clip(np.asarray(data, dtype=np.float64), lower, upper))
    return np.concatenate(([float(lower)], x, [float(upper)]))


def edges_for(data: list[float], lower: float, upper: float) -> np.ndarray:
    return dense_edges(data, lower, upper)


def support_for(data: object, lower: float, upper: float, q: object = (0.5,)) -> Support:
    return support_from_values(
        data,  # type: ignore[arg-type]
        q,  # type: ignore[arg-type]
        epsilon=1.0,
        lower=lower,
        upper=upper,
        neighbors="swap",
    )


def jointexp_sequence_probs(
    data: list[float],
    quantiles: list[float],
    *,
    epsilon: float,
    lower: float,
    upper: float,
    neighbors: str,
) -> dict[tuple[int, ...], float]:
    """P[s] ∝ exp(eps u(s)/(2Δ)) prod w(i_j) / γ(s) over all nondecreasing s (paper Sec. 3.2)."""
    edges = edges_for(data, lower, upper)
    n = edges.size - 2
    w = np.diff(edges)
    q = np.asarray(quantiles, dtype=float)
    gaps = np.diff(np.concatenate(([0.0], q, [1.0])))
    delta_u = 2.0 if neighbors == "swap" else 2.0 * (1.0 - gaps.min())
    nj = gaps * n
    m = q.size
    logp: dict[tuple[int, ...], float] = {}
    for s in itertools.combinations_with_replacement(range(n + 1), m):
        if any(w[i] == 0.0 for i in s):
            continue  # zero-width intervals carry no measure
        full = (0, *s, n)
        u = -sum(abs((full[j + 1] - full[j]) - nj[j]) for j in range(m + 1))
        gamma = math.prod(math.factorial(s.count(i)) for i in set(s))
        logp[s] = epsilon * u / (2 * delta_u) + sum(math.log(w[i]) for i in s) - math.log(gamma)
    top = max(logp.values())
    z = sum(math.exp(v - top) for v in logp.values())
    return {s: math.exp(v - top) / z for s, v in logp.items()}


def indexp_interval_probs(
    data: list[float], q: float, *, epsilon: float, lower: float, upper: float, neighbors: str
) -> dict[int, float]:
    """Single-quantile EM (Smith 2011): P[i] ∝ w_i exp(-eps |i - q n| / (2 Δ))."""
    edges = edges_for(data, lower, upper)
    n = edges.size - 2
    w = np.diff(edges)
    sens = 1.0 if neighbors == "swap" else max(q, 1 - q)
    logp = {
        i: math.log(w[i]) - epsilon * abs(i - q * n) / (2 * sens) for i in range(n + 1) if w[i] > 0
    }
    top = max(logp.values())
    z = sum(math.exp(v - top) for v in logp.values())
    return {i: math.exp(v - top) / z for i, v in logp.items()}


def to_intervals(edges: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Index of the (positive-width) interval [edges[i], edges[i+1]) holding each output."""
    idx = np.searchsorted(edges, outputs, side="right") - 1
    return np.minimum(idx, edges.size - 2)


def chi_square_p(observed: dict[object, int], probs: dict[object, float], draws: int) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one cell."""
    unknown = set(observed) - set(probs)
    if unknown:
        return 0.0  # an outcome the distribution gives probability zero
    keys = sorted(probs, key=lambda k: probs[k], reverse=True)
    obs, exp = [], []
    pool_o, pool_e = 0, 0.0
    for k in keys:
        e = probs[k] * draws
        if e >= 5:
            obs.append(observed.get(k, 0))
            exp.append(e)
        else:
            pool_o += observed.get(k, 0)
            pool_e += e
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp_arr = np.asarray(exp)
    exp_arr *= sum(obs) / exp_arr.sum()
    return float(stats.chisquare(obs, exp_arr).pvalue)


def assert_rejects(fn: object, overrides: dict[str, object], param: str) -> None:
    """Call mechanism ``fn`` on a small valid input with ``overrides``; it must refuse ``param``."""
    import pytest

    from app.mechanisms import MechanismInputError

    args: dict[str, object] = {
        "data": [1.0, 2.0],
        "quantiles": [0.5],
        "epsilon": 1.0,
        "lower": 0.0,
        "upper": 4.0,
    }
    args.update(overrides)
    data, quantiles = args.pop("data"), args.pop("quantiles")
    with pytest.raises(MechanismInputError) as info:
        fn(data, quantiles, **args)  # type: ignore[operator]
    assert info.value.parameter == param
