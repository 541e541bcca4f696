"""Rules written twice, once in Python and once in SQL, agree; the reservation function the
migrations install is the canonical ``app/releases/sql/release_reserve.sql``.

The reservation runs as one PL/pgSQL statement (``release_reserve()``) so that the balance
check, the key cap and the debit happen under the dataset's row lock. Two of its rules also
exist in Python, where the planner and the quote use them before anything is locked: the
dataset's public size (n under swap, else the admin's size hint) and the key cap (spent plus
cost within the cap). Each pair is compared here on every combination that matters, by
calling the migrated function itself.
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from importlib import resources
from itertools import product
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from app.auth.models import ApiKey
from app.core.amounts import Amount
from app.core.db import migrations_dir, upgrade_database
from app.datasets.models import Dataset
from app.releases import planning

CANONICAL = resources.files("app.releases").joinpath("sql/release_reserve.sql").read_text()


def _body(sql: str) -> str:
    """The function body between the ``$$`` quotes."""
    found = re.search(r"\$\$(.*)\$\$", sql, flags=re.S)
    assert found is not None, "no $$-quoted body"
    return found.group(1)


def _argument_names(sql: str) -> list[str]:
    head = sql[sql.index("release_reserve(") : sql.index("LANGUAGE plpgsql")]
    return re.findall(r"^\s+(?:OUT\s+)?(\w+)\s+\w", head, flags=re.M)


def _migration(name: str) -> ModuleType:
    path = migrations_dir() / "versions" / name
    spec = importlib.util.spec_from_file_location(f"dpquant_rules_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_canonical_file_is_what_the_last_reserve_migration_installs() -> None:
    installed = _migration("20261205_0020_grouped_releases.py")._functions()[1]
    statement = "\n".join(
        line for line in CANONICAL.splitlines() if not line.startswith("-- ")
    ).strip()
    assert statement == installed.strip()


@pytest.fixture(scope="module")
def conn(schema_factory: Callable[[], str]) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    url = schema_factory()
    upgrade_database(url)
    plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain, autocommit=True, row_factory=dict_row) as c:
        yield c


def test_the_migrated_function_is_the_canonical_file(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    row = conn.execute(
        "SELECT p.prosrc, p.proargnames FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE p.proname = 'release_reserve' AND n.nspname = current_schema()"
    ).fetchone()
    assert row is not None
    assert row["prosrc"] == _body(CANONICAL)
    assert list(row["proargnames"]) == _argument_names(CANONICAL)
    assert len(row["proargnames"]) == 39  # 25 in, 14 out


def _dataset(
    conn: psycopg.Connection[dict[str, Any]],
    *,
    neighbors: str,
    n: int | None,
    size_hint: int | None,
    uploaded: bool = True,
    grant: Decimal = Decimal(0),
) -> uuid.UUID:
    ds = uuid.uuid4()
    conn.execute(
        "INSERT INTO dataset (id, name, description, lower, upper, neighbors, granularity, n,"
        " data_version, created_at, values_uploaded_at, size_hint)"
        " VALUES (%s, %s, '', 0, 1, %s, 0.001, %s, 1, now(),"
        " CASE WHEN %s THEN now() END, %s)",
        (ds, f"rules-{ds}", neighbors, n, uploaded, size_hint),
    )
    if grant > 0:
        conn.execute(
            "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, reason, created_at)"
            " VALUES (%s, 'grant', %s, 1, 'rules', now())",
            (ds, grant),
        )
    return ds


def _key(
    conn: psycopg.Connection[dict[str, Any]],
    *,
    max_epsilon: Decimal | None = None,
    max_delta: Decimal | None = None,
    spent_epsilon: Decimal = Decimal(0),
    spent_delta: Decimal = Decimal(0),
) -> uuid.UUID:
    key = uuid.uuid4()
    conn.execute(
        "INSERT INTO api_key (id, prefix, key_hash, role, name, created_at, max_epsilon,"
        " max_delta, spent_epsilon, spent_delta)"
        " VALUES (%s, 'dpq_rule', %s, 'analyst', 'rules', now(), %s, %s, %s, %s)",
        (key, uuid.uuid4().hex, max_epsilon, max_delta, spent_epsilon, spent_delta),
    )
    return key


SMALL = Amount(Decimal("0.1"), Decimal(0))


def _reserve(
    conn: psycopg.Connection[dict[str, Any]],
    ds: uuid.UUID,
    key: uuid.UUID,
    *,
    neighbors: str,
    public_size: int | None,
    cost: Amount = SMALL,
) -> str:
    """The function's outcome; the transaction is rolled back, so nothing is kept."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "SELECT outcome FROM release_reserve(%s, %s, %s, 'indexp', %s, %s, %s, %s, %s,"
            " NULL, 'h', NULL, NULL, %s, %s, 0, 0, 0)",
            (
                uuid.uuid4(),
                ds,
                key,
                [0.5],
                cost.epsilon,
                cost.delta,
                cost.epsilon,
                cost.delta,
                neighbors,
                public_size,
            ),
        ).fetchone()
    assert row is not None
    return str(row["outcome"])


