"""The best any quote that reads no private figure could do on held-out cells:
``python -m benchmarks.quote_ceiling``.

A quote (:func:`app.planner.expected_error`) sees public figures only: n, m, ε, δ, the
neighbour relation, the bounds and the grid. Data sets that share those figures get the same
quote, whatever their shape. In the held-out harness (:mod:`benchmarks.heldout_random`) the
Gaussian, log-normal, bimodal and clamped shapes all run on bounds [−100, 100] with the
default grid step: at a given (n, m, ε, δ) they are indistinguishable to a quote, and the
harness draws each with the same probability. One number q is within 1.5x of a measured
mean e when e / 1.5 <= q <= 1.5 e, so it can be within 1.5x of several shapes' means only
when they span at most 1.5² = 2.25x; a mean of exactly 0 never counts (the harness takes
q / max(e, 10⁻⁹)).

For each cell of a finished held-out run (``--results``, the JSON that
``heldout_random --out`` writes), this runs the method ``auto`` picked there on the cell's
*twins*, the shapes with the same public figures, ``--trials`` times each, as the harness
runs (the grid histogram of the snapped sample, :func:`app.experiments.errormap.run_cell`),
and reports, per cell, the most shapes one quote could be within 1.5x of (``best``) and how
many the planner's actual quote is within 1.5x of (``quote``). The *ceiling* is the expected
share of cells that the best possible public quote gets right under the harness's draw:

* default-grid cells: ``best / 4`` (the cell's shape is one of the four, equally likely);
* integer-valued cells (a column declared integer, step 1, a public figure that sets them
  apart): counted as 1 in the *harness* ceiling (the harness has one integer-valued shape,
  which a quote could be fitted to), except a cell measured at exactly 0 on the plain
  reading, which no quote reaches; ``best / 3`` in the *extended* ceiling, whose twins
  are two other integer-valued shapes with the same figures: integers spread wider
  (round N(0, 25²), ~150 values in use) and ratings 1-5 (five heavy atoms).

``--maps DIR ...`` reads committed error maps instead (no run): at every (n, m, ε) where
all four default-grid shapes were measured, the same count for *every* method, so the
ceiling does not rest on ``auto``'s pick (the maps' cells, not the harness's draw).

``P(>= 90 %)`` is the chance that a fresh draw of as many cells with these per-cell
probabilities reaches the acceptance line (exact Poisson-binomial), i.e. how often even the
best public quote would pass. The same on (error + 1/4), the harness's second reading.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from app.experiments.errormap import LOWER, UPPER, grid_step, on_grid, run_cell, sample_shape
from app.experiments.errormap import _init as init_worker
from app.experiments.runner import evenly_spaced_quantiles, single_threaded_env, stream
from benchmarks import write_results

#: Shapes that share every public figure in the harness (bounds, the default grid step).
DEFAULT_GRID = ("gaussian", "lognormal", "bimodal", "clamped")
#: The harness's ratio: a quote within 1.5x of the measured mean.
FACTOR = 1.5
#: The planner model's offset, the harness's second reading.
OFFSET = 0.25
#: Fixed before the run: the twins' data streams.
SEED = 20261225


def _integer_wide(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(rng.normal(0.0, 25.0, size=n))


def _ratings(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.choice(np.arange(1.0, 6.0), size=n, p=[0.05, 0.10, 0.20, 0.35, 0.30])


#: Integer-valued shapes beside the harness's round(N(0, 5²)): same bounds, step 1.
INTEGER_TWINS: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = {
    "integer_wide": _integer_wide,
    "ratings": _ratings,
}


def twins_of(shape: str) -> tuple[str, ...]:
    """The shapes whose public figures equal ``shape``'s in the harness (itself excluded)."""
    if shape in DEFAULT_GRID:
        return tuple(s for s in DEFAULT_GRID if s != shape)
    if shape == "integer":
        return tuple(INTEGER_TWINS)
    raise ValueError(f"no twins defined for shape {shape!r}")


def most_within(values: Sequence[float], factor: float = FACTOR) -> int:
    """The most of ``values`` that one number q can be within ``factor``x of
    (v / factor <= q <= v factor): the largest subset spanning at most factor²;
    a value of 0 (or below) is within no positive factor of any q."""
    v = sorted(x for x in values if x > 0)
    span = factor * factor * (1 + 1e-12)
    best, lo = 0, 0
    for hi, x in enumerate(v):
        while x > v[lo] * span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def within(quote: float | None, value: float, factor: float = FACTOR) -> bool:
    """The harness's test: quote / max(value, 1e-9) within [1/factor, factor]."""
    if quote is None:
        return False
    ratio = quote / max(value, 1e-9)
    return 1 / factor <= ratio <= factor


