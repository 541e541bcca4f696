"""Migrations: reversible, and identical to the models (autogenerate finds nothing)."""

from __future__ import annotations

from collections.abc import Callable

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.core.db import (
    current_revisions,
    downgrade_database,
    head_revisions,
    upgrade_database,
)
from app.models import load_models

TABLES = {
    "alembic_version",
    "api_key",
    "audit_event",
    "backup_event",
    "budget_balance",
    "dataset",
    "dataset_column",
    "dataset_data",
    "dataset_group_data",
    "dataset_unit",
    "ledger_entry",
    "release",
}


def test_upgrade_downgrade_upgrade_and_models_match(make_schema: Callable[[], str]) -> None:
    url = make_schema()
    engine = create_engine(url)
    try:
        upgrade_database(url)
        assert set(inspect(engine).get_table_names()) == TABLES
        assert current_revisions(engine) == head_revisions()
        downgrade_database(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        assert current_revisions(engine) == set()
        upgrade_database(url)
        assert set(inspect(engine).get_table_names()) == TABLES
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), load_models())
        assert diff == []
    finally:
        engine.dispose()


def test_migration_files_are_static_and_dated() -> None:
    from app.core.db import migrations_dir

    files = sorted((migrations_dir() / "versions").glob("*.py"))
    assert files
    for f in files:
        assert f.name[:8].isdigit(), f.name  # YYYYMMDD_ prefix
        source = f.read_text()
        assert "def downgrade()" in source and "def upgrade()" in source
        assert "metadata.create_all" not in source


def test_readyz_reports_an_unmigrated_database(make_schema: Callable[[], str]) -> None:
    from fastapi.testclient import TestClient

    from app.api.factory import create_app

    from .conftest import make_settings

    url = make_schema()  # empty: never migrated
    settings = make_settings(url, bootstrap_admin_key=None)
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["type"] == "not_ready"
        upgrade_database(url)
        assert client.get("/readyz").json() == {
            "status": "ready",
            "database": "ok",
            "migrations": "current",
        }
