"""JointExp where interval widths differ by 10^16 and more: the review's reproducers.

A rule that charges error growth at the median width alone is not a worst-case bound; on
these inputs (a few data points packed 10^-16 apart inside wide bounds, or five heavy cells
on a grid of 2^53 points, with 60 close quantiles) a sampler held to it put the estimates
inside the data where the exact law puts them outside. The exact probabilities come from
the paper's recursion in 60-digit arithmetic over the allowed intervals (no implementation
code): the partition function of the sequences that use only some intervals, divided by
the whole one.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from app.mechanisms import MECHANISMS, GridHistogram
from app.mechanisms.histogram import Support, support_from_grid, support_from_values
from app.mechanisms.jointexp import jointexp
from tests.mechanisms import law_audit as LA

Q = 0.5 + np.arange(60) / 1000.0  # 60 close quantiles


def share_of_sequences_within(sup: Support, allowed: list[int]) -> float:
    """P(every interval of the sequence is in ``allowed``) under the paper's law."""
    gaps, c = LA.mechanism_parameters(sup)
    pos = [int(p) for p in sup.cum]
    with mpmath.workdps(60):
        w = [mpmath.mpf(float(v)) for v in sup.widths]
        g = [mpmath.mpf(float(v)) for v in gaps]
        cc = mpmath.mpf(float(c))
        n, m = pos[-1], len(g) - 1

        def z(live: list[int]) -> mpmath.mpf:
            # alpha(j, i, r): prefixes of length j ending in exactly r copies of interval i
            f = {(i, 1): w[i] * mpmath.exp(-cc * abs(pos[i] - g[0])) for i in live}
            for j in range(1, m):
                tot: dict[int, mpmath.mpf] = {}
                for (i, _), v in f.items():
                    tot[i] = tot.get(i, 0) + v
                nxt = {}
                for i in live:
                    s = mpmath.fsum(
                        tot[k] * mpmath.exp(-cc * abs(pos[i] - pos[k] - g[j]))
                        for k in live
                        if k < i and k in tot
                    )
                    if s:
                        nxt[(i, 1)] = w[i] * s
                for (i, r), v in f.items():
                    nxt[(i, r + 1)] = v * w[i] * mpmath.exp(-cc * g[j]) / (r + 1)
                f = nxt
            return mpmath.fsum(
                v * mpmath.exp(-cc * abs(n - pos[i] - g[m])) for (i, _), v in f.items()
            )

        live = [i for i in range(len(w)) if w[i] > 0]
        return float(z([i for i in live if i in allowed]) / z(live))


def test_points_packed_inside_wide_bounds_put_every_estimate_outside_them() -> None:
    """Five values 10^-16 apart in [-1, 1], epsilon 10: the exact law keeps all 60 estimates
    outside the data with probability 1 - 1.2e-14; so do 400 releases."""
    x = np.array([0.0, 1e-16, 2e-16, 3e-16, 4e-16])
    sup = support_from_values(x, Q, epsilon=10.0, lower=-1.0, upper=1.0, neighbors="swap")
    wide = [i for i in range(sup.widths.size) if sup.widths[i] > 0.5]
    assert share_of_sequences_within(sup, wide) > 1.0 - 1e-12
    rng = np.random.default_rng(3)
    for _ in range(400):
        out = jointexp(x, Q, epsilon=10.0, lower=-1.0, upper=1.0, rng=rng)
        assert np.all((out <= 0.0) | (out >= 4e-16))


@pytest.mark.parametrize(("eps", "outside"), [(3.0, True), (10.0, True), (20.0, False)])
def test_heavy_cells_on_a_grid_of_2_to_the_53_points(eps: float, outside: bool) -> None:
    """Five heavy cells amid 2^53 grid points (widths 1 against 2^52): at epsilon 3 and 10
    the exact law keeps every estimate off the cells (probability 1 - 2e-12 or more), at 20
    it puts every one on them (probability 1 - 1e-125 or more); 100 releases each agree."""
    start = 2**52
    hist = GridHistogram(
        cells=np.arange(start, start + 5, dtype=np.int64),
        counts=np.array([100, 300, 50, 300, 100], dtype=np.int64),
        grid_points=2**53,
    )
    sup = support_from_grid(hist, Q, epsilon=eps, neighbors="swap")
    keep = [i for i in range(sup.widths.size) if (sup.widths[i] > 2.0) == outside]
    assert share_of_sequences_within(sup, keep) > 1.0 - 1e-11
    rng = np.random.default_rng(5)
    for _ in range(100):
        est = MECHANISMS["jointexp"].run_grid(hist, Q, epsilon=eps, delta=None, rng=rng)
        on_cells = (est >= start) & (est < start + 5)
        assert np.all(~on_cells) if outside else np.all(on_cells)
