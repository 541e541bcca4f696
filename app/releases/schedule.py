"""When a release is published: a run-time bound from public figures only .

A release's run time depends on the data (the number of distinct cells, their shape, the
path JointExp's sampler takes), so its finish time is a data-dependent observable. The
service therefore publishes every release at ``run start + bound``, where the bound is
computed from public figures alone — the method, the number of quantiles m, the grid, the
dataset's public size (n under swap neighbours, the admin-declared ``size_hint`` under
add/remove) and the service's limits (``DPQUANT_MAX_CELLS``) — and is meant to exceed the
run time on every input those figures allow:

* non-admin readers see a finished release as ``pending`` until its publication time, and
  that time in place of its finish time (:func:`app.api.routes.releases.present`);
* a synchronous ``POST`` holds its answer until then (or answers 202 when its wait ends
  first), so the status and the response time are functions of the bound too;
* the worker that ran it holds its slot until then before claiming its next release, so the
  queue moves at the pace of the bounds, not of the runs: another release's start time (and
  through it its publication time) does not reveal how long this one took.

A run that outlives its bound is published when it finishes (``published_at`` is the later
of the two): the residue, counted by ``dpquant_release_overruns_total`` and measured in
docs/security.md. Admins see the real finish time; operators the real run times in
``/metrics`` (``dpquant_mechanism_seconds``).

The model is ``scale * (FLOOR_S + cells * (PER_CELL_S + PER_CELL_QUANTILE_S * m))``, capped at
the hard time limit, with ``cells`` the most distinct cells the dataset can have. Its
constants were set from the worst of the measured shapes (normal data and 10 %-clamped data
on grids of 10 to 10^6 cells, m = 1 to 999, every method; ``benchmarks/bench_timing_leak.py``
reports how often a run outlives its bound) with a factor of ~3 above them on the machine the
benchmarks run on. ``DPQUANT_PUBLISH_SCALE`` scales the bound for slower or faster
machines; ``0`` turns publication times off (releases are visible when they finish).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.codec.grid import grid_size
from app.mechanisms.aq import recursion_depth
from app.mechanisms.jointexp_smooth import REFINED_MAX, substep_bits

#: Every run's bound includes this much: loading the job, the database round trips and the
#: smallest runs (a JointExp run on 10 cells takes ~1 ms; a claim, load and store ~3 ms).
FLOOR_S = 0.01
#: Per distinct cell: loading and validating the histogram, building the support.
PER_CELL_S = 4e-7
#: Per distinct cell and quantile: JointExp's forward pass (tied and clamped shapes take the
#: tilted or log-space path: ~1.3e-8 s on the benchmark's 10 %-clamped data, up to ~6e-8 on
#: grids with ties of ~10 records a cell and 12.5 % at each bound); the exponential-mechanism
#: methods' weights (IndExp: ~5e-8 at m = 999).
PER_CELL_QUANTILE_S = {"jointexp": 1e-7, "smooth": 5e-8, "other": 5e-8, "tree": 5e-8}
#: Per quantile (Python work per row or node; smooth sensitivity's per-quantile search,
#: ~9 ms, plus its O(n) pass over the ranks, n public under swap, the only relation it
#: runs on) and, for JointExp, per quantile squared: many quantiles in few cells keep up to
#: m repeat levels a row (10 cells, m = 999: ~2.8 s).
PER_QUANTILE_S = {"jointexp": 1e-4, "smooth": 2e-2, "other": 1e-4, "tree": 1e-4}
PER_QUANTILE_RECORD_S = {"jointexp": 0.0, "smooth": 2e-7, "other": 0.0, "tree": 0.0}
PER_QUANTILE_SQ_S = {"jointexp": 3e-6, "smooth": 0.0, "other": 0.0, "tree": 0.0}
#: JointExp per quantile and cell within the kernel's reach (~3000 / epsilon ranks, so at
#: most that many cells): small epsilon widens every row (10^5 values, m = 99, epsilon =
#: 0.01: ~3 s on rows that take 0.05 s at epsilon = 1; the smoothed variant on its refined
#: cells up to ~8 s).
PER_QUANTILE_RANK_S = 1e-6
#: JointExp's decay tables: ``750 / c`` entries (c >= epsilon / 4), capped by the data's last
#: rank (private under add/remove, so its public bound is used), built by each of up to
#: ``TABLE_PASSES`` passes, plus the log pass's scaled tables of at most 2^20 entries.
TABLE_PASSES = 6
PER_TABLE_ENTRY_S = 3e-8
SCALED_TABLE_MAX = 1 << 20
#: The exponential mechanism's decay tables: ``693 / c_j`` ranks per quantile, c_j =
#: epsilon / (4 m) for IndExp's split budget, in steps of 64 (exponential.fill_weights).
#: AQ ("tree") passes over the cells once per level of its recursion, not once per quantile:
#: D = floor(log2 m) + 1 levels whose nodes hold disjoint cells, each node's reach
#: ``693 / c`` with c >= epsilon / (4 D), at most m nodes a level.
PER_NODE_RANK_S = 1.5e-8 / 64.0


def passes(method: str, m: int) -> int:
    """How many times a run of ``method`` with ``m`` quantiles weighs every cell: once per
    quantile, except AQ, once per level of its recursion (its nodes of a level are
    disjoint)."""
    return recursion_depth(m) if _family(method) == "tree" else m


def cells_bound(
    *, grid_points: int, neighbors: str, n: int | None, size_hint: int | None, max_cells: int
) -> int:
    """The most distinct cells the run can see, from public figures: the grid's points, the
    service's cell limit, and the public size (n under swap, where it is public; the
    declared size hint under add/remove, which is the admin's promise, not a limit)."""
    bound = min(int(grid_points), int(max_cells))
    size = n if neighbors == "swap" else size_hint
    if size is not None:
        bound = min(bound, max(1, int(size)))
    return max(1, bound)


