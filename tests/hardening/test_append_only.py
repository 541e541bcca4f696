"""Issue 5, point 4: the database itself keeps the ledger append-only.

Raw SQL (not the ORM, not the API) tries to UPDATE, DELETE and TRUNCATE ledger rows and
is refused by the triggers of migration 5e1f0c2a9b7d; INSERT still works. The migration is
reversible: after a downgrade to the previous revision the same UPDATE goes through, and
upgrading again restores the protection.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from app.core.db import downgrade_database, head_revisions, migrations_dir, upgrade_database

from .conftest import Api

REVISION = "5e1f0c2a9b7d"


def _grant_rows(engine: Engine, dataset_id: str) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [
            (int(r[0]), str(r[1]))
            for r in conn.execute(
                text("SELECT id, epsilon FROM ledger_entry WHERE dataset_id = :d ORDER BY id"),
                {"d": dataset_id},
            )
        ]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_entry SET epsilon = 1000 WHERE dataset_id = :d",
        "UPDATE ledger_entry SET reason = 'rewritten' WHERE dataset_id = :d",
        "DELETE FROM ledger_entry WHERE dataset_id = :d",
        "TRUNCATE ledger_entry",
        "TRUNCATE ledger_entry CASCADE",
        "TRUNCATE dataset CASCADE",
    ],
)
def test_raw_sql_cannot_rewrite_the_ledger(hapi: Api, hdb: Engine, statement: str) -> None:
    ds = hapi.dataset(values=[1.0, 2.0, 3.0], epsilon="1.0")
    assert hapi.query(ds["id"], epsilon="0.25").status_code == 201
    before = _grant_rows(hdb, ds["id"])
    assert len(before) == 2  # the initial grant and one debit
    with hdb.connect() as conn, pytest.raises(DBAPIError) as info:
        conn.execute(text(statement), {"d": ds["id"]})
    assert getattr(info.value.orig, "sqlstate", None) == "55000"
    # TRUNCATE ... CASCADE reaches the release table's guard first (migration 0003).
    assert "append-only" in str(info.value.orig) or "never deleted" in str(info.value.orig)
    assert _grant_rows(hdb, ds["id"]) == before
    assert hapi.budget(ds["id"])["spent"]["epsilon"] == "0.25"


def test_inserts_still_work_and_the_triggers_are_installed(hapi: Api, hdb: Engine) -> None:
    ds = hapi.dataset()
    with hdb.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, reason, created_at)"
                " VALUES (:d, 'grant', 0.5, 0, 'raw insert', :t)"
            ),
            {"d": ds["id"], "t": datetime.now(UTC)},
        )
        triggers = {
            str(r[0])
            for r in conn.execute(
                text(
                    "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
                    "AND tgrelid = 'ledger_entry'::regclass"
                )
            )
        }
    assert triggers == {
        "ledger_entry_no_update_delete",
        "ledger_entry_no_truncate",
        "ledger_entry_apply_balance",  # keeps budget_balance equal to the sums (issue 8)
    }
    assert hapi.budget(ds["id"])["granted"]["epsilon"] == "1.5"


def test_the_migration_is_the_single_head_and_reversible(
    new_schema: Callable[[], str],
) -> None:
    assert len(head_revisions()) == 1  # later migrations must chain onto this one
    previous = ScriptDirectory(str(migrations_dir())).get_revision(REVISION).down_revision
    assert isinstance(previous, str)
    url = new_schema()
    engine = create_engine(url)
    update = text("UPDATE ledger_entry SET reason = 'x' WHERE id = 1")
    try:
        upgrade_database(url)
        with engine.begin() as conn:
            ds = uuid.uuid4()
            conn.execute(
                text(
                    "INSERT INTO dataset (id, name, description, lower, upper, neighbors, "
                    "granularity, data_version, created_at) VALUES "
                    "(:id, 'm', '', 0, 1, 'swap', 0.001, 0, now())"
                ),
                {"id": ds},
            )
            conn.execute(
                text(
                    "INSERT INTO ledger_entry (id, dataset_id, kind, epsilon, delta, created_at)"
                    " OVERRIDING SYSTEM VALUE VALUES (1, :d, 'grant', 1, 0, now())"
                ),
                {"d": ds},
            )
        with engine.begin() as conn, pytest.raises(DBAPIError):
            conn.execute(update)
        downgrade_database(url, previous)
        with engine.begin() as conn:
            assert conn.execute(update).rowcount == 1  # protection gone with the downgrade
        upgrade_database(url)
        with engine.begin() as conn, pytest.raises(DBAPIError):
            conn.execute(update)
        downgrade_database(url, "base")
        upgrade_database(url)
    finally:
        engine.dispose()
