"""Subnormals are flushed during JointExp's forward pass, and only there (app.mechanisms.fpmode)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from app.mechanisms import MECHANISMS, fpmode
from app.mechanisms.jointexp import mechanism as je

pytestmark = pytest.mark.skipif(
    not fpmode.available(), reason="MXCSR (flush-to-zero) exists on x86-64 only"
)

SUBNORMAL = 2.0**-1060
CONTROL = 0xFFC0  # MXCSR's control bits (the low six are sticky exception flags)


def _control() -> int:
    return fpmode.read_mxcsr() & CONTROL


@numba.njit(cache=False)
def _halve(x: float) -> float:
    return x * 0.5


def test_flush_subnormals_sets_ftz_and_daz_and_restores_the_previous_state() -> None:
    before = _control()
    tiny = np.array([SUBNORMAL])
    assert tiny[0] * 1.0 > 0.0 and _halve(SUBNORMAL) > 0.0
    with fpmode.flush_subnormals():
        assert fpmode.read_mxcsr() & fpmode.FTZ_DAZ == fpmode.FTZ_DAZ
        assert (tiny * 1.0)[0] == 0.0  # numpy: a subnormal operand reads as 0.0 (DAZ)
        assert _halve(2.0**-1022) == 0.0  # compiled code: a subnormal result is 0.0 (FTZ)
    assert _control() == before
    assert (tiny * 1.0)[0] == SUBNORMAL and _halve(SUBNORMAL) == 2.0**-1061


def test_flush_subnormals_restores_on_an_exception() -> None:
    before = _control()
    with pytest.raises(KeyError), fpmode.flush_subnormals():
        raise KeyError("x")
    assert _control() == before


def test_jointexp_flushes_during_its_pass_and_leaves_the_thread_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forward rows run with FTZ/DAZ set; after the call (and after a failure inside
    it) this thread's floating-point state is what it was."""
    seen: list[int] = []
    real = je.Forward.run

    def spy(self: je.Forward, *a: object, **k: object) -> None:
        seen.append(fpmode.read_mxcsr())
        real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(je.Forward, "run", spy)
    before = _control()
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 5.0, size=20_000)
    x[rng.random(x.size) < 0.05] = 150.0  # clamped: the tilted path
    q = np.arange(1, 100) / 100.0
    out = MECHANISMS["jointexp"].run(
        x, q, epsilon=1.0, delta=None, lower=-100.0, upper=100.0, rng=np.random.default_rng(0)
    )
    assert np.all(np.diff(out) >= 0.0)
    assert seen and all(s & fpmode.FTZ_DAZ == fpmode.FTZ_DAZ for s in seen)
    assert _control() == before

    def boom(self: je.Forward, *a: object, **k: object) -> None:
        raise FloatingPointError("injected")

    monkeypatch.setattr(je.Forward, "run", boom)
    with pytest.raises(FloatingPointError):
        MECHANISMS["jointexp"].run(x, q, epsilon=1.0, delta=None, lower=-100.0, upper=100.0)
    assert _control() == before
