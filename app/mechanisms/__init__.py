"""Differentially private quantile mechanisms behind one interface.

``MECHANISMS`` maps a method name to a :class:`~app.mechanisms.base.Mechanism`: a callable
with the shared signature ::

    f(data, quantiles, *, epsilon, lower, upper, neighbors="swap", rng=None, **method_params)
        -> np.ndarray   # m estimates, sorted ascending, each in [lower, upper]

plus its declared privacy guarantee (``notion``, ``requires_delta``, ``dp_cost``).
This package is pure math: numpy, scipy and numba only.
"""

from __future__ import annotations

from app.mechanisms.appindexp import APPINDEXP
from app.mechanisms.aq import AQ
from app.mechanisms.base import (
    Mechanism,
    MechanismInputError,
    PrivacyNotion,
)
from app.mechanisms.csmooth import CSMOOTH
from app.mechanisms.indexp import INDEXP
from app.mechanisms.jointexp import JOINTEXP
from app.mechanisms.smooth import SMOOTH

MECHANISMS: dict[str, Mechanism] = {
    m.name: m for m in (JOINTEXP, INDEXP, APPINDEXP, SMOOTH, CSMOOTH, AQ)
}


def get_mechanism(name: str) -> Mechanism:
    """Look a method up by name; unknown names raise :class:`MechanismInputError`."""
    try:
        return MECHANISMS[name]
    except KeyError:
        raise MechanismInputError(
            "method", f"unknown method {name!r}; known: {', '.join(sorted(MECHANISMS))}"
        ) from None


__all__ = ["MECHANISMS", "Mechanism", "MechanismInputError", "PrivacyNotion", "get_mechanism"]
