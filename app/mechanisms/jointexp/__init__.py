"""JointExp: the exponential mechanism over m quantiles, sampled exactly by a dynamic program.

The package's layout is its audit boundary. A privacy reviewer must read the modules marked
"law": they decide which sequence of intervals is drawn with which probability. The
modules marked "speed only" choose how fast the law is computed (which tilt or range a
pass tries first); every pass they choose checks the law's rules itself, so they cannot
change the law.

==================  ===========================================================  ==========
module              holds                                                        review
==================  ===========================================================  ==========
mechanism.py        entry points (``jointexp``, ``jointexp_core``,               law
                    ``sample_interval_sequence``, ``JOINTEXP``); the inputs,
                    the heavy-atom cut, rows, the range rule and its
                    constants, the forward pass and its storage and
                    checkpoints, the backward draws; the probe and the
                    choice of a tilt from it
kernels_linear.py   numba loops of the linear-space forward recursions, the       law
                    linear draw weights, position helpers
kernels_log.py      numba loops of the log-space recursions, repeat levels and   law
                    log draw weights
kernels_scaled.py   numba loops of the log rows' recursions in extended-range    law
                    linear arithmetic (``ext`` and ``scaled``)
error_bound.py      the sound bound on the error truncated rows carry into a     law
                    draw, with its compiled block maxima
strategy.py         tilts to try (chosen, larger, the cut's deficit), the log    speed only
                    pass's widening, the decay-table cap; imports nothing from
                    this package
==================  ===========================================================  ==========

Outside the package, :mod:`app.mechanisms.select` holds the O(n) order statistics the
median-width rule uses (law). Every public name the rest of the service uses is
importable from ``app.mechanisms.jointexp``.
"""

from app.mechanisms.jointexp.mechanism import (
    COMPACT_FROM_BYTES,
    EXT_TABLE_MAX,
    HEADROOM,
    JOINTEXP,
    LINEAR_RANGE,
    LOG_KEEP,
    MEMORY_BUDGET_BYTES,
    PROBE_KEEP,
    PROFILE_POINTS,
    PRUNE,
    TINY_DRAW,
    collapse_cap,
    jointexp,
    jointexp_core,
    jointexp_sensitivity,
    median_log_width,
    quantile_gaps,
    range_room,
    sample_interval_sequence,
)
from app.mechanisms.jointexp.strategy import (
    DECAY_TABLE_MAX,
    DEFICIT_MARGIN,
    DEFICIT_STEPS,
    TILT_MARGIN,
    TILT_RETRIES,
    TILT_STEPS,
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
    "range_room",
    "sample_interval_sequence",
]
