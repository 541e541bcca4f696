"""How far below the last draw's total the certificate of a tilted pass lands.

For each shape of ``bench_mechanisms`` (n = 10^6 unless given, seed 7) this runs the
forward pass JointExp would run (the probe, then the tilt it chooses), draws the last
block, and prints the tilt, the certificate's distance below the last draw's total and
the distance the draw requires (``last_headroom``), the error-pass levels it took ("1"
a level on the intervals, "b5" one on blocks of span 5: the levels tried, in order),
and the time the forward pass and the certificate took (median of ``--runs``). A shape
whose rows need no tilt says so; one whose certificate does not hold would go to the log
pass (docs/mechanisms.md, "The certificate of a tilted pass").

    python -m benchmarks.certificate_margins [--n 1000000] [--runs 3]
        [--cases clamped5pct:1:99,pointmass5pct:10:99]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.histogram import support_from_values
from app.mechanisms.jointexp import certificate as CE
from app.mechanisms.jointexp import jointexp_sensitivity, quantile_gaps
from app.mechanisms.jointexp.accept import run_parameter
from app.mechanisms.jointexp.draws import certificate_rejects, draw_block
from app.mechanisms.jointexp.mechanism import MEMORY_BUDGET_BYTES, forward_pass, support_inputs
from app.mechanisms.jointexp.range_rule import LinearGuardTripped
from app.mechanisms.jointexp.rows import collapse_cap
from benchmarks.bench_mechanisms import _case_data

DEFAULT = (
    "clamped5pct:1:99,clamped5pct:0.1:99,clamped5pct:10:99,clamped5pct_both:1:99,"
    "pointmass5pct:1:99,pointmass5pct:10:99,clamped10pct_both:1:99,clamped5pct:1:499"
)


def _one(case: str, eps: float, m: int, n: int, runs: int) -> str:
    x = _case_data(case, n, 7)
    q = np.arange(1, m + 1) / (m + 1)
    sup = support_from_values(x, q, lower=-100.0, upper=100.0, epsilon=eps, neighbors="swap")
    delta_u = jointexp_sensitivity(sup.quantiles, sup.neighbors)
    c = run_parameter(sup.epsilon / (2.0 * delta_u), m, sup.n, delta_u, False)
    gaps = quantile_gaps(sup.quantiles, sup.n)
    inputs = support_inputs(sup).collapsed(collapse_cap(gaps))
    levels: list[list[str]] = []
    saved = CE.Level.result

    def counted(self: CE.Level) -> float:
        levels[-1].append("1" if self.blocks is None else f"b{self.blocks.span}")
        return saved(self)

    CE.Level.result = counted  # type: ignore[method-assign]
    fwd_times, cert_times, row = [], [], ""
    try:
        for _ in range(runs):
            levels.append([])
            with flush_subnormals():
                t0 = time.perf_counter()
                try:
                    fwd = forward_pass(
                        inputs.logw,
                        inputs.pos,
                        gaps,
                        c,
                        MEMORY_BUDGET_BYTES,
                        "scaled",
                        True,
                        inputs.lw_ref,
                        inputs,
                    )
                except LinearGuardTripped:
                    return f"| {case} | {eps:g} | {m} | no tilt holds: log pass | | | | |"
                t1 = time.perf_counter()
                if not fwd.mu:
                    return f"| {case} | {eps:g} | {m} | untilted | | | | |"
                try:
                    blk = draw_block(
                        fwd,
                        m,
                        inputs.logw.size,
                        int(inputs.pos[-1]),
                        float(gaps[m]),
                        np.random.default_rng(0),
                    )
                    # (the sampler checks the certificate once the sweep is drawn)
                    total = math.nan if certificate_rejects(fwd) else blk.log_total
                except LinearGuardTripped:
                    total = math.nan  # not certified (or the median rule tripped)
                t2 = time.perf_counter()
            fwd_times.append(t1 - t0)
            cert_times.append(t2 - t1)
            bound = fwd._certified if fwd._certified is not None else math.nan
            row = (
                f"| {case} | {eps:g} | {m} | {fwd.mu / c:.3f} | {total - bound:.1f} | "
                f"{fwd.last_headroom:.1f} | {'+'.join(levels[-1])} |"
            )
    finally:
        CE.Level.result = saved  # type: ignore[method-assign]
    return f"{row} {statistics.median(fwd_times):.3f} | {statistics.median(cert_times):.3f} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10**6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=DEFAULT, help="shape:epsilon:m, comma-separated")
    args = parser.parse_args(argv)
    print(
        "| shape | ε | m | μ/c | below the total (e-folds) | required | levels used | "
        "forward s | last draw s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.cases.split(","):
        case, eps, m = spec.split(":")
        print(_one(case, float(eps), int(m), args.n, args.runs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