SIZES = [None, 1, 7, 10**12]


@pytest.mark.parametrize(
    ("neighbors", "n", "size_hint"), list(product(["swap", "add_remove"], SIZES, SIZES))
)
def test_the_public_size_is_the_same_rule_in_python_and_sql(
    conn: psycopg.Connection[dict[str, Any]],
    neighbors: str,
    n: int | None,
    size_hint: int | None,
) -> None:
    """Python's figures make the function proceed; any other size makes it ask for a replan."""
    ds = _dataset(conn, neighbors=neighbors, n=n, size_hint=size_hint, uploaded=False)
    key = _key(conn)
    row = Dataset(neighbors=neighbors, n=n, size_hint=size_hint)
    figures = planning.PublicFigures.of(row)
    assert _reserve(conn, ds, key, neighbors=figures.neighbors, public_size=figures.size) == (
        "no_values"  # past the figures' check: the next one refuses (no values uploaded)
    )
    for other in {None, 1, 2, 7, 10**12} - {figures.size}:
        assert _reserve(conn, ds, key, neighbors=figures.neighbors, public_size=other) == ("replan")
    flipped = "add_remove" if neighbors == "swap" else "swap"
    assert _reserve(conn, ds, key, neighbors=flipped, public_size=figures.size) == "replan"


CAPS = [None, Decimal("0.5"), Decimal("1.0000000000000000000000000000000000001")]
SPENT = [Decimal(0), Decimal("0.4"), Decimal("0.9000000000000000000000000000000000001")]
COSTS = [Decimal("0.1"), Decimal("0.6")]


@pytest.mark.parametrize(
    ("max_epsilon", "max_delta", "spent", "cost"),
    list(product(CAPS, [None, Decimal("0.2")], SPENT, COSTS)),
)
def test_the_key_cap_is_the_same_rule_in_python_and_sql(
    conn: psycopg.Connection[dict[str, Any]],
    max_epsilon: Decimal | None,
    max_delta: Decimal | None,
    spent: Decimal,
    cost: Decimal,
) -> None:
    """``within_cap`` and the function agree at, just below and just above every cap, with
    figures of up to 37 significant digits (exact decimal arithmetic on both sides)."""
    ds = _dataset(conn, neighbors="swap", n=3, size_hint=None, grant=Decimal(100))
    delta_spent = Decimal("0.15")
    key_id = _key(
        conn,
        max_epsilon=max_epsilon,
        max_delta=max_delta,
        spent_epsilon=min(spent, max_epsilon) if max_epsilon is not None else spent,
        spent_delta=delta_spent,
    )
    stored = conn.execute(
        "SELECT max_epsilon, max_delta, spent_epsilon, spent_delta FROM api_key WHERE id = %s",
        (key_id,),
    ).fetchone()
    assert stored is not None
    key = ApiKey(**stored)
    for amount in (
        Amount(cost, Decimal(0)),
        Amount(cost, Decimal("0.05")),
        Amount(cost, Decimal("0.0500000000000000000000000000000000001")),
    ):
        within = planning.within_cap(key, amount)
        outcome = _reserve(conn, ds, key_id, neighbors="swap", public_size=3, cost=amount)
        assert outcome == ("reserved" if within else "key_budget_exhausted"), (amount, stored)
