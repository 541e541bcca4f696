"""Aggregation of raw rows into summary tables, and the paper-claims comparison.

Standard errors are ``sd / sqrt(k)`` over the ``k`` successful trials (sample standard
deviation, ``ddof=1``; NaN when ``k < 2``).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.experiments.runner import Row

SUMMARY_FIELDS = (
    "dataset",
    "method",
    "epsilon",
    "m",
    "trials",
    "failed",
    "missed_mean",
    "missed_mean_se",
    "missed_sum",
    "missed_sum_se",
    "seconds_mean",
    "seconds_se",
    "seconds_median",
)
SCALING_SUMMARY_FIELDS = (
    "method",
    "m",
    "n",
    "trials",
    "seconds_mean",
    "seconds_se",
    "seconds_median",
    "seconds_min",
    "missed_mean",
    "status",
)

PAPER_COMPETITORS = ("indexp", "appindexp", "smooth", "csmooth")


def mean_se(values: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error of the finite values (NaN, NaN when there are none)."""
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return math.nan, math.nan
    se = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size >= 2 else math.nan
    return float(arr.mean()), se


def median(values: Iterable[float]) -> float:
    """Median of the finite values (NaN when there are none)."""
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    return float(np.median(arr)) if arr.size else math.nan


def summarize_accuracy(rows: Sequence[Row]) -> list[Row]:
    """One row per (dataset, method, ε, m): mean ± SE of missed points and of seconds."""
    groups: dict[tuple[str, str, float, int], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["method"], r["epsilon"], r["m"])].append(r)
    out: list[Row] = []
    for (dataset, method, eps, m), rs in groups.items():
        ok = [r for r in rs if not r["error"]]
        mm, mm_se = mean_se(r["missed_mean"] for r in ok)
        ms, ms_se = mean_se(float(r["missed_sum"]) for r in ok)
        sec, sec_se = mean_se(r["seconds"] for r in ok)
        out.append(
            {
                "dataset": dataset,
                "method": method,
                "epsilon": eps,
                "m": m,
                "trials": len(ok),
                "failed": len(rs) - len(ok),
                "missed_mean": mm,
                "missed_mean_se": mm_se,
                "missed_sum": ms,
                "missed_sum_se": ms_se,
                "seconds_mean": sec,
                "seconds_se": sec_se,
                "seconds_median": median(r["seconds"] for r in ok),
            }
        )
    return out


def summarize_scaling(rows: Sequence[Row]) -> list[Row]:
    """One row per (method, m, n): mean ± SE of seconds, or the reason it was not run."""
    groups: dict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["m"], r["n"])].append(r)
    out: list[Row] = []
    for (method, m, n), rs in sorted(groups.items()):
        ok = [r for r in rs if r["status"] == "ok"]
        sec, sec_se = mean_se(r["seconds"] for r in ok)
        missed, _ = mean_se(r["missed_mean"] for r in ok)
        bad = [r["status"] for r in rs if r["status"] != "ok"]
        out.append(
            {
                "method": method,
                "m": m,
                "n": n,
                "trials": len(ok),
                "seconds_mean": sec,
                "seconds_se": sec_se,
                "seconds_median": median(r["seconds"] for r in ok),
                "seconds_min": min((r["seconds"] for r in ok), default=math.nan),
                "missed_mean": missed,
                "status": bad[0] if bad else "ok",
            }
        )
    return out