def run_bound_s(
    *,
    m: int,
    cells: int,
    scale: float,
    cap_s: float,
    method: str = "jointexp",
    epsilon: float = 1.0,
    size: int | None = None,
) -> float:
    """The publication delay of a run of ``method`` with ``m`` quantiles at ``epsilon`` on at
    most ``cells`` cells and ``size`` records (public bounds; ``size`` None: ``cells``), 0.0
    when ``scale`` is 0 (publication times off). At most ``cap_s``."""
    if scale <= 0.0:
        return 0.0
    records = float(cells if size is None else max(size, 1))
    eps = max(float(epsilon), 1e-300)
    family = _family(method)
    raw = (
        FLOOR_S
        + cells * (PER_CELL_S + PER_CELL_QUANTILE_S[family] * passes(method, m))
        + m * (PER_QUANTILE_S[family] + PER_QUANTILE_RECORD_S[family] * records)
        + PER_QUANTILE_SQ_S[family] * m * m
    )
    if family == "jointexp":
        reach = min(records, 3000.0 / eps + 2.0)
        raw += TABLE_PASSES * PER_TABLE_ENTRY_S * (reach + min(records, SCALED_TABLE_MAX))
        raw += PER_QUANTILE_RANK_S * m * min(float(cells), reach)
    elif family == "tree":
        levels = recursion_depth(m)
        raw += levels * PER_NODE_RANK_S * min(records, 2800.0 * m * levels / eps)
    else:
        raw += m * PER_NODE_RANK_S * min(records, 2800.0 * m / eps)
    bound = scale * raw
    return min(bound, cap_s) if math.isfinite(bound) else cap_s


#: Per group of a grouped release: the group's support and the method's set-up, beside the
#: per-quantile terms every run pays. Measured on groups of 0 to 30 cells (2-core machine,
#: warm): JointExp 0.13 ms + 0.018 ms per quantile, the other methods 0.01 ms + 0.007 ms per
#: quantile; these floors with PER_QUANTILE_S keep >= 3x above both at every m. AQ also
#: stretches each group's grid and spreads its end cells' records (0.03-0.09 ms a group:
#: 10^4 groups of 100 records, 10 % at a bound, m = 1, in 0.65-0.95 s).
GROUP_FLOOR_S = {"jointexp": 4e-4, "smooth": 1e-3, "other": 5e-5, "tree": 1.5e-4}


#: Partition selection draws exact discrete Laplace noise for every stored key (at most
#: MAX_STORED_KEYS, app.datasets.groups.MAX_KEYS; how many there are is private): measured
#: ~8-15 us a key, so 5e-5 s.
SELECTION_PER_KEY_S = 5e-5
MAX_STORED_KEYS = 10_000


