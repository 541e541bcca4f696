"""Issue 10: quotes, method "auto", expected errors and warnings, /v1/methods, size hints.

The quote follows the reservation's pricing path (``plan_query``), so its cost is the debit
of the release that follows, for every method; it moves no budget and depends on public
figures only (a hypothesis property test compares quotes of datasets that share their public
figures but not their values).
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.mechanisms import MECHANISMS

from .conftest import ADMIN, Api

SAMPLE = [float(v) for v in range(1, 201)]


def quote(client: TestClient, dataset_id: str, headers: dict[str, str] = ADMIN, **body: Any) -> Any:
    payload: dict[str, Any] = {"quantiles": [0.25, 0.5, 0.75], "epsilon": "0.1"}
    payload.update(body)
    return client.post(f"/v1/datasets/{dataset_id}/quote", json=payload, headers=headers)


def body_for(method: str, epsilon: str = "0.3") -> dict[str, Any]:
    out: dict[str, Any] = {"method": method, "epsilon": epsilon, "quantiles": [0.1, 0.5, 0.9]}
    if MECHANISMS[method].uses_delta:
        out["delta"] = "0.000001"
    return out


def test_quote_cost_equals_the_debit_of_the_following_release_for_every_method(
    api: Api, client: TestClient
) -> None:
    for method in MECHANISMS:
        ds = api.dataset(values=SAMPLE, epsilon="50", delta="0.001")
        body = body_for(method)
        q = quote(client, ds["id"], **body)
        assert q.status_code == 200, (method, q.text)
        figures = q.json()
        assert figures["method"] == method
        assert figures["affordable"] is True
        before = api.budget(ds["id"])
        assert before["spent"] == {"epsilon": "0", "delta": "0"}  # the quote moved nothing
        r = api.query(ds["id"], **body)
        assert r.status_code == 201, (method, r.text)
        assert r.json()["cost"] == figures["cost"], method
        after = api.budget(ds["id"])
        assert after["spent"] == figures["cost"], method
        assert after["remaining"] == figures["remaining_after"], method
        # the release carries the expected error the quote announced
        assert r.json()["expected_error"] == figures["expected_error"], method


def test_a_quote_moves_no_budget_and_says_when_it_is_unaffordable(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="0.2")
    for _ in range(3):
        q = quote(client, ds["id"], method="indexp", epsilon="0.5")
        assert q.status_code == 200
        assert q.json()["affordable"] is False
        assert q.json()["remaining_after"] is None
    budget = api.budget(ds["id"])
    assert budget["spent"] == {"epsilon": "0", "delta": "0"}
    ok = quote(client, ds["id"], method="indexp", epsilon="0.2").json()
    assert ok["affordable"] is True and ok["remaining_after"] == {"epsilon": "0", "delta": "0"}
    # and no release was created by quoting
    r = client.get(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN)
    assert r.json()["items"] == []


def test_quote_lists_every_eligible_method_and_respects_delta(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="5", delta="0.001")
    pure = quote(client, ds["id"], method="auto").json()
    names = {a["method"] for a in pure["alternatives"]}
    assert names == {n for n, m in MECHANISMS.items() if not m.uses_delta}
    assert pure["method"] in names
    approx = quote(client, ds["id"], method="auto", delta="0.000001").json()
    assert {a["method"] for a in approx["alternatives"]} == set(MECHANISMS)
    for alt in approx["alternatives"]:
        expected_delta = "0.000001" if MECHANISMS[alt["method"]].uses_delta else "0"
        assert alt["cost"]["delta"] == expected_delta, alt
        assert alt["expected_error"] is not None
        assert len(alt["expected_error"]) == 3
        for e in alt["expected_error"]:
            assert 0 <= e["mean"] <= e["bound90"]


def test_auto_records_the_resolved_method(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="5")
    q = quote(client, ds["id"], method="auto", quantiles=[0.5], epsilon="1").json()
    assert q["method"] in MECHANISMS
    r = api.query(ds["id"], method="auto", quantiles=[0.5], epsilon="1")
    assert r.status_code == 201, r.text
    assert r.json()["method"] == q["method"]
    assert r.json()["cost"] == q["cost"]
    stored = client.get(f"/v1/releases/{r.json()['id']}", headers=ADMIN).json()
    assert stored["method"] == q["method"]
    assert stored["status"] == "done"
    # a delta given with auto is only charged when an approximate method is chosen
    r2 = api.query(ds["id"], method="auto", quantiles=[0.5], epsilon="1", delta="0.000001")
    assert r2.status_code in (201, 409), r2.text  # 409 only if an approximate one won (δ=0)
    if r2.status_code == 201:
        assert not MECHANISMS[r2.json()["method"]].uses_delta
        assert r2.json()["cost"]["delta"] == "0" and r2.json()["delta"] is None


def test_auto_runs_the_smoothed_jointexp_on_tied_and_continuous_data_alike(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ties are private: 500 ratings on a grid of 5 points and on a grid of 40,001 points
    look alike to the planner beyond their public figures, and ``auto`` runs jointexp_smooth
    on both (the release records it, the quote said it); the forced ties of the coarse grid
    are quoted from the tied models."""
    ratings = [float(1 + i % 5) for i in range(500)]
    picks = {}
    for step in (1.0, 0.0001):
        ds = api.dataset(values=ratings, lower=1.0, upper=5.0, granularity=step, epsilon="5")
        q = quote(client, ds["id"], method="auto", epsilon="1").json()
        r = api.query(ds["id"], method="auto", quantiles=[0.25, 0.5, 0.75], epsilon="1")
        assert r.status_code == 201, r.text
        assert r.json()["method"] == q["method"]
        picks[step] = q["method"]
        # on ties the smoothed method's answers are the ratings' quartiles, or next to them
        assert all(abs(e - t) <= 1 for e, t in zip(r.json()["estimates"], [2, 3, 4], strict=True))
    assert picks == {1.0: "jointexp_smooth", 0.0001: "jointexp_smooth"}
    # the quote reads the tied model set where the public figures force ties (500 records on
    # 5 grid points) and the continuous one on the fine grid, and says so in no other way
    import app.planner as planner

    for step, regime in ((1.0, "tied"), (0.0001, "continuous")):
        ds = api.dataset(values=ratings, lower=1.0, upper=5.0, granularity=step, epsilon="5")
        q = quote(client, ds["id"], method="aq", quantiles=[0.5], epsilon="1").json()
        err = planner.expected_error("aq", 500, [0.5], 1.0, None, "swap", regime=regime)
        assert err is not None
        assert q["expected_error"][0]["mean"] == float(f"{err[0]:.4g}"), (step, regime)
        assert q["expected_error"][0]["bound90"] == float(f"{err[1]:.4g}")
    # a model that ranks IndExp far ahead in every regime: auto follows it on both grids
    real = planner.expected_error

    def indexp_first(method: str, *args: Any, **kwargs: Any) -> planner.ErrorFigures | None:
        err = real(method, *args, **kwargs)
        if err is None or method == "indexp":
            return err
        return planner.ErrorFigures(*(10 * v + 10 for v in err))

    monkeypatch.setattr(planner, "expected_error", indexp_first)
    for step in (1.0, 0.0001):
        ds = api.dataset(values=ratings, lower=1.0, upper=5.0, granularity=step, epsilon="5")
        r = api.query(ds["id"], method="auto", quantiles=[0.5], epsilon="1")
        assert r.status_code == 201, r.text
        assert r.json()["method"] == "indexp", step