def write_csv(path: Path, fields: Sequence[str], rows: Iterable[Row]) -> None:
    """Write rows (dicts) with a fixed column order; ``None``/NaN become empty cells."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="raise")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r.get(k)) for k in fields})


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return repr(v)
    return v


# --------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class Claim:
    """One row of the paper-vs-ours table."""

    key: str
    paper: str
    ours: str
    holds: bool | None  # None: not computable from this run


def _fmt(x: float, digits: int = 3) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:.0f}"


class _Lookup:
    def __init__(self, summary: Sequence[Row]) -> None:
        self._t: dict[tuple[str, str, float, int], Row] = {
            (r["dataset"], r["method"], float(r["epsilon"]), int(r["m"])): r for r in summary
        }
        self.datasets = list(dict.fromkeys(r["dataset"] for r in summary))
        self.methods = list(dict.fromkeys(r["method"] for r in summary))

    def err(self, dataset: str, method: str, eps: float, m: int) -> float:
        r = self._t.get((dataset, method, eps, m))
        return float(r["missed_mean"]) if r is not None else math.nan

    def se(self, dataset: str, method: str, eps: float, m: int) -> float:
        r = self._t.get((dataset, method, eps, m))
        return float(r["missed_mean_se"]) if r is not None else math.nan

    def pm(self, dataset: str, method: str, eps: float, m: int) -> str:
        """``mean±SE`` of one cell."""
        mean, se = self.err(dataset, method, eps, m), self.se(dataset, method, eps, m)
        return f"{_fmt(mean)}±{_fmt(se, 2)}"

    def ratio(self, dataset: str, num: str, den: str, eps: float, m: int) -> tuple[float, float]:
        """err(num) / err(den) and its delta-method standard error."""
        a, b = self.err(dataset, num, eps, m), self.err(dataset, den, eps, m)
        sa, sb = self.se(dataset, num, eps, m), self.se(dataset, den, eps, m)
        if not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
            return math.nan, math.nan
        r = a / b
        rel = math.hypot(sa / a if a > 0 else 0.0, sb / b)
        return r, r * rel

    def best_other(
        self, dataset: str, eps: float, m: int, among: Sequence[str]
    ) -> tuple[str, float]:
        cands = [(self.err(dataset, meth, eps, m), meth) for meth in among if meth in self.methods]
        cands = [(v, meth) for v, meth in cands if math.isfinite(v)]
        if not cands:
            return "", math.nan
        v, meth = min(cands)
        return meth, v


def evaluate_claims(summary: Sequence[Row], timing: Sequence[Row] | None = None) -> list[Claim]:
    """Compute the paper's claims (a)–(e) from our summary table.

    Args:
        summary: Output of :func:`summarize_accuracy`.
        timing: Rows of the summary for the timing figure (defaults to Gaussian, ε = 1).

    Returns:
        One :class:`Claim` per statement (per dataset where the paper states it per dataset).
    """
    t = _Lookup(summary)
    claims: list[Claim] = []
    have_joint = "jointexp" in t.methods
    competitors = [c for c in PAPER_COMPETITORS if c in t.methods]
    extra = [c for c in t.methods if c not in (*PAPER_COMPETITORS, "jointexp")]

    # (a) JointExp's mean missed points per quantile <= 10 for m <= 20, eps = 1.
    for d in t.datasets:
        vals = [(t.err(d, "jointexp", 1.0, m), m) for m in range(1, 21)]
        vals = [(v, m) for v, m in vals if math.isfinite(v)]
        if not have_joint or not vals:
            claims.append(Claim(f"(a) {d}", "≤ 10 per quantile for all m ≤ 20", "n/a", None))
            continue
        worst, m_worst = max(vals)
        claims.append(
            Claim(
                f"(a) {d}",
                "≤ 10 per quantile for all m ≤ 20",
                f"max over m ≤ 20 = {t.pm(d, 'jointexp', 1.0, m_worst)} (at m={m_worst}; "
                f"{len(vals)} m values)",
                worst <= 10.0,
            )
        )

    # (b) eps = 1: best competitor / JointExp >= 2 at m = 6 and ~10 at m = 15.
    for m, paper, test in ((6, "≥ 2×", lambda r: r >= 2.0), (15, "≈ 10×", lambda r: r >= 5.0)):
        for d in t.datasets:
            claims.append(
                _ratio_claim(t, f"(b) {d}, m={m}", paper, d, 1.0, m, competitors, extra, test)
            )

    # (c) IndExp / JointExp ~10 at m = 9 and ~20 at m = 19 (eps = 1).
    for m, paper, lo in ((9, "≈ 10×", 5.0), (19, "≈ 20×", 10.0)):
        for d in t.datasets:
            ratio, ratio_se = t.ratio(d, "indexp", "jointexp", 1.0, m)
            ok = math.isfinite(ratio)
            text = (
                f"{_fmt(ratio)}±{_fmt(ratio_se, 2)}× (IndExp {t.pm(d, 'indexp', 1.0, m)} vs "
                f"JointExp {t.pm(d, 'jointexp', 1.0, m)})"
            )
            claims.append(
                Claim(
                    f"(c) {d}, m={m}",
                    f"IndExp {paper} worse",
                    text if ok else "n/a",
                    (ratio >= lo) if ok else None,
                )
            )

    # (d) eps = 0.1, m = 3: JointExp >= 5x better than any other method.
    for d in t.datasets:
        claims.append(
            _ratio_claim(
                t, f"(d) {d}, ε=0.1, m=3", "≥ 5×", d, 0.1, 3, competitors, extra, lambda r: r >= 5
            )
        )

    # (e) JointExp is the slowest method (Gaussian, eps = 1).
    tim = (
        timing
        if timing is not None
        else [r for r in summary if r["dataset"] == "gaussian" and float(r["epsilon"]) == 1.0]
    )
    if tim and have_joint:
        m_max = max(int(r["m"]) for r in tim)
        at = {r["method"]: float(r["seconds_median"]) for r in tim if int(r["m"]) == m_max}
        ranking = sorted(at, key=lambda k: -at[k])
        desc = ", ".join(f"{k} {at[k] * 1e3:.3g} ms" for k in ranking)
        claims.append(
            Claim(
                f"(e) time, Gaussian ε=1, m={m_max}",
                "JointExp slowest, then Smooth/CSmooth, then IndExp/AppIndExp",
                f"median per call, slowest→fastest: {desc}",
                ranking[0] == "jointexp",
            )
        )
    else:
        claims.append(Claim("(e) time", "JointExp slowest", "n/a", None))
    return claims


def _ratio_claim(
    t: _Lookup,
    key: str,
    paper: str,
    d: str,
    eps: float,
    m: int,
    competitors: Sequence[str],
    extra: Sequence[str],
    test: Any,
) -> Claim:
    best, _ = t.best_other(d, eps, m, competitors)
    ratio, ratio_se = t.ratio(d, best, "jointexp", eps, m) if best else (math.nan, math.nan)
    if not math.isfinite(ratio):
        return Claim(key, f"JointExp {paper} better than best competitor", "n/a", None)
    text = (
        f"{_fmt(ratio)}±{_fmt(ratio_se, 2)}× (best of paper's: {best} {t.pm(d, best, eps, m)} "
        f"vs JointExp {t.pm(d, 'jointexp', eps, m)})"
    )
    xbest, _ = t.best_other(d, eps, m, extra)
    if xbest:
        xr, _ = t.ratio(d, xbest, "jointexp", eps, m)
        text += f"; {xbest} {t.pm(d, xbest, eps, m)} ({_fmt(xr)}×)"
    return Claim(key, f"JointExp {paper} better than best competitor", text, bool(test(ratio)))


def claims_markdown(claims: Sequence[Claim]) -> str:
    """The claims as a Markdown table."""
    lines = ["| claim | paper | ours | holds? |", "|---|---|---|---|"]
    for c in claims:
        holds = "n/a" if c.holds is None else ("yes" if c.holds else "**no**")
        lines.append(f"| {c.key} | {c.paper} | {c.ours} | {holds} |")
    return "\n".join(lines) + "\n"