def grouped_bound_s(
    *,
    groups: int,
    m: int,
    cells: int,
    size: int,
    scale: float,
    cap_s: float,
    method: str,
    epsilon: float,
) -> float:
    """The publication delay of a grouped release: :func:`run_bound_s`'s terms for ``groups``
    runs of at most ``cells`` cells each, whose records sum to at most ``size`` (the group
    sizes are private; their sum is the public size): a term linear in a run's records or
    cells is summed over the groups with that total, a per-run term is paid per group."""
    if scale <= 0.0:
        return 0.0
    g = max(1, groups)
    records = float(max(size, 1))
    eps = max(float(epsilon), 1e-300)
    family = _family(method)
    total_cells = min(float(g) * cells, records + g)
    raw = (
        FLOOR_S
        + g
        * (GROUP_FLOOR_S[family] + m * PER_QUANTILE_S[family] + PER_QUANTILE_SQ_S[family] * m * m)
        + total_cells * (PER_CELL_S + PER_CELL_QUANTILE_S[family] * passes(method, m))
        + m * PER_QUANTILE_RECORD_S[family] * records
    )
    if family == "jointexp":
        reach = 3000.0 / eps + 2.0
        raw += (
            TABLE_PASSES
            * PER_TABLE_ENTRY_S
            * (min(records + g, g * reach) + min(records + g, g * float(SCALED_TABLE_MAX)))
        )
        raw += PER_QUANTILE_RANK_S * m * min(total_cells, g * reach)
    elif family == "tree":
        levels = recursion_depth(m)
        raw += levels * PER_NODE_RANK_S * min(records + g, g * 2800.0 * m * levels / eps)
    else:
        raw += m * PER_NODE_RANK_S * min(records + g, g * 2800.0 * m / eps)
    bound = scale * raw
    return min(bound, cap_s) if math.isfinite(bound) else cap_s


def _family(method: str) -> str:
    if method.startswith("jointexp"):
        return "jointexp"
    if method == "aq":
        return "tree"
    return "smooth" if method in ("smooth", "csmooth") else "other"


def bound_of_claim(
    row: Mapping[str, Any],
    *,
    scale: float,
    max_cells: int,
    max_values: int,
    cap_s: float,
) -> float:
    """The bound of a claimed release, from the public figures the claim read: the method,
    m, epsilon, the grid, n under swap, the size hint under add/remove, and the service's
    limits (``max_values`` stands for n where it is private and no hint is declared)."""
    lower, upper, granularity = row["lower"], row["upper"], row["granularity"]
    try:
        points = grid_size(lower, upper, granularity)
    except (TypeError, ValueError, OverflowError):
        points = max_cells
    neighbors = str(row["neighbors"])
    public_n = row.get("public_n") if neighbors == "swap" else None
    hint = row.get("size_hint")
    size = int(public_n if public_n is not None else hint if hint is not None else max_values)
    cells = cells_bound(
        grid_points=points,
        neighbors=neighbors,
        n=public_n,
        size_hint=hint,
        max_cells=max_cells,
    )
    method = str(row["method"])
    if method == "jointexp_smooth":  # JointExp on the refined grid
        b = substep_bits(points, public_n)
        cells = max(1, min(cells << b, size, REFINED_MAX if public_n is None else cells << b))
    m = len(row["quantiles"]) if row.get("quantiles") is not None else 1
    keys = row.get("group_keys")
    if keys is not None:
        steps = int(row.get("max_rows_per_unit") or 1) * (2 if neighbors == "swap" else 1)
        discover = keys.get("discover") if isinstance(keys, dict) else None
        bound = grouped_bound_s(
            groups=len(keys) if discover is None else int(discover["max_keys"]), m=m,
            cells=cells, size=size, scale=scale, cap_s=cap_s, method=method,
            epsilon=float(row["epsilon"]) / steps,
        )  # fmt: skip
        if discover is not None and scale > 0.0:  # the selection's noise, one per stored key
            bound = min(cap_s, bound + scale * SELECTION_PER_KEY_S * MAX_STORED_KEYS)
        return bound
    return run_bound_s(
        m=m,
        cells=cells,
        scale=scale,
        cap_s=cap_s,
        method=method,
        epsilon=float(row["epsilon"]),
        size=size,
    )


__all__ = ["bound_of_claim", "cells_bound", "grouped_bound_s", "run_bound_s"]
