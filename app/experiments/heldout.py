"""Held-out check of the planner: ``python -m app.experiments.heldout [--trials T] [--out F]``.

Six cells that the planner was *not* fitted on (off the map's grid in n, m and ε, pure and
approximate queries, three shapes), each run ``T`` times with every eligible method on the
same samples. For each cell it reports the method ``auto`` picks (``app.planner.recommend``),
its predicted and measured mean missed points per quantile, and the best measured method.

Acceptance: the prediction for auto's method within a factor 2 of the measured
mean on at least 5 of 6 cells, and auto's measured error within 1.25x of the best measured
method on at least 5 of 6.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.experiments.errormap import run_cell, sample_shape
from app.experiments.runner import evenly_spaced_quantiles, stream, warm_up
from app.planner import eligible_methods, expected_error, recommend


@dataclass(frozen=True)
class Cell:
    """One held-out query."""

    shape: str
    n: int
    m: int
    epsilon: float
    delta: float | None


#: None of these (n, m, ε) is a point of the fitted map (n ∈ 10^{3,4,5}, m ∈ {1,3,9,19,49,99},
#: ε ∈ {0.1, 1, 10}).
CELLS = (
    Cell("gaussian", 500, 4, 0.5, None),
    Cell("lognormal", 2_000, 24, 2.0, 1e-6),
    Cell("bimodal", 5_000, 70, 0.3, None),
    Cell("gaussian", 30_000, 14, 5.0, 1e-6),
    Cell("lognormal", 100_000, 40, 0.25, None),
    Cell("bimodal", 20_000, 99, 1.0, 1e-6),
)


def check(cell: Cell, trials: int, seed: int = 7) -> dict[str, Any]:
    """Measure every eligible method on ``trials`` shared samples of ``cell``."""
    qs = evenly_spaced_quantiles(cell.m)
    methods = eligible_methods(delta_given=cell.delta is not None, neighbors="swap")
    measured: dict[str, list[float]] = {m: [] for m in methods}
    warm = sample_shape(cell.shape, stream(seed, "heldout-warm"), 200)
    for method in methods:  # untimed: JIT and per-(ε, m) precomputation
        run_cell(
            method, warm, qs, epsilon=cell.epsilon, delta=cell.delta or 1e-6, rng=stream(0, "w")
        )
    for trial in range(trials):
        data = sample_shape(cell.shape, stream(seed, "heldout", cell.shape, cell.n, trial), cell.n)
        for method in methods:
            rng = stream(seed, "heldout", cell.shape, cell.n, trial, method)
            missed, _ = run_cell(
                method, data, qs, epsilon=cell.epsilon, delta=cell.delta or 1e-6, rng=rng
            )
            measured[method].append(missed)
    rows: dict[str, dict[str, Any]] = {}
    for method in methods:
        pred = expected_error(method, cell.n, list(qs), cell.epsilon, cell.delta, "swap")
        vals = np.asarray(measured[method])
        rows[method] = {
            "predicted": None if pred is None else round(pred[0], 2),
            "bound90": None if pred is None else round(pred[1], 2),
            "measured": round(float(vals.mean()), 2),
            "measured_q90": round(float(np.quantile(vals, 0.9)), 2),
        }
    auto = recommend(cell.n, list(qs), cell.epsilon, cell.delta, "swap")
    best = min(methods, key=lambda m: float(rows[m]["measured"]))
    a, b = rows[auto], rows[best]
    ratio_pred = (
        a["predicted"] / a["measured"] if a["measured"] and a["predicted"] else float("nan")
    )
    return {
        "cell": cell.__dict__,
        "auto": auto,
        "best": best,
        "auto_vs_best": round(a["measured"] / b["measured"], 3) if b["measured"] else 1.0,
        "predicted_over_measured": round(ratio_pred, 3),
        "methods": rows,
    }


def markdown(results: list[dict[str, Any]], trials: int) -> str:
    """The table of the report."""
    lines = [
        f"Held-out cells ({trials} trials each; missed points per quantile, mean over trials)",
        "",
        "| shape | n | m | ε | δ | auto picks | predicted | measured | pred/meas "
        "| best measured | auto/best |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["cell"]
        rows = r["methods"]
        a = rows[r["auto"]]
        b = rows[r["best"]]
        lines.append(
            f"| {c['shape']} | {c['n']} | {c['m']} | {c['epsilon']:g} | {c['delta'] or '—'} | "
            f"{r['auto']} | {a['predicted']} | {a['measured']} | {r['predicted_over_measured']} | "
            f"{r['best']} ({b['measured']}) | {r['auto_vs_best']} |"
        )
    ok_pred = sum(0.5 <= r["predicted_over_measured"] <= 2.0 for r in results)
    ok_auto = sum(r["auto_vs_best"] <= 1.25 for r in results)
    pairs = [v for r in results for v in r["methods"].values() if v["bound90"] is not None]
    covered = sum(v["measured_q90"] <= v["bound90"] for v in pairs)
    lines += [
        "",
        f"prediction within 2x: {ok_pred}/{len(results)}; auto within 1.25x of best: "
        f"{ok_auto}/{len(results)}; measured 90th percentile <= quoted bound90: "
        f"{covered}/{len(pairs)} (method, cell) pairs",
        "",
        "All methods, predicted / measured:",
        "",
    ]
    for r in results:
        c = r["cell"]
        rows = r["methods"]
        parts = [f"{m} {v['predicted']}/{v['measured']}" for m, v in rows.items()]
        lines.append(
            f"- {c['shape']} n={c['n']} m={c['m']} ε={c['epsilon']:g}: " + "; ".join(parts)
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    """Run the six cells; print the markdown table; optionally write JSON."""
    p = argparse.ArgumentParser(prog="python -m app.experiments.heldout")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=None, help="write results JSON + markdown here")
    args = p.parse_args()
    from app.mechanisms import MECHANISMS

    warm_up(tuple(MECHANISMS))
    start = time.perf_counter()
    results = [check(c, args.trials, args.seed) for c in CELLS]
    text = markdown(results, args.trials) + f"\nwall time {time.perf_counter() - start:.0f} s\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = "" if args.seed == 7 else f"_seed{args.seed}"
        (args.out / f"heldout{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / f"heldout{suffix}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
