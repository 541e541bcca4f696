"""Error bodies: one shape, never a bare 500, never a data value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from .conftest import ADMIN, Api

# Recognisable values: if any of these digits show up in an analyst-visible body, it leaked.
# (Integer parts >= 600 cannot collide with the seconds field of a timestamp.)
SECRET_VALUES = [613.371337, 742.424242, 877.077077, 912.345678, 698.765432, 755.555555]
PATTERNS = ["613.37", "742.42", "877.07", "912.34", "698.76", "755.55"]


def assert_no_leak(body: bytes) -> None:
    text = body.decode(errors="replace")
    for pattern in PATTERNS:
        assert pattern not in text, (pattern, text)


def test_unexpected_exception_is_a_json_503_not_a_500(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("internal bug with a secret 613.371337")

    ds = api.dataset()
    monkeypatch.setattr("app.api.routes.ledger.service.read_budget", explode)
    r = client.get(f"/v1/datasets/{ds['id']}/budget", headers=ADMIN)
    assert r.status_code == 503
    assert r.json() == {
        "type": "internal_error",
        "detail": "internal error; nothing was charged, retry later",
    }
    assert_no_leak(r.content)


def test_unknown_route_and_method_use_the_error_shape(client: TestClient) -> None:
    r = client.get("/v1/nothing-here", headers=ADMIN)
    assert r.status_code == 404 and set(r.json()) == {"type", "detail"}
    r = client.patch("/v1/datasets", headers=ADMIN)
    assert r.status_code == 405 and r.json()["type"] == "method_not_allowed"


def test_validation_errors_never_echo_the_input(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=[1.0, 2.0])
    r = client.post(
        "/v1/datasets",
        json={"name": "x", "lower": "613.371337abc", "upper": 1},
        headers=ADMIN,
    )
    assert r.status_code == 422
    assert "613.37" not in r.text and "input" not in r.json()
    r = client.put(
        f"/v1/datasets/{ds['id']}/values",
        content=b"v\n1\n613.371337x\n",
        headers=ADMIN | {"content-type": "text/csv"},
        params={"column": "v"},
    )
    assert r.status_code == 422
    assert "613.37" not in r.text


def test_no_analyst_visible_response_contains_a_raw_data_value(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=SECRET_VALUES * 50, epsilon="3", upper=1000.0, granularity=1.0)
    analyst = api.key("analyst", ds["id"])
    viewer = api.key("viewer", ds["id"])
    bodies: list[bytes] = []
    rel = api.query(ds["id"], headers=analyst, method="jointexp", epsilon="1")
    assert rel.status_code == 201
    bodies.append(rel.content)
    for headers in (analyst, viewer):
        for path in (
            f"/v1/datasets/{ds['id']}",
            "/v1/datasets",
            f"/v1/datasets/{ds['id']}/budget",
            f"/v1/datasets/{ds['id']}/releases",
            f"/v1/releases/{rel.json()['id']}",
        ):
            r = client.get(path, headers=headers)
            assert r.status_code == 200, path
            bodies.append(r.content)
            bodies.append(json.dumps(dict(r.headers)).encode())
    # error paths an analyst can reach
    for change in (
        {"epsilon": "100"},
        {"quantiles": [0.5, 0.1]},
        {"method": "nope"},
        {"epsilon": "-1"},
    ):
        r = api.query(ds["id"], headers=analyst, **change)
        assert r.status_code in (409, 422)
        bodies.append(r.content)
    bodies.append(client.put(f"/v1/datasets/{ds['id']}/values", json=[1], headers=analyst).content)
    for body in bodies:
        assert_no_leak(body)
