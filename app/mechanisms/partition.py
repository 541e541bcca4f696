"""Differentially private partition selection: which keys of a categorical column to answer
when the keys themselves are private.

Each key's row count gets exact discrete Laplace noise and the key is kept when the noisy
count reaches a threshold (Korolova et al. 2009; Desfontaines, Voss, Gipson & Mandayam 2022,
"Differentially private partition selection", whose optimal rule this simple one is within
a small factor of; Tumult's ``get_groups`` and PipelineDP's private partitions are of the
same kind).

**Guarantee.** A unit owns at most k rows in all; one unit-level neighbour changes the
per-key row counts by at most r in L1 norm (r = k under add/remove, 2k under swap, as for
grouped releases: :func:`app.mechanisms.grouped.chain_length`), and adds (or removes) at most
k keys with counts summing to at most r. For the keys present on both sides, the noisy
counts (discrete Laplace with ``P(z) ∝ p^|z|``, ``p = e^(-ε/r)``) are ε-DP, and keeping a key
is post-processing. A key present on one side only has a count ``c <= r``, and is kept with
probability ``P(Z >= τ - c) <= p^(τ - r) / (1 + p)``; over at most k such keys the threshold
``τ = r + t``, with t the least integer such that ``k p^t / (1 + p) <= δ``, bounds the total
by δ. So the selection is (ε, δ)-DP for one unit; it composes with the grouped release it
feeds (which is private for any fixed key set) by sequential composition.

**Exact noise.** The noise is sampled exactly from the OS CSPRNG with integer arithmetic only
(Canonne, Kamath & Steinke 2020, Algorithm 2, with Bernoulli(e^-γ) for rational γ by their
Algorithm 1): no floating-point noise whose low bits could leak a count (Mironov 2012). The
threshold is computed in floating point and raised by one step for its rounding.

Pure math: no service imports.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from fractions import Fraction

from app.mechanisms.errors import MechanismInputError

#: ``randbelow(n)``: a uniform integer in [0, n) (default: the OS CSPRNG).
RandBelow = Callable[[int], int]


def _bernoulli(num: int, den: int, randbelow: RandBelow) -> bool:
    """Bernoulli(num / den), 0 <= num <= den."""
    return randbelow(den) < num


def bernoulli_exp(gamma: Fraction, randbelow: RandBelow) -> bool:
    """Bernoulli(e^-gamma) for a rational gamma >= 0, exactly (CKS 2020, Algorithm 1)."""
    while gamma > 1:
        if not bernoulli_exp(Fraction(1), randbelow):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(gamma.numerator, gamma.denominator * k, randbelow):
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, randbelow: RandBelow = secrets.randbelow) -> int:
    """An integer z with P(z) proportional to e^(-|z| / scale), exactly (CKS 2020, Alg. 2)."""
    if scale <= 0:
        raise MechanismInputError("scale", "must be positive")
    t, s = scale.numerator, scale.denominator  # e^(-|z| s / t)
    while True:
        u = randbelow(t)
        if not bernoulli_exp(Fraction(u, t), randbelow):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), randbelow):
            v += 1
        y = (u + t * v) // s
        negative = randbelow(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def threshold(epsilon: Fraction, delta: float, steps: int, new_keys: int) -> int:
    """The count a key's noisy count must reach (module docstring): ``r + t`` with t the
    least integer such that ``new_keys * p^t / (1 + p) <= delta``, ``p = e^(-epsilon / r)``,
    plus one for the floating-point rounding of the logarithms."""
    if not 0.0 < delta < 1.0:
        raise MechanismInputError("delta", "must lie strictly between 0 and 1")
    log_p = -float(epsilon) / steps
    p = math.exp(log_p)
    t = math.ceil(math.log(delta * (1.0 + p) / new_keys) / log_p)
    return steps + max(t, 0) + 1


def select_keys(
    counts: Mapping[str, int],
    *,
    epsilon: Fraction,
    delta: float,
    steps: int,
    new_keys: int,
    randbelow: RandBelow = secrets.randbelow,
) -> list[str]:
    """The keys whose noisy row count reaches :func:`threshold`, sorted (so their order says
    nothing about their counts). ``counts``: every key present in the data with its row
    count (>= 1). ``steps``: r, the L1 change one unit makes; ``new_keys``: the most keys one
    unit can add (k)."""
    if epsilon <= 0:
        raise MechanismInputError("epsilon", "must be positive")
    tau = threshold(epsilon, delta, steps, max(1, new_keys))
    scale = Fraction(steps) / epsilon
    return sorted(key for key, c in counts.items() if c + discrete_laplace(scale, randbelow) >= tau)


__all__ = ["bernoulli_exp", "discrete_laplace", "select_keys", "threshold"]
