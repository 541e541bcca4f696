"""The exact pick (``pick_weights``): the law is each computed weight's exact share.

An inverse CDF over one 53-bit uniform and floating-point cumulative sums moves each
outcome's probability by the rounding of its cut points (~n u of the total) and gives a
weight below 2^-53 of the total no share at all; JointExp's draws use ``pick_weights``
instead, which decides in doubles only where the rounding cannot matter and in exact
integer arithmetic, with more bits of the uniform, where it could.
"""

from __future__ import annotations

import collections
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import sampling as S


class _Words:
    """A stand-in generator: ``bit_generator.random_raw()`` returns the given words."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.bit_generator = self

    def random_raw(self) -> int:
        return self.words.pop(0)


def _exact_pick(weights: np.ndarray, bits: list[int]) -> int:
    """The pick of the ideal uniform whose leading bits are ``bits`` (64 per word), decided
    from the exact shares (Fractions), or -2 when those bits do not decide it."""
    vals = [Fraction(float(w)) for w in weights]
    total = sum(vals, Fraction(0))
    b = 64 * len(bits)
    numer = 0
    for w in bits:
        numer = (numer << 64) | w
    lo, hi = Fraction(numer, 1 << b) * total, Fraction(numer + 1, 1 << b) * total
    acc = Fraction(0)
    for k, v in enumerate(vals):
        if v > 0 and lo >= acc and hi <= acc + v:
            return k
        acc += v
    return -2


def _cut_words(weights: np.ndarray) -> list[int]:
    """Words at and next to every cut point ``C_k / S`` (where doubles cannot decide)."""
    vals = [Fraction(float(w)) for w in weights]
    total = sum(vals, Fraction(0))
    out, acc = [], Fraction(0)
    for v in vals:
        acc += v
        w = int(acc / total * (1 << 64))
        out += [max(0, min((1 << 64) - 1, w + d)) for d in (-2, -1, 0, 1)]
    return out


WEIGHTS = [
    np.array([1.0, 2.0, 3.0]),
    np.array([0.5, 0.0, 0.25, 0.25]),
    np.array([1.0, 1e-30, 1.0]),
    np.array([3e-300, 1.0, 0.0, 7.0, 1e-17]),
    np.random.default_rng(5).exponential(1.0, 200),
]


@pytest.mark.parametrize("weights", WEIGHTS, ids=range(len(WEIGHTS)))
def test_every_decision_is_the_exact_one(weights: np.ndarray) -> None:
    """For random words and words at every cut point, the pick equals the exact rational
    decision of the ideal uniform (more words drawn where 64 bits do not decide)."""
    rng = np.random.default_rng(11)
    words = [int(w) * 2 for w in rng.integers(0, 2**63, 300, dtype=np.int64)]
    for word in words + _cut_words(weights):
        more = [int(x) * 2 + 1 for x in rng.integers(0, 2**63, 4, dtype=np.int64)]
        got = S.pick_weights(weights, word, _Words(more))  # type: ignore[arg-type]
        bits = [word]
        want = _exact_pick(weights, bits)
        while want == -2:
            bits.append(more[len(bits) - 1])
            want = _exact_pick(weights, bits)
        assert got == want, (word, bits)
        assert weights[got] > 0.0


def test_a_weight_far_below_2_pow_minus_53_of_the_total_can_be_picked() -> None:
    """[1, 1e-30, 1]: index 1 has probability 5e-31, which no 53-bit uniform reaches; the
    uniform whose bits put ``U S`` inside ``[1, 1 + 1e-30)`` picks it (found by the exact
    arithmetic with a second word), and the words just outside it do not."""
    weights = np.array([1.0, 1e-30, 1.0])
    total = Fraction(2) + Fraction(1e-30)
    target = (Fraction(1) + Fraction(1e-30) / 2) / total  # the middle of index 1's share
    scaled = target * (1 << 128)
    word, second = divmod(int(scaled), 1 << 64)
    assert S.pick_weights(weights, word, _Words([second])) == 1  # type: ignore[arg-type]
    assert S.pick_word(weights, np.uint64(word)) == -2  # undecidable in doubles
    assert S.pick_weights(weights, word - 1, _Words([second])) == 0  # type: ignore[arg-type]
    assert S.pick_weights(weights, word + 1, _Words([second])) == 2  # type: ignore[arg-type]


def test_draws_follow_the_weights() -> None:
    """20,000 picks of [0.5, 0.3, 0.2] with a real generator: chi-square p > 1e-4."""
    rng = np.random.default_rng(3)
    weights = np.array([0.5, 0.3, 0.2])
    seen = collections.Counter(
        S.pick_weights(weights, int(rng.bit_generator.random_raw()), rng) for _ in range(20_000)
    )
    p = stats.chisquare([seen[k] for k in range(3)], 20_000 * weights).pvalue
    assert p > 1e-4


def test_all_zero_weights_pick_nothing() -> None:
    assert S.pick_weights(np.zeros(3), 123, _Words([])) == -1  # type: ignore[arg-type]
