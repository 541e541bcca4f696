"""Pure helpers: grid, pricing, cursors, settings."""

from __future__ import annotations

import math
import os
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.api.http import decode_cursor, encode_cursor
from app.core.config import Settings
from app.core.errors import DpquantError
from app.datasets.service import default_granularity, snap_to_grid
from app.ledger.service import COST_QUANTUM, mechanism_float, price


@pytest.mark.parametrize(
    ("lower", "upper", "expected"),
    [(0, 100, 1e-4), (0, 1, 1e-6), (-1e6, 1e6, 1.0), (0, 99.99, 1e-5), (0, 1e-3, 1e-9)],
)
def test_default_granularity_is_the_largest_power_of_ten_below_a_millionth(
    lower: float, upper: float, expected: float
) -> None:
    assert default_granularity(lower, upper) == pytest.approx(expected, rel=1e-12)
    assert default_granularity(lower, upper) <= (upper - lower) / 1e6


@given(
    lower=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
    u=st.lists(st.floats(0, 1), min_size=1, max_size=20),
)
def test_snapping_lands_on_the_grid_inside_the_bounds(
    lower: float, width: float, u: list[float]
) -> None:
    upper = lower + width
    g = default_granularity(lower, upper)
    x = np.sort(lower + np.asarray(u) * width)
    out = snap_to_grid(x, lower=lower, upper=upper, granularity=g)
    assert np.all(out >= lower) and np.all(out <= upper)
    assert np.all(np.diff(out) >= 0)
    # the same grid point always maps to the same double: snapping is idempotent
    np.testing.assert_array_equal(snap_to_grid(out, lower=lower, upper=upper, granularity=g), out)


def test_neighbouring_inputs_share_one_output_lattice() -> None:
    # Two samples differing in their low-order bits snap to the same double.
    a = np.array([50.123456789012345])
    b = np.nextafter(a, np.inf)
    kw = {"lower": 0.0, "upper": 100.0, "granularity": 1e-4}
    assert snap_to_grid(a, **kw)[0] == snap_to_grid(b, **kw)[0] == 50.1235


def test_price_charges_requested_decimal_when_exact_and_rounds_up_otherwise() -> None:
    # The mechanism runs with the largest double <= the decimal and charges exactly that:
    # the ledger debits the decimal itself (never less than what the mechanism used).
    below = mechanism_float(Decimal("0.1"))
    assert below < 0.1 and Decimal(below) <= Decimal("0.1") < Decimal(math.nextafter(below, 1))
    assert price(Decimal("0.1"), below) == Decimal("0.1")
    # A cost above the decimal (0.1 as a double is 0.1000000000000000055...) rounds up.
    assert price(Decimal("0.1"), 0.1) == Decimal("0.100000000001")
    for text in ("0.5", "1", "1e-7", "0.3", "2.000000000000000000001"):
        f = mechanism_float(Decimal(text))
        assert Decimal(f) <= Decimal(text) < Decimal(math.nextafter(f, math.inf))
    assert price(None, 0.0) == 0
    computed = 1.2345678901234567
    converted = price(Decimal("1"), computed)
    assert converted == Decimal("1.234567890124")
    assert converted >= Decimal(computed)
    assert price(None, 1e-20) == COST_QUANTUM
    with pytest.raises(ValueError):
        price(None, float("inf"))


def test_cursor_roundtrip_and_rejection() -> None:
    assert decode_cursor(encode_cursor(12345)) == 12345
    assert decode_cursor(None) is None
    with pytest.raises(DpquantError) as info:
        decode_cursor("bm9wZQ")
    assert info.value.status_code == 422


@pytest.mark.parametrize(
    "secret",
    [
        "changeme",
        "admin",
        "short",
        # long enough, and still placeholders (issue 28: the list never fired, every entry
        # was shorter than the length the check asked for first)
        "please-change-me-to-a-long-random-secret-value",
        "CHANGE_ME_CHANGE_ME_CHANGE_ME_CHANGE_ME",
        "replace-me-with-your-own-generated-value-1234",
        "a" * 43,
        "0123456789" * 4,
        "your_secret_goes_here_and_it_is_long_enough",
    ],
)
def test_settings_refuse_placeholder_secrets(secret: str) -> None:
    with pytest.raises(ValidationError):
        Settings(bootstrap_admin_key=secret)
    with pytest.raises(ValidationError):
        Settings(metrics_token=secret)


def test_settings_accept_random_secrets() -> None:
    """No false refusals: 2,000 secrets as README tells operators to make them."""
    import secrets

    for _ in range(2000):
        raw = secrets.token_urlsafe(32)
        assert Settings(bootstrap_admin_key=raw, metrics_token=raw).bootstrap_admin_key


def test_settings_read_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPQUANT_MAX_UPLOAD_BYTES", "1234")
    monkeypatch.setenv("DPQUANT_MAX_QUANTILES", "7")
    settings = Settings()
    assert settings.max_upload_bytes == 1234 and settings.max_quantiles == 7


def test_a_worker_claims_one_release_at_a_time() -> None:
    from app.runtime.worker import MAX_BATCH, batch_size

    # one release a claim: a release is never leased to a worker busy with another run
    assert MAX_BATCH == 1
    assert [batch_size(n, 2) for n in (0, 1, 2, 3, 4, 16)] == [1] * 6
    assert batch_size(10**6, 2) == MAX_BATCH
    assert batch_size(5, 1) == 1 and batch_size(5, 0) == 1


def test_release_workers_run_below_the_apis_priority() -> None:
    """A worker's CPU load must not slow the API's answers to others (issue 28: a viewer
    polling during a 0.5 s run got fewer answers than during a 2 ms one): workers add
    WORKER_NICENESS to their niceness (in a child process here, to leave pytest's alone)."""
    import subprocess
    import sys

    from app.runtime.worker import WORKER_NICENESS

    code = (
        "import os\n"
        "from app.runtime.worker import lower_priority\n"
        "before = os.nice(0)\n"
        "lower_priority()\n"
        "print(os.nice(0) - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before = os.nice(0)
    assert int(out.stdout) == min(WORKER_NICENESS, 19 - before)


@pytest.mark.parametrize("method", ["indexp", "aq", "jointexp", "jointexp_smooth"])
def test_a_quote_refuses_less_than_the_smallest_epsilon_per_quantile(method: str) -> None:
    """Past 1,000 quantiles the smallest epsilon a method accepts is not enough for the picks'
    floating-point guarantee: the quote (which runs before anything is reserved) answers 422
    on body.epsilon, and the mechanisms refuse the same split at run time."""
    from app.mechanisms import get_mechanism
    from app.mechanisms.errors import MechanismInputError
    from app.releases.planning import quote
    from app.releases.schemas import QuantileQuery

    mech = get_mechanism(method)
    qs = [(i + 1) / 2002 for i in range(2001)]
    query = QuantileQuery(method=method, quantiles=qs, epsilon=Decimal("2e-7"))
    with pytest.raises(DpquantError) as caught:
        quote(mech, query)
    assert caught.value.status_code == 422 and caught.value.detail.startswith("body.epsilon")
    assert "per quantile" in caught.value.detail
    with pytest.raises(MechanismInputError) as refused:
        mech.run(np.linspace(0.0, 1.0, 50), qs, epsilon=2e-7, delta=None, lower=0.0, upper=1.0)
    assert refused.value.parameter == "epsilon"
    # At 10^-10 per quantile the quote passes: the rule binds exactly at its threshold.
    ok = QuantileQuery(method=method, quantiles=qs[:1000], epsilon=Decimal("1e-7"))
    assert quote(mech, ok).epsilon > 0
