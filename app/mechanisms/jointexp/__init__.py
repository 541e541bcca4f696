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
                    ``sample_interval_sequence``, ``JOINTEXP``): the passes in
                    order (linear, tilted, log, widened) and the retries of a
                    draw that lacks range
rows.py             a forward row, the inputs every pass derives, the exact     law
                    heavy-atom cut (``collapse_cap``) with its proof
range_rule.py       the range rule, its constants and their derivation, the     law
                    exceptions a pass raises when it lacks range
forward.py          the forward recursions (linear, tilted, log rows)            law
storage.py          rows kept whole, compact or as checkpoints, recomputed or    law
                    replayed as the same doubles
draws.py            the backward draws and their range checks                    law
accept.py           the acceptance step: a drawn sequence kept with probability  law
                    W(s) / (C P̂(s)) (exact rational ratio), the run parameter
                    and its floating-point slack
kernels_linear.py   numba loops of the linear-space forward recursions, the       law
                    linear draw weights, position helpers
kernels_log.py      numba loops of the log-space recursions, repeat levels and   law
                    log draw weights
kernels_scaled.py   numba loops of the log rows' recursions in extended-range    law
                    linear arithmetic (``ext`` and ``scaled``)
error_bound.py      the sound bound on the error truncated rows carry into a     law
                    draw, with its compiled block maxima
profile.py          what a pass records of its rows for choosing a tilt          speed only
strategy.py         tilts to try (chosen from a probe, larger, the cut's         speed only
                    deficit), the log pass's starting range and widening, the
                    decay-table cap; imports nothing from this package
==================  ===========================================================  ==========

Outside the package, :mod:`app.mechanisms.select` holds the O(n) order statistics the
median-width rule uses (law). Every public name the rest of the service uses is
importable from ``app.mechanisms.jointexp``.
"""

from app.mechanisms.jointexp.draws import TINY_DRAW
from app.mechanisms.jointexp.forward import EXT_TABLE_MAX
from app.mechanisms.jointexp.mechanism import (
    JOINTEXP,
    jointexp,
    jointexp_core,
    jointexp_sensitivity,
    quantile_gaps,
    sample_interval_sequence,
)
from app.mechanisms.jointexp.profile import PROFILE_POINTS
from app.mechanisms.jointexp.range_rule import (
    HEADROOM,
    LINEAR_RANGE,
    median_log_width,
    range_room,
)
from app.mechanisms.jointexp.rows import PRUNE, collapse_cap
from app.mechanisms.jointexp.storage import COMPACT_FROM_BYTES, MEMORY_BUDGET_BYTES
from app.mechanisms.jointexp.strategy import (
    DECAY_TABLE_MAX,
    DEFICIT_MARGIN,
    DEFICIT_STEPS,
    LOG_KEEP,
    PROBE_KEEP,
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
