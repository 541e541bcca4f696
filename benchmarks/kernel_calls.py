"""JointExp's row kernels on the calls of one real draw: timing and bit-for-bit comparison.

Usage::

    python -m benchmarks.kernel_calls                                  # both kernels, clamped5pct
    python -m benchmarks.kernel_calls --case continuous --kernel levels --runs 9
    python -m benchmarks.kernel_calls --kernel levels --variant mymod:linear_levels_step

One JointExp draw (m = 99, epsilon = 1, the issue-9 benchmark's data for ``--case``, n =
10^6, bounds [-100, 100]; see ``benchmarks.bench_mechanisms``) is run with the kernels
wrapped, and every call's arguments are copied. Each kernel (the shipped one, then each
``--variant``: ``module:function`` importable from the current directory or PYTHONPATH, same
signature) is then timed over all captured calls in this process (best and median of
``--runs``, subnormals flushed as in the pass), and a variant's outputs are compared with the
shipped kernel's, array by array: ``identical`` means the same doubles on every call.

This is how the stop-20 changes were measured (the repeat-levels kernel over the 197 calls
of one clamped draw: 83.6 -> 71.6 ms best of 7). Copies of large scratch arrays are kept
only up to 2^21 entries (the transition's output buffer is allocated per call instead).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.mechanisms import MECHANISMS
from app.mechanisms.fpmode import flush_subnormals
from app.mechanisms.jointexp import kernels_linear as K
from benchmarks.bench_mechanisms import CASES, _case_data

KERNELS = {"levels": "linear_levels_step", "transition": "transition_linear"}


def capture(case: str, names: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """The arguments of every call of each named kernel during one draw on ``case``."""
    mech = MECHANISMS["jointexp"]
    q = np.arange(1, 100) / 100.0
    x = _case_data(case, 10**6, 12345)
    mech.run(x, q, lower=-100.0, upper=100.0, rng=np.random.default_rng(0), epsilon=1.0, delta=None)
    calls: dict[str, list[tuple[Any, ...]]] = {name: [] for name in names}
    originals = {name: getattr(K, name) for name in names}

    def wrap(name: str) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            calls[name].append(
                tuple(a.copy() if isinstance(a, np.ndarray) and a.size < 2**21 else a for a in args)
            )
            return originals[name](*args)

        return wrapped

    # The pass calls both row kernels through K.linear_row (one compiled call per row); its
    # Python body calls them as module attributes, so it runs here to let the wrappers see them.
    fused = K.linear_row
    try:
        for name in names:
            setattr(K, name, wrap(name))
        K.linear_row = fused.py_func
        mech.run(
            x, q, lower=-100.0, upper=100.0, rng=np.random.default_rng(1), epsilon=1.0, delta=None
        )
    finally:
        for name, fn in originals.items():
            setattr(K, name, fn)
        K.linear_row = fused
    return calls


def _call(name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    if name == "transition_linear":  # the last argument is the output buffer: a fresh one
        out = np.empty_like(args[-1])
        count, top = fn(*args[:-1], out)
        return (count, top, out[:count].copy())
    return fn(*args)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
    return bool(a == b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--case", default="clamped5pct", choices=[c for c in CASES if c != "hist1e8"]
    )
    parser.add_argument("--kernel", choices=[*KERNELS, "both"], default="both")
    parser.add_argument("--variant", action="append", default=[], help="module:function")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if args.variant and args.kernel == "both":
        parser.error("--variant needs --kernel levels or --kernel transition")
    names = list(KERNELS.values()) if args.kernel == "both" else [KERNELS[args.kernel]]
    calls = capture(args.case, names)
    for name in names:
        found = calls[name]
        print(f"{name}: {len(found)} calls on {args.case}")
        candidates: list[tuple[str, Callable[..., Any]]] = [("shipped", getattr(K, name))]
        for spec in args.variant:
            module, _, attr = spec.partition(":")
            fn = getattr(importlib.import_module(module), attr or name)
            candidates.append((spec, fn))
        with flush_subnormals():
            reference = [_call(name, candidates[0][1], c) for c in found]
        for label, fn in candidates:
            with flush_subnormals():
                outputs = [_call(name, fn, c) for c in found]
            differ = sum(1 for o, r in zip(outputs, reference, strict=True) if not _same(o, r))
            times = []
            for _ in range(args.runs):
                with flush_subnormals():
                    t0 = time.perf_counter()
                    for c in found:
                        fn(*c)
                    times.append(time.perf_counter() - t0)
            verdict = "identical" if differ == 0 else f"{differ} calls differ"
            print(
                f"  {label:30s} best {min(times) * 1e3:7.1f} ms  "
                f"median {statistics.median(times) * 1e3:7.1f} ms  {verdict}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
