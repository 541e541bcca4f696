"""Issue 8: the ledger holds whatever ``default_transaction_isolation`` the database sets.

For each of READ COMMITTED, REPEATABLE READ and SERIALIZABLE, a fresh database in a
throwaway cluster gets ``ALTER DATABASE ... SET default_transaction_isolation``; a real
``dpquant serve --workers 2`` (two web processes, plus its release workers) serves it. One
release of 0.1, then 30 concurrent queries of 0.1 on the 0.9 left, every other one grouped by a
categorical column (one debit each, whatever its keys): exactly 9 succeed, 21 are refused
with 409, no 5xx, and the ledger, the balance row and the releases agree exactly. The same
for a zCDP table whose rho pays for exactly those ten releases.
(Before issue 8, REPEATABLE READ spent 3.1 of 1.0 and SERIALIZABLE answered 503s.)
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest
from sqlalchemy import create_engine, text

from .conftest import report
from .procs import DpquantServer, ThrowawayPostgres, migrate

pytestmark = [pytest.mark.processes, pytest.mark.own_cluster]

ADMIN_KEY = "dpq_iso-admin-" + secrets.token_urlsafe(32)
LEVELS = ["read committed", "repeatable read", "serializable"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres()
    try:
        yield pg
    finally:
        pg.destroy()


def _database_with_default(cluster: ThrowawayPostgres, level: str) -> str:
    name = "iso_" + uuid.uuid4().hex[:8]
    admin = create_engine(cluster.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(
            text(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{level}'")
        )
    admin.dispose()
    url = cluster.url.rsplit("/", 1)[0] + "/" + name
    check = create_engine(url)
    with check.connect() as conn:
        assert conn.execute(text("SHOW default_transaction_isolation")).scalar_one() == level
    check.dispose()
    migrate(url)
    return url


async def _burst(base: str, ds: str, headers: dict[str, str], n: int) -> Counter[int]:
    """``n`` concurrent queries of 0.1, every other one grouped by region (one debit each)."""
    query = {"quantiles": [0.25, 0.5, 0.75], "epsilon": "0.1", "method": "indexp"}
    grouped = {**query, "group_by": "region", "keys": ["a", "b", "c"]}
    async with httpx.AsyncClient(base_url=base, timeout=120.0) as c:
        rs = await asyncio.gather(
            *(
                c.post(
                    f"/v1/datasets/{ds}/quantiles",
                    json=grouped if i % 2 else query,
                    headers=headers,
                )
                for i in range(n)
            )
        )
    return Counter(r.status_code for r in rs)


def _zcdp_rho() -> Decimal:
    """A zCDP budget of exactly ten of the releases below: the first (IndExp, m = 1) and
    nine of the burst's (m = 3), at epsilon 0.1 (rho = epsilon^2 / (8 m))."""
    from fractions import Fraction

    from app.releases.planning import _ceil

    one = _ceil(Fraction(1, 100) / 8)
    three = _ceil(Fraction(1, 100) / 24)
    return one + 9 * three


@pytest.mark.parametrize("accounting", ["pure", "zcdp"])
@pytest.mark.parametrize("level", LEVELS)
def test_exactly_the_affordable_releases_succeed_at_every_isolation_level(
    cluster: ThrowawayPostgres, level: str, accounting: str
) -> None:
    url = _database_with_default(cluster, level)
    budget = (
        {"epsilon": "1.0"}
        if accounting == "pure"
        else {"accounting": "zcdp", "delta": "0.000001", "rho": str(_zcdp_rho())}
    )
    server = DpquantServer(url, ADMIN_KEY, workers=2)
    server.start()
    try:
        admin = server.headers()
        with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
            columns = [{"name": "value", "type": "numeric", "lower": 0, "upper": 100},
                       {"name": "region", "type": "categorical", "keys": ["a", "b"]}]  # fmt: skip
            ds = c.post(
                "/v1/datasets",
                json={"name": "iso-" + uuid.uuid4().hex[:8], "columns": columns, **budget},
                headers=admin,
            ).json()["id"]  # fmt: skip
            rows = "value,region\n" + "".join(f"{v},{'ab'[v % 2]}\n" for v in range(100))
            uploaded = c.put(f"/v1/datasets/{ds}/values", content=rows.encode(),
                             headers={**admin, "content-type": "text/csv"})  # fmt: skip
            assert uploaded.status_code == 200, uploaded.text
            key = c.post("/v1/keys", json={"role": "analyst", "dataset_id": ds}, headers=admin)
            analyst = {"Authorization": f"Bearer {key.json()['key']}"}
            first = c.post(
                f"/v1/datasets/{ds}/quantiles",
                json={"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"},
                headers=analyst,
            )
            assert first.status_code == 201, first.text
        statuses = asyncio.run(_burst(server.base_url, ds, analyst, 30))
        engine = create_engine(url)
        with engine.connect() as conn:
            column = "epsilon" if accounting == "pure" else "rho"
            ledger = conn.execute(
                text(
                    f"SELECT coalesce(sum({column}) FILTER (WHERE kind = 'debit'), 0),"
                    " count(*) FILTER (WHERE kind = 'debit') FROM ledger_entry"
                    " WHERE dataset_id = :d"
                ),
                {"d": ds},
            ).one()
            balance = conn.execute(
                text(
                    f"SELECT spent_{column}, granted_{column} FROM budget_balance"
                    " WHERE dataset_id = :d"
                ),
                {"d": ds},
            ).one()
            releases = conn.execute(
                text("SELECT status, count(*), sum(attempts) FROM release WHERE dataset_id = :d "
                     "GROUP BY status"),
                {"d": ds},
            ).all()  # fmt: skip
        engine.dispose()
        report(
            f"isolation {level} ({accounting})",
            statuses=dict(statuses),
            spent=ledger[0],
            debits=ledger[1],
            balance_spent=balance[0],
        )
        assert statuses == Counter({201: 9, 409: 21}), statuses
        total = Decimal("1.0") if accounting == "pure" else _zcdp_rho()
        assert Decimal(ledger[0]) == Decimal(balance[0]) == Decimal(balance[1]) == total
        assert ledger[1] == 10
        assert [(s, n, runs) for s, n, runs in releases] == [("done", 10, 10)]
    finally:
        server.close()
