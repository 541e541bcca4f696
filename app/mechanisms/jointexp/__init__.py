"""JointExp: the exponential mechanism over m quantiles, sampled exactly by a dynamic program.

The package's layout is its audit boundary: a privacy reviewer reads the modules marked
"law" (they decide which sequence is drawn with which probability); the modules marked
"speed only" choose how fast the law is computed and never change it.

================  ==============================================================  ==========
module            holds                                                           review
================  ==============================================================  ==========
mechanism.py      the forward rows, range rule, heavy-atom cut, storage and         law
                  backward draws; the probe, tilt and deficit heuristics that
                  pick a pass; public entry points (``jointexp``,
                  ``jointexp_core``, ``sample_interval_sequence``, ``JOINTEXP``)
kernels.py        numba loops of the forward recursions and the backward weights    law
error_bound.py    the sound bound on the error truncated rows carry into a draw     law
================  ==============================================================  ==========

Every public name the rest of the service uses is importable from
``app.mechanisms.jointexp``.
"""

from app.mechanisms.jointexp.mechanism import (
    COMPACT_FROM_BYTES,
    DECAY_TABLE_MAX,
    DEFICIT_MARGIN,
    DEFICIT_STEPS,
    EXT_TABLE_MAX,
    HEADROOM,
    JOINTEXP,
    LINEAR_RANGE,
    LOG_KEEP,
    MEMORY_BUDGET_BYTES,
    PROBE_KEEP,
    PROFILE_POINTS,
    PRUNE,
    TILT_MARGIN,
    TILT_RETRIES,
    TILT_STEPS,
    TINY_DRAW,
    collapse_cap,
    jointexp,
    jointexp_core,
    jointexp_sensitivity,
    median_log_width,
    quantile_gaps,
    sample_interval_sequence,
)

__all__ = [
    "COMPACT_FROM_BYTES",
    "DECAY_TABLE_MAX",
    "DEFICIT_MARGIN",
    "DEFICIT_STEPS",
    "EXT_TABLE_MAX",
    "HEADROOM",
    "JOINTEXP",
    "LINEAR_RANGE",
    "LOG_KEEP",
    "MEMORY_BUDGET_BYTES",
    "PROBE_KEEP",
    "PROFILE_POINTS",
    "PRUNE",
    "TILT_MARGIN",
    "TILT_RETRIES",
    "TILT_STEPS",
    "TINY_DRAW",
    "collapse_cap",
    "jointexp",
    "jointexp_core",
    "jointexp_sensitivity",
    "median_log_width",
    "quantile_gaps",
    "sample_interval_sequence",
]
