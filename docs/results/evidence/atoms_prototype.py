"""Prototype behind docs/experiments.md §8.6: which jitter fixes JointExp on atoms?

Run from the repository root:
``nice -n 19 .venv/bin/python docs/results/evidence/atoms_prototype.py
integer 1e3,1e4,1e5 9,49 0.1,1,10 3`` (arguments: shapes, ns, ms, epsilons, trials).
Raw values, bounds [−100, 100], swap. Columns:
jointexp, indexp, aq as registered; ``upW``: each value moves up by U[0, W), JointExp on
[lower, upper + W], outputs clipped to upper (the design adopted as ``jointexp_smooth``);
``symW``: each value moves by U(−W/2, W/2), JointExp on [lower − W/2, upper + W/2], outputs
clipped to the bounds. Mean missed points per quantile on the original sample.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from app.experiments.errormap import LOWER, UPPER, sample_shape
from app.experiments.metric import missed_points
from app.experiments.runner import evenly_spaced_quantiles, stream
from app.mechanisms import MECHANISMS
from app.mechanisms.histogram import support_from_values
from app.mechanisms.jointexp import jointexp_core


def jitter_run(
    x: np.ndarray, qs: np.ndarray, eps: float, rng: np.random.Generator, w: float, mode: str
) -> np.ndarray:
    """JointExp on jittered values (see the module docstring)."""
    if mode == "up":
        xj = x + w * rng.random(x.size)
        sup = support_from_values(
            xj, qs, epsilon=eps, lower=LOWER, upper=UPPER + w, neighbors="swap"
        )
        return np.minimum(np.asarray(jointexp_core(sup, rng)), UPPER)
    xj = x + w * (rng.random(x.size) - 0.5)
    sup = support_from_values(
        xj, qs, epsilon=eps, lower=LOWER - w / 2, upper=UPPER + w / 2, neighbors="swap"
    )
    return np.clip(np.asarray(jointexp_core(sup, rng)), LOWER, UPPER)


def main() -> None:
    variants: list[tuple[str, float | None, str]] = [
        ("jointexp", None, ""),
        ("indexp", None, ""),
        ("aq", None, ""),
    ]
    for w in (1.0, 200 * 2**-10, 200 * 2**-20, 200 * 2**-30):
        variants.append((f"up{w:.2g}", w, "up"))
    for w in (1.0, 200 * 2**-20):
        variants.append((f"sym{w:.2g}", w, "sym"))
    shapes = sys.argv[1].split(",")
    ns = [int(float(t)) for t in sys.argv[2].split(",")]
    ms = [int(t) for t in sys.argv[3].split(",")]
    epsilons = [float(t) for t in sys.argv[4].split(",")]
    trials = int(sys.argv[5])
    for shape, n, m, eps in itertools.product(shapes, ns, ms, epsilons):
        qs = evenly_spaced_quantiles(m)
        res: dict[str, list[float]] = {v[0]: [] for v in variants}
        for t in range(trials):
            x = sample_shape(shape, stream(99, "p", shape, n, m, eps, t), n)
            for name, w, mode in variants:
                rng = stream(99, "p", shape, n, m, eps, t, name)
                if w is None:
                    est = MECHANISMS[name](x, qs, epsilon=eps, lower=LOWER, upper=UPPER, rng=rng)
                else:
                    est = jitter_run(x, qs, eps, rng, w, mode)
                res[name].append(float(missed_points(x, qs, est).mean()))
        cols = " ".join(f"{k}={np.mean(v):.4g}" for k, v in res.items())
        print(f"{shape:9s} n={n:<7d} m={m:<3d} eps={eps:<4g} {cols}", flush=True)


if __name__ == "__main__":
    main()
