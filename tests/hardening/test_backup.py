"""``dpquant backup`` and ``dpquant restore`` on a real cluster: the restored database holds
the backup's ledger, balances and releases exactly, a real ``dpquant serve`` answers on it,
and no budget can be spent twice: every dataset is held until an admin states what was spent
after the backup, and a release pending at the backup is failed, not run again."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.runtime import cli

from .procs import DpquantServer, ThrowawayPostgres, migrate

pytestmark = [pytest.mark.processes, pytest.mark.own_cluster]

ADMIN_KEY = "dpq_bk-admin-" + secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres()
    try:
        yield pg
    finally:
        pg.destroy()


def database(cluster: ThrowawayPostgres) -> str:
    name = "bk_" + uuid.uuid4().hex[:8]
    admin = create_engine(cluster.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return cluster.url.rsplit("/", 1)[0] + "/" + name


def snapshot(url: str) -> dict[str, Any]:
    """The accounts and releases, as rows."""
    engine = create_engine(url)
    with engine.connect() as conn:
        out = {
            "ledger": conn.execute(
                text("SELECT id, dataset_id, kind, epsilon, delta, rho, release_id FROM "
                     "ledger_entry ORDER BY id")
            ).all(),
            "balance": conn.execute(
                text("SELECT dataset_id, granted_epsilon, spent_epsilon, granted_rho, spent_rho "
                     "FROM budget_balance ORDER BY dataset_id")
            ).all(),
            "releases": conn.execute(
                text("SELECT id, status, estimates, cost_epsilon FROM release ORDER BY seq")
            ).all(),
        }  # fmt: skip
    engine.dispose()
    return out


def query(c: httpx.Client, ds: str, headers: dict[str, str], **extra: Any) -> httpx.Response:
    return c.post(
        f"/v1/datasets/{ds}/quantiles",
        json={"quantiles": [0.5], "epsilon": "0.1", "method": "jointexp"},
        headers=headers | extra,
    )


def test_a_restore_keeps_the_accounts_and_holds_every_budget(
    cluster: ThrowawayPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = database(cluster)
    migrate(source)
    server = DpquantServer(source, ADMIN_KEY, workers=2)
    server.start()
    try:
        admin = server.headers()
        with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
            body = {"name": "bk", "lower": 0, "upper": 100, "epsilon": "1"}
            ds = c.post("/v1/datasets", json=body, headers=admin).json()["id"]
            assert c.put(f"/v1/datasets/{ds}/values", json=[float(v) for v in range(100)],
                         headers=admin).status_code == 200  # fmt: skip
            for _ in range(3):
                assert query(c, ds, admin).status_code == 201
            monkeypatch.setenv("DPQUANT_DATABASE_URL", source)
            path = tmp_path / "dpquant.dump"
            assert cli.main(["backup", str(path), "--note", "nightly"]) == 0
            report = json.loads(capsys.readouterr().out)
            assert report["bytes"] == path.stat().st_size > 0
            at_backup = snapshot(source)
            assert cli.main(["backup", str(path)]) == 2  # never overwrites
            # after the backup: two more releases (0.2 spent that the backup does not hold)
            for _ in range(2):
                assert query(c, ds, admin).status_code == 201
    finally:
        server.close()

    target = database(cluster)
    monkeypatch.setenv("DPQUANT_DATABASE_URL", target)
    assert cli.main(["restore", str(path)]) == 0
    restored = json.loads(capsys.readouterr().out)
    assert restored["datasets_held"] == 1 and restored["releases_failed"] == 0
    assert snapshot(target) == at_backup
    assert cli.main(["restore", str(path)]) == 2  # never over a database that has tables
    assert "new, empty database" in capsys.readouterr().err

    server = DpquantServer(target, ADMIN_KEY, workers=2)
    server.start()
    try:
        admin = server.headers()
        with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
            view = c.get(f"/v1/datasets/{ds}", headers=admin).json()
            assert view["restore_hold_since"] is not None
            assert (
                c.get(f"/v1/datasets/{ds}/budget", headers=admin).json()["remaining"]["epsilon"]
                == "0.7"
            )  # the backup's figure: 0.2 spent since is unknown here
            held = query(c, ds, admin)
            assert held.status_code == 409 and held.json()["type"] == "budget_on_hold"
            quote = c.post(f"/v1/datasets/{ds}/quote", json={"quantiles": [0.5],
                           "epsilon": "0.1"}, headers=admin).json()  # fmt: skip
            assert quote["affordable"] is False and any("hold" in w for w in quote["warnings"])
            confirm = c.post(
                f"/v1/datasets/{ds}/restore-confirmation",
                json={"epsilon": "0.2", "reason": "two releases after the nightly backup"},
                headers=admin,
            )
            assert confirm.status_code == 200, confirm.text
            assert confirm.json()["remaining"]["epsilon"] == "0.5"
            again = c.post(f"/v1/datasets/{ds}/restore-confirmation",
                           json={"reason": "twice"}, headers=admin)  # fmt: skip
            assert again.status_code == 409 and again.json()["type"] == "not_on_hold"
            assert query(c, ds, admin).status_code == 201
            ledger = c.get(f"/v1/datasets/{ds}/ledger", headers=admin).json()["items"]
            assert [e["kind"] for e in ledger[:2]] == ["debit", "adjustment"]
            audit = c.get("/v1/audit?limit=50", headers=admin).json()["items"]
            actions = {e["action"] for e in audit}
            assert {"database.restore", "budget.restore_confirmation"} <= actions
    finally:
        server.close()


def test_a_release_pending_at_the_backup_is_failed_not_run_again(
    cluster: ThrowawayPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without workers the release stays pending in the backup; the restore fails it (its
    cost stays debited), and a spending report larger than the budget is refused."""
    from fastapi.testclient import TestClient

    from app.api.factory import create_app
    from tests.support import app_settings

    source = database(cluster)
    migrate(source)
    with TestClient(create_app(app_settings(source, admin_key=ADMIN_KEY))) as c:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        ds = c.post("/v1/datasets", json={"name": "p", "lower": 0, "upper": 100,
                                          "epsilon": "1"}, headers=admin).json()["id"]  # fmt: skip
        c.put(f"/v1/datasets/{ds}/values", json=[1.0, 2.0, 3.0], headers=admin)
        pending = c.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.3", "method": "jointexp"},
            headers=admin | {"Prefer": "respond-async"},
        )
        assert pending.status_code == 202
    monkeypatch.setenv("DPQUANT_DATABASE_URL", source)
    path = tmp_path / "p.dump"
    assert cli.main(["backup", str(path)]) == 0
    target = database(cluster)
    monkeypatch.setenv("DPQUANT_DATABASE_URL", target)
    assert cli.main(["restore", str(path)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["releases_failed"] == 1
    with TestClient(create_app(app_settings(target, admin_key=ADMIN_KEY))) as c:
        rel = c.get(f"/v1/releases/{pending.json()['id']}", headers=admin).json()
        assert (rel["status"], rel["failure"]) == ("failed", "restored")
        budget = c.get(f"/v1/datasets/{ds}/budget", headers=admin).json()
        assert Decimal(budget["spent"]["epsilon"]) == Decimal("0.3")  # still debited
        over = c.post(f"/v1/datasets/{ds}/restore-confirmation",
                      json={"epsilon": "0.8", "reason": "r"}, headers=admin)  # fmt: skip
        assert over.status_code == 409 and over.json()["type"] == "budget_exhausted"
        ok = c.post(f"/v1/datasets/{ds}/restore-confirmation", json={"reason": "none since"},
                    headers=admin)  # fmt: skip
        assert ok.status_code == 200 and ok.json()["remaining"]["epsilon"] == "0.7"


def test_hold_only_holds_a_database_recovered_another_way(
    cluster: ThrowawayPostgres, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fastapi.testclient import TestClient

    from app.api.factory import create_app
    from tests.support import app_settings

    url = database(cluster)
    migrate(url)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with TestClient(create_app(app_settings(url, admin_key=ADMIN_KEY))) as c:
        ds = c.post("/v1/datasets", json={"name": "pitr", "lower": 0, "upper": 1,
                                          "epsilon": "1"}, headers=admin).json()["id"]  # fmt: skip
    monkeypatch.setenv("DPQUANT_DATABASE_URL", url)
    assert cli.main(["restore", "--hold-only", "--since", "2026-12-05T00:00:00"]) == 2
    assert "offset" in capsys.readouterr().err
    assert cli.main(["restore", "--hold-only", "--since", "2026-12-05T00:00:00+00:00"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["datasets_held"] == 1
    with TestClient(create_app(app_settings(url, admin_key=ADMIN_KEY))) as c:
        view = c.get(f"/v1/datasets/{ds}", headers=admin).json()
        assert view["restore_hold_since"].startswith("2026-12-05T00:00:00")
