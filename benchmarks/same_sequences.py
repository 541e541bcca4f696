"""Off-suite exactness check: linear and tilted JointExp passes draw the log pass's sequences.

Usage::

    python -m benchmarks.same_sequences            # 7 shapes x 2 n x 2 m x 3 c x 4 tilts x 10 seeds
    python -m benchmarks.same_sequences --seeds 20
    python -m benchmarks.same_sequences --random 300 --rng 11   # random inputs for 300 s

``--random SECONDS`` draws inputs at random instead, until the time is up: n from 50 to
2·10^4; normal, log-normal, two far clusters, rounded, tied, or up to 50 % of the data
beyond either bound or both; m from 1 to 49 random quantiles; epsilon from 0.01 to 30;
swap or add/remove. Each input's default sampler is compared with the log pass on 3 seeds.
It found the draw that took the log of 0.0 after a deep fall (stop 19: epsilon = 10, 20 %
clamped), which the fixed shapes above, at c <= 1, never reach.

For every input the default sampler (``tilt=True``: linear rows, else tilted rows chosen
from the probe) and three forced tilts (0.5 c, 0.9 c, 0.99 c) are run with the same seeds
as the forced log-space pass. Every pass checks its own range and falls back to log space
where it lacks it, and each block is drawn from the same two uniforms, so exact weights
give the same sequence except where a uniform falls within rounding of a CDF step; any
difference is printed and counted. Takes ~6 minutes at 10 seeds on the 2-core machine.
The suite runs a smaller version (``tests/mechanisms/test_jointexp.py``,
``test_tilted_rows_draw_the_sequences_the_log_pass_draws``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.mechanisms.histogram import support_from_values
from app.mechanisms.jointexp import mechanism as J

SHAPES = ["upper", "lower", "both", "upper20", "int", "tie", "cont"]


def _shape(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.normal(0.0, 5.0, n)
    u = rng.random(n)
    if kind == "upper":
        x[u < 0.05] = 150.0
    elif kind == "lower":
        x[u < 0.05] = -150.0
    elif kind == "both":
        x[u < 0.05] = 150.0
        x[u > 0.95] = -150.0
    elif kind == "upper20":
        x[u < 0.2] = 150.0
    elif kind == "int":
        x = np.round(x)
    elif kind == "tie":
        x[u < 0.3] = 1.0
    return x


def _random_input(
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, float, str, str]:
    """One random input for ``--random``: data, quantiles, epsilon, neighbours, its label."""
    n = int(rng.choice([50, 300, 2000, 20000]))
    kind = str(
        rng.choice(["normal", "upper", "lower", "both", "tie", "round", "lognormal", "clusters"])
    )
    x = rng.lognormal(0.0, 2.0, n) - 5.0 if kind == "lognormal" else rng.normal(0.0, 5.0, n)
    u = rng.random(n)
    if kind in ("upper", "both"):
        x[u < rng.uniform(0.01, 0.5)] = 150.0
    if kind in ("lower", "both"):
        x[u > 1.0 - rng.uniform(0.01, 0.45)] = -150.0
    if kind == "tie":
        x[u < rng.uniform(0.1, 0.6)] = rng.uniform(-5.0, 5.0)
    if kind == "round":
        x = np.round(x, int(rng.integers(0, 2)))
    if kind == "clusters":
        x = np.where(u < rng.uniform(0.05, 0.95), rng.normal(-60, 0.5, n), rng.normal(60, 0.5, n))
    m = int(rng.choice([1, 3, 9, 19, 49]))
    q = np.sort(rng.choice(np.arange(1, 100), size=m, replace=False)) / 100.0
    eps = float(rng.choice([0.01, 0.05, 0.3, 1.0, 4.0, 10.0, 30.0]))
    neighbors = str(rng.choice(["swap", "add_remove"]))
    return x, q, eps, neighbors, f"{kind} n={n} m={m} eps={eps} {neighbors}"


def run_random(seconds: float, seed: int) -> int:
    """``--random``: random inputs until ``seconds`` have passed; 1 if any draw differs."""
    rng = np.random.default_rng(seed)
    total = mismatches = 0
    end = time.time() + seconds
    while time.time() < end:
        x, q, eps, neighbors, label = _random_input(rng)
        sup = support_from_values(x, q, epsilon=eps, lower=-100.0, upper=100.0, neighbors=neighbors)
        c = eps / (2.0 * J.jointexp_sensitivity(sup.quantiles, neighbors))
        with np.errstate(divide="ignore"):
            logw = np.log(sup.widths / sup.widths.max())
        gaps = J.quantile_gaps(sup.quantiles, sup.n)
        for s in range(3):
            ref = J.sample_interval_sequence(
                logw, sup.cum, gaps, c, np.random.default_rng(s), force_log_space=True
            )
            got = J.sample_interval_sequence(logw, sup.cum, gaps, c, np.random.default_rng(s))
            total += 1
            if not np.array_equal(ref, got):
                mismatches += 1
                print(f"DIFFERENT {label} seed={s}")
    print(f"TOTAL {total} MISMATCHES {mismatches} (random inputs, rng {seed}, {seconds:.0f} s)")
    return 1 if mismatches else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per input and tilt")
    parser.add_argument("--random", type=float, default=0.0, help="random inputs for N seconds")
    parser.add_argument("--rng", type=int, default=0, help="--random: the inputs' seed")
    args = parser.parse_args(argv)
    if args.random > 0.0:
        return run_random(args.random, args.rng)
    rng = np.random.default_rng(2026)
    total = mismatches = 0
    t0 = time.time()
    for kind in SHAPES:
        for n in (3000, 20000):
            x = _shape(kind, n, rng)
            for m in (9, 49):
                q = np.arange(1, m + 1) / (m + 1)
                sup = support_from_values(
                    x, q, epsilon=1.0, lower=-100.0, upper=100.0, neighbors="swap"
                )
                with np.errstate(divide="ignore"):
                    logw = np.log(sup.widths / sup.widths.max())
                gaps = J.quantile_gaps(sup.quantiles, sup.n)
                for c in (0.05, 0.25, 1.0):
                    for tilt in (True, 0.5 * c, 0.9 * c, 0.99 * c):
                        for s in range(args.seeds):
                            ref = J.sample_interval_sequence(
                                logw,
                                sup.cum,
                                gaps,
                                c,
                                np.random.default_rng(s),
                                force_log_space=True,
                            )
                            got = J.sample_interval_sequence(
                                logw, sup.cum, gaps, c, np.random.default_rng(s), tilt=tilt
                            )
                            total += 1
                            if not np.array_equal(ref, got):
                                mismatches += 1
                                print(f"DIFFERENT {kind} n={n} m={m} c={c} tilt={tilt} seed={s}")
        print(f"{kind:8s} done: {total} draws, {mismatches} differences, {time.time() - t0:.0f} s")
    print(f"TOTAL {total} MISMATCHES {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