def test_expected_error_under_add_remove_needs_a_size_hint(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="5", neighbors="add_remove")
    assert ds["size_hint"] is None
    q = quote(client, ds["id"], method="jointexp").json()
    assert q["expected_error"] is None
    assert all(a["expected_error"] is None for a in q["alternatives"])
    assert any("size_hint" in w for w in q["warnings"])
    r = client.patch(f"/v1/datasets/{ds['id']}", json={"size_hint": 1000}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["size_hint"] == 1000
    q2 = quote(client, ds["id"], method="jointexp").json()
    assert q2["expected_error"] is not None
    # the hint, not the true n (200), is what the planner used: same as a swap dataset of 1000
    twin = api.dataset(values=[float(v % 97) for v in range(1000)], epsilon="5")
    assert (
        quote(client, twin["id"], method="jointexp").json()["expected_error"]
        == q2["expected_error"]
    )
    cleared = client.patch(f"/v1/datasets/{ds['id']}", json={"size_hint": None}, headers=ADMIN)
    assert cleared.status_code == 200 and cleared.json()["size_hint"] is None
    assert (
        client.patch(f"/v1/datasets/{ds['id']}", json={"size_hint": 0}, headers=ADMIN).status_code
        == 422
    )


def test_size_hint_at_creation_is_public(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, neighbors="add_remove", size_hint=5000)
    viewer = api.key("viewer", ds["id"])
    seen = client.get(f"/v1/datasets/{ds['id']}", headers=viewer).json()
    assert seen["size_hint"] == 5000 and seen["n"] is None  # n is private under add_remove


def test_releases_warn_when_the_noise_is_a_large_share_of_the_ranks(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="5")
    qs = [i / 101 for i in range(1, 101)]
    r = api.query(ds["id"], method="indexp", quantiles=qs, epsilon="0.01")
    assert r.status_code == 201, r.text
    rel = r.json()
    assert rel["expected_error"] is not None and len(rel["expected_error"]) == 100
    assert any("% of the ranks" in w for w in rel["warnings"]), rel["warnings"]
    calm = api.query(ds["id"], method="jointexp", quantiles=[0.5], epsilon="2").json()
    assert calm["warnings"] == []


def test_methods_endpoint_lists_the_registry(api: Api, client: TestClient) -> None:
    viewer = api.key("viewer")
    r = client.get("/v1/methods", headers=viewer)
    assert r.status_code == 200
    rows = {m["name"]: m for m in r.json()}
    assert set(rows) == set(MECHANISMS)
    for name, mech in MECHANISMS.items():
        assert rows[name]["guarantee"] == mech.notion.value
        assert rows[name]["needs_delta"] is mech.uses_delta
        assert rows[name]["neighbors"] == list(mech.neighbors)
        assert rows[name]["description"] == mech.summary
    assert client.get("/v1/methods").json() == r.json()  # public: no key needed


def test_quote_refusals_match_the_quantile_endpoint(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE, epsilon="1", neighbors="add_remove")
    assert quote(client, ds["id"], method="smooth", delta="0.000001").status_code == 422
    assert quote(client, ds["id"], method="nope").status_code == 422
    assert quote(client, ds["id"], method="indexp", delta="0.000001").status_code == 422
    viewer = api.key("viewer", ds["id"])
    assert quote(client, ds["id"], headers=viewer).status_code == 403


_quote_settings = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_quote_settings
@given(
    seed=st.integers(0, 2**31),
    m=st.integers(1, 12),
    eps=st.sampled_from(["0.05", "0.3", "1", "4"]),
    with_delta=st.booleans(),
    neighbors=st.sampled_from(["swap", "add_remove"]),
)
def test_quotes_depend_on_public_figures_only(
    api: Api,
    client: TestClient,
    seed: int,
    m: int,
    eps: str,
    with_delta: bool,
    neighbors: str,
) -> None:
    rnd = random.Random(seed)
    n = rnd.randint(1, 300)
    # same public figures (bounds, grid, neighbours, budget, n, hint), different values
    a = [rnd.uniform(0, 100) for _ in range(n)]
    b = [rnd.choice([3.0, 97.5]) for _ in range(n)]
    hint = rnd.choice([None, 10, 10_000])
    common: dict[str, Any] = {"epsilon": "2", "delta": "0.01", "neighbors": neighbors}
    if hint is not None:
        common["size_hint"] = hint
    da = api.dataset(values=a, **common)
    db = api.dataset(values=b, **common)
    body: dict[str, Any] = {
        "method": "auto",
        "quantiles": [(j + 1) / (m + 1) for j in range(m)],
        "epsilon": eps,
    }
    if with_delta:
        body["delta"] = str(Decimal("0.000001"))
    ra, rb = quote(client, da["id"], **body), quote(client, db["id"], **body)
    assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
    assert ra.content == rb.content
