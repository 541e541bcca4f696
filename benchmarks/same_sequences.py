"""Off-suite exactness check: linear and tilted JointExp passes draw the log pass's sequences.

Usage::

    python -m benchmarks.same_sequences            # 7 shapes x 2 n x 2 m x 3 c x 4 tilts x 10 seeds
    python -m benchmarks.same_sequences --seeds 20

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

from app.mechanisms import jointexp as J
from app.mechanisms.histogram import support_from_values

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds per input and tilt")
    args = parser.parse_args(argv)
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
