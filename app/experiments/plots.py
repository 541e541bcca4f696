"""PNG figures in the style of the paper's Figures 3, 4 and 6 (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported; no display needed
import matplotlib.pyplot as plt

from app.experiments.datasets import DATASETS
from app.experiments.runner import Row

LABELS = {
    "jointexp": "JointExp",
    "indexp": "IndExp",
    "appindexp": "AppIndExp",
    "smooth": "Smooth",
    "csmooth": "CSmooth",
    "aq": "ApproximateQuantiles",
    "jointexp_smooth": "JointExp (smoothed)",
}
STYLES = {
    "jointexp": ("tab:cyan", "-"),
    "indexp": ("tab:purple", "--"),
    "appindexp": ("tab:orange", "--"),
    "smooth": ("tab:blue", "-."),
    "csmooth": ("tab:pink", "-."),
    "aq": ("tab:red", ":"),
    "jointexp_smooth": ("tab:green", "-"),
}
_FALLBACK = ("tab:gray", "tab:olive", "tab:brown", "tab:green")


def _style(method: str, i: int) -> tuple[str, str]:
    return STYLES.get(method, (_FALLBACK[i % len(_FALLBACK)], "-"))


def _label(method: str) -> str:
    return LABELS.get(method, method)


def _series(
    rows: Sequence[Row], x: str, y: str, se: str
) -> tuple[list[float], list[float], list[float]]:
    pts = sorted((float(r[x]), float(r[y]), float(r[se])) for r in rows)
    pts = [p for p in pts if math.isfinite(p[1]) and p[1] > 0]
    return (
        [p[0] for p in pts],
        [p[1] for p in pts],
        [p[2] if math.isfinite(p[2]) else 0 for p in pts],
    )


def _band(ax: object, xs: list[float], ys: list[float], ses: list[float], color: str) -> None:
    # On a log axis y - SE can be <= 0; the band is cut at the axis floor set by _floor.
    lo = [max(y - s, y * 1e-6) for y, s in zip(ys, ses, strict=True)]
    hi = [y + s for y, s in zip(ys, ses, strict=True)]
    ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)  # type: ignore[attr-defined]


def _floor(ax: object, values: Sequence[float]) -> None:
    positive = [float(v) for v in values if math.isfinite(float(v)) and float(v) > 0]
    if positive:
        ax.set_ylim(bottom=min(positive) / 2)  # type: ignore[attr-defined]


def plot_error(summary: Sequence[Row], epsilon: float, path: Path, methods: Sequence[str]) -> None:
    """Mean missed points per quantile vs m, one panel per dataset, log y, ±1 SE bands."""
    rows = [r for r in summary if float(r["epsilon"]) == epsilon]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    if not datasets:
        return
    cols = min(2, len(datasets))
    nrows = math.ceil(len(datasets) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 4.2 * nrows), squeeze=False)
    for k, d in enumerate(datasets):
        ax = axes[k // cols][k % cols]
        for i, meth in enumerate(methods):
            xs, ys, ses = _series(
                [r for r in rows if r["dataset"] == d and r["method"] == meth],
                "m",
                "missed_mean",
                "missed_mean_se",
            )
            if not xs:
                continue
            color, ls = _style(meth, i)
            ax.plot(xs, ys, ls, color=color, lw=2, label=_label(meth))
            _band(ax, xs, ys, ses, color)
        ax.set_yscale("log")
        _floor(ax, [r["missed_mean"] for r in rows if r["dataset"] == d])
        ax.set_title(DATASETS[d].label if d in DATASETS else d)
        ax.set_xlabel("number of quantiles m")
        ax.set_ylabel("mean missed points per quantile")
        ax.grid(True, which="both", alpha=0.3)
    for k in range(len(datasets), nrows * cols):
        axes[k // cols][k % cols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    fig.suptitle(f"Error vs m, ε = {epsilon:g} (n = 1000 per trial; bands: ±1 SE)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time_vs_m(
    summary: Sequence[Row], path: Path, methods: Sequence[str], dataset: str = "gaussian"
) -> None:
    """Median seconds per call vs m on one dataset at ε = 1 (the paper's Figure 4).

    The median, not the mean: calls take milliseconds on a shared machine, and a single
    descheduled call would dominate a mean of 20.
    """
    rows = [r for r in summary if r["dataset"] == dataset and float(r["epsilon"]) == 1.0]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, meth in enumerate(methods):
        xs, ys, _ = _series(
            [r for r in rows if r["method"] == meth], "m", "seconds_median", "seconds_se"
        )
        if not xs:
            continue
        color, ls = _style(meth, i)
        ax.plot(xs, ys, ls, color=color, lw=2, label=_label(meth))
    ax.set_yscale("log")
    _floor(ax, [r["seconds_median"] for r in rows])
    ax.set_xlabel("number of quantiles m")
    ax.set_ylabel("median seconds per call")
    ax.set_title(f"Time vs m, {DATASETS[dataset].label}, ε = 1, n = 1000")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(frameon=False, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time_vs_n(scaling: Sequence[Row], path: Path, methods: Sequence[str]) -> None:
    """Fastest of the calls per (method, m, n) vs n (log-log), one panel per m.

    The minimum, not the median: with a handful of calls per point on a shared machine, the
    minimum is the estimate least affected by other processes taking the core.
    """
    ms = sorted({int(r["m"]) for r in scaling})
    if not ms:
        return
    fig, axes = plt.subplots(1, len(ms), figsize=(6.2 * len(ms), 4.5), squeeze=False)
    for k, m in enumerate(ms):
        ax = axes[0][k]
        for i, meth in enumerate(methods):
            xs, ys, _ = _series(
                [r for r in scaling if r["method"] == meth and int(r["m"]) == m],
                "n",
                "seconds_min",
                "seconds_se",
            )
            if not xs:
                continue
            color, ls = _style(meth, i)
            ax.plot(xs, ys, ls, color=color, lw=2, marker="o", label=_label(meth))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (Gaussian data)")
        ax.set_ylabel("seconds per call (fastest of the calls)")
        ax.set_title(f"Time vs n, m = {m}, ε = 1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(frameon=False, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
