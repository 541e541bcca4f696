"""Differentially private quantile mechanisms behind one interface.

``MECHANISMS`` maps a method name to a :class:`~app.mechanisms.registry.Mechanism` with two
entry points sharing one core:

    f(data, quantiles, *, epsilon, lower, upper, neighbors="swap", rng=None, **method_params)
        -> np.ndarray   # m estimates (doubles), sorted ascending, each in [lower, upper]
    f.run_grid(hist, quantiles, *, epsilon, delta, neighbors="swap", rng=None)
        -> np.ndarray   # m grid indices (int64), sorted ascending, each in [0, K]

plus its declared privacy guarantee (``notion``, ``requires_delta``, ``dp_cost``). Both run
on (distinct values, counts): cost grows with the number of distinct values, not with n.
This package is pure math: numpy, scipy, numba and randomgen only.

Modules: ``errors`` (the error type), ``validation`` (argument checks, array types), ``rng``
(CSPRNG and the integer-only uniform draw), ``histogram`` (GridHistogram and the prepared
support), ``registry`` (Mechanism), ``sampling`` (inverse CDF), ``exponential`` (the
single-quantile exponential mechanism), ``units`` (the row-level parameters of a release that
is private for a unit of k rows), one module per method.
"""

from __future__ import annotations

from app.mechanisms.appindexp import APPINDEXP
from app.mechanisms.aq import AQ
from app.mechanisms.csmooth import CSMOOTH
from app.mechanisms.errors import MechanismInputError
from app.mechanisms.histogram import GRID_POINTS_MAX, GridHistogram
from app.mechanisms.indexp import INDEXP
from app.mechanisms.jointexp import JOINTEXP
from app.mechanisms.jointexp_smooth import JOINTEXP_SMOOTH
from app.mechanisms.registry import Mechanism, PrivacyNotion
from app.mechanisms.smooth import SMOOTH
from app.mechanisms.validation import check_epsilon_share

MECHANISMS: dict[str, Mechanism] = {
    m.name: m for m in (JOINTEXP, INDEXP, APPINDEXP, SMOOTH, CSMOOTH, AQ, JOINTEXP_SMOOTH)
}


def get_mechanism(name: str) -> Mechanism:
    """Look a method up by name; unknown names raise :class:`MechanismInputError`."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise MechanismInputError(
            "method", f"unknown method {name!r}; known: {', '.join(sorted(MECHANISMS))}"
        ) from None


__all__ = [
    "GRID_POINTS_MAX",
    "MECHANISMS",
    "GridHistogram",
    "Mechanism",
    "MechanismInputError",
    "PrivacyNotion",
    "check_epsilon_share",
    "get_mechanism",
]