def at_least(probabilities: Sequence[float], k: int) -> float:
    """P(at least ``k`` successes) of independent trials with these probabilities."""
    dist = np.zeros(len(probabilities) + 1)
    dist[0] = 1.0
    for p in probabilities:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return float(dist[k:].sum())


def _sample(shape: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if shape in INTEGER_TWINS:
        return np.sort(np.clip(INTEGER_TWINS[shape](rng, n), LOWER, UPPER))
    return sample_shape(shape, rng, n)


def _step(shape: str) -> float:
    return 1.0 if shape in INTEGER_TWINS else grid_step(shape)


def measure(cell: dict[str, Any], shape: str, method: str, trials: int, seed: int) -> float:
    """``method``'s mean missed points per quantile on ``trials`` samples of ``shape`` at
    the cell's public figures, as the harness runs it."""
    qs = evenly_spaced_quantiles(cell["m"])
    delta = cell["delta"] or 1e-6
    values = []
    for trial in range(trials):
        data = _sample(shape, stream(seed, "twin", shape, cell["index"], trial), cell["n"])
        rng = stream(seed, "twin", shape, cell["index"], trial, method)
        value, _ = run_cell(
            method, data, qs, epsilon=cell["epsilon"], delta=delta, rng=rng,
            grid=on_grid(data, _step(shape)),
        )  # fmt: skip
        values.append(value)
    return float(np.mean(values))


def cell_row(result: dict[str, Any], twins: dict[str, float]) -> dict[str, Any]:
    """One cell's reading: measured means per shape, the best and the actual quote's counts."""
    cell, method = result["cell"], result["auto"]
    quote = result["methods"][method]["quoted_mean"]
    measured = {cell["shape"]: float(result["methods"][method]["measured"]), **twins}
    plain = list(measured.values())
    shifted = [v + OFFSET for v in plain]
    q_shift = None if quote is None else quote + OFFSET
    return {
        "cell": cell,
        "auto": method,
        "quote": quote,
        "measured": measured,
        "best": most_within(plain),
        "best_offset": most_within(shifted),
        "quote_count": sum(within(quote, v) for v in plain),
        "quote_count_offset": sum(within(q_shift, v) for v in shifted),
    }


def ceilings(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Expected share of cells the best public quote (and the actual one) gets right."""
    out: dict[str, dict[str, float]] = {}
    for reading, best_key, quote_key in (
        ("plain", "best", "quote_count"),
        ("offset", "best_offset", "quote_count_offset"),
    ):
        for scope in ("harness", "extended"):
            probs, actual = [], []
            for r in rows:
                size = len(r["measured"])
                if r["cell"]["shape"] == "integer" and scope == "harness":
                    # one integer-valued shape: a quote could fit it, except that a
                    # measured 0 is within no ratio of any quote (the plain reading)
                    own = r["measured"]["integer"]
                    probs.append(float(reading == "offset" or own > 0))
                    q = r["quote"] if reading == "plain" else (r["quote"] or 0.0) + OFFSET
                    actual.append(float(within(q, own if reading == "plain" else own + OFFSET)))
                else:
                    probs.append(r[best_key] / size)
                    actual.append(r[quote_key] / size)
            need = math.ceil(0.9 * len(rows))
            out[f"{reading}/{scope}"] = {
                "ceiling": float(np.mean(probs)),
                "p_pass": at_least(probs, need),
                "actual": float(np.mean(actual)),
            }
    return out


def report(rows: list[dict[str, Any]], trials: int, seed: int) -> str:
    """The markdown report."""
    lines = [
        f"Twins of {len(rows)} held-out cells, {trials} trials per twin, seed {seed} "
        "(missed points per quantile of `auto`'s pick; the quote is the harness's)",
        "",
        "| # | shape | n | m | ε | auto | quote | measured per shape | best one quote | "
        "the quote |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cell"]
        per = ", ".join(f"{s} {v:.3g}" for s, v in r["measured"].items())
        lines.append(
            f"| {c['index']} | {c['shape']} | {c['n']} | {c['m']} | {c['epsilon']:g} | "
            f"{r['auto']} | {r['quote']} | {per} | {r['best']} of {len(r['measured'])} | "
            f"{r['quote_count']} of {len(r['measured'])} |"
        )
    lines += [
        "",
        "| reading | integer-valued cells | ceiling (best public quote) | P(≥ 90 % of cells) "
        "| the planner's quote, same cells and twins |",
        "|---|---|---|---|---|",
    ]
    for key, v in ceilings(rows).items():
        reading, scope = key.split("/")
        lines.append(
            f"| {'plain' if reading == 'plain' else 'error + ¼'} | "
            f"{'one shape (harness)' if scope == 'harness' else 'three shapes'} | "
            f"{100 * v['ceiling']:.1f} % | {100 * v['p_pass']:.1f} % | "
            f"{100 * v['actual']:.1f} % |"
        )
    return "\n".join(lines) + "\n"


def map_ceilings(dirs: Sequence[Path]) -> dict[str, tuple[int, float]]:
    """Per method: the number of (n, m, ε) cells of the maps in ``dirs`` that hold all four
    default-grid shapes, and the mean share of them one quote can be within 1.5x of."""
    cells: dict[tuple[int, int, float, str], dict[str, float]] = {}
    for d in dirs:
        with (d / "map.csv").open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if row["status"] != "ok" or row["shape"] not in DEFAULT_GRID:
                    continue
                key = (int(row["n"]), int(row["m"]), float(row["epsilon"]), row["method"])
                cells.setdefault(key, {})[row["shape"]] = float(row["missed_mean"])
    shares: dict[str, list[float]] = {}
    for (_, _, _, method), measured in sorted(cells.items()):
        if len(measured) == len(DEFAULT_GRID):
            shares.setdefault(method, []).append(most_within(list(measured.values())) / 4)
    return {name: (len(v), float(np.mean(v))) for name, v in shares.items()}


def map_report(dirs: Sequence[Path]) -> str:
    """The markdown table of :func:`map_ceilings`."""
    lines = [
        f"Error maps: {', '.join(str(d) for d in dirs)}",
        "",
        "| method | cells with all four default-grid shapes | mean share one quote reaches |",
        "|---|---|---|",
    ]
    for name, (count, share) in map_ceilings(dirs).items():
        lines.append(f"| {name} | {count} | {100 * share:.1f} % |")
    return "\n".join(lines) + "\n"


def _task(result: dict[str, Any], shape: str, trials: int, seed: int) -> tuple[int, str, float]:
    return (
        result["cell"]["index"],
        shape,
        measure(result["cell"], shape, result["auto"], trials, seed),
    )


def main(argv: list[str] | None = None) -> int:
    """Run every cell's twins (``--workers`` processes), print and write the report."""
    from app.mechanisms import MECHANISMS

    p = argparse.ArgumentParser(prog="python -m benchmarks.quote_ceiling")
    p.add_argument(
        "--results", type=Path,
        default=Path("docs/results/planner/heldout_random_seed20261222.json"),
    )  # fmt: skip
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cells", type=int, default=None, help="only the first N cells")
    p.add_argument("--out", type=Path, default=None, help="write JSON + markdown here")
    p.add_argument("--maps", type=Path, nargs="+", default=None, help="read maps, run nothing")
    p.add_argument(
        "--summarize", type=Path, default=None,
        help="print the report of a JSON written by --out again (runs nothing)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.maps:
        print(map_report(args.maps))
        return 0
    if args.summarize is not None:
        rows = json.loads(args.summarize.read_text(encoding="utf-8"))
        print(report(rows, args.trials, args.seed))
        return 0
    results = json.loads(args.results.read_text(encoding="utf-8"))[: args.cells]
    start = time.perf_counter()
    twins: dict[int, dict[str, float]] = {r["cell"]["index"]: {} for r in results}
    with (
        single_threaded_env(),
        ProcessPoolExecutor(
            args.workers, mp_context=get_context("spawn"), initializer=init_worker,
            initargs=(tuple(MECHANISMS),),
        ) as pool,
    ):  # fmt: skip
        futures = [
            pool.submit(_task, r, shape, args.trials, args.seed)
            for r in results
            for shape in twins_of(r["cell"]["shape"])
        ]
        for f in futures:
            index, shape, value = f.result()
            twins[index][shape] = value
    rows = [cell_row(r, twins[r["cell"]["index"]]) for r in results]
    text = report(rows, args.trials, args.seed)
    text += f"\nfrom {args.results}; wall time {time.perf_counter() - start:.0f} s\n"
    print(text)
    if args.out:
        write_results(args.out, f"quote_ceiling_{args.results.stem}", rows, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
