"""Issue 11, item 4: budget figures are written one way; the banner; quantile error texts."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from app.core.amounts import AmountPublic, plain_decimal
from app.core.config import Settings
from app.runtime.cli import admin_key_banner
from tests.service.conftest import Api

PLAIN = re.compile(r"^(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("0", "0"),
        ("0E-12", "0"),
        ("-0", "0"),
        ("0.000000000000", "0"),
        ("5", "5"),
        ("5.0", "5"),
        ("5.000000000000", "5"),
        ("0.1", "0.1"),
        ("0.10", "0.1"),
        ("1e-7", "0.0000001"),
        ("1E-12", "0.000000000001"),
        ("5E+2", "500"),
        ("1.5e3", "1500"),
        ("123456789.000000000001", "123456789.000000000001"),
    ],
)
def test_plain_decimal(value: str, text: str) -> None:
    assert plain_decimal(Decimal(value)) == text
    assert Decimal(text) == Decimal(value)  # only the notation changes


def test_amount_serialises_through_plain_decimal() -> None:
    amount = AmountPublic(epsilon=Decimal("5.000000000000"), delta=Decimal("0E-12"))
    assert amount.model_dump(mode="json") == {"epsilon": "5", "delta": "0"}
    assert amount.model_dump_json() == '{"epsilon":"5","delta":"0"}'
    assert amount.model_dump()["epsilon"] == Decimal("5")  # python mode keeps the Decimal


def _figures(body: object) -> list[str]:
    """Every string under an ``epsilon``/``delta`` key, anywhere in a JSON body."""
    out: list[str] = []
    if isinstance(body, dict):
        for k, v in body.items():
            if k in ("epsilon", "delta") and isinstance(v, str):
                out.append(v)
            else:
                out.extend(_figures(v))
    elif isinstance(body, list):
        for v in body:
            out.extend(_figures(v))
    return out


def test_every_response_writes_figures_plainly(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=[float(v) for v in range(1, 101)], epsilon="5.0", delta="1e-7")
    assert ds["budget_remaining"] == {"epsilon": "5", "delta": "0.0000001"}
    r = client.post(
        f"/v1/datasets/{ds['id']}/grants",
        json={"epsilon": "0.50", "reason": "more"},
        headers=api.admin,
    )
    assert r.status_code == 201, r.text
    assert r.json()["epsilon"] == "0.5" and r.json()["delta"] == "0"
    release = api.query(ds["id"], epsilon="0.10")
    assert release.status_code == 201, release.text
    assert release.json()["epsilon"] == "0.1"
    assert release.json()["cost"] == {"epsilon": "0.1", "delta": "0"}
    assert release.json()["remaining"] == {"epsilon": "5.4", "delta": "0.0000001"}
    refused = api.query(ds["id"], epsilon="100")
    assert refused.status_code == 409
    assert refused.json()["requested"] == {"epsilon": "100", "delta": "0"}
    assert refused.json()["remaining"] == {"epsilon": "5.4", "delta": "0.0000001"}
    bodies = [
        ds,
        r.json(),
        release.json(),
        refused.json(),
        api.budget(ds["id"]),
        client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json(),
        client.get(f"/v1/datasets/{ds['id']}/ledger", headers=api.admin).json(),
        client.get(f"/v1/datasets/{ds['id']}/releases", headers=api.admin).json(),
    ]
    figures = _figures(bodies)
    assert len(figures) > 20
    for text in figures:
        assert PLAIN.match(text), text
    assert api.budget(ds["id"])["granted"] == {"epsilon": "5.5", "delta": "0.0000001"}


def test_quantile_errors_name_the_index(api: Api) -> None:
    ds = api.dataset(values=[1.0, 2.0, 3.0])
    r = api.query(ds["id"], quantiles=[1.5])
    assert r.status_code == 422
    assert "quantiles[0] must lie strictly inside (0, 1)" in r.json()["detail"]
    assert "quantile 0" not in r.json()["detail"]
    r = api.query(ds["id"], quantiles=[0.2, 0.6, 0.4])
    assert r.status_code == 422
    assert "quantiles[2] must be greater than quantiles[1]" in r.json()["detail"]


def test_banner_says_whether_the_bootstrap_key_is_set() -> None:
    unset = admin_key_banner(
        Settings(database_url="postgresql://unused/unused", bootstrap_admin_key=None)
    )
    assert "is not set" in unset and "create-key" in unset
    key = "k" * 8 + "Zq3vT9wLx2Pm7Rn4Ys6Bd1Hf5Jc8Gk0A"
    configured = Settings(database_url="postgresql://unused/unused", bootstrap_admin_key=key)
    line = admin_key_banner(configured)
    assert "is set" in line and "not set" not in line and "create-key" not in line
    assert key not in line
