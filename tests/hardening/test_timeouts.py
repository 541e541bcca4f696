"""Issue 5, point 3 (bounded waits): a request never hangs on the database past a configured
timeout, even when PostgreSQL is up but a lock is held forever.

A raw connection holds the dataset row lock (as a stuck writer would); a grant and a release,
which must take that lock, answer 503 ``database_unavailable`` after about
``DPQUANT_STATEMENT_TIMEOUT_MS`` instead of waiting, and leave nothing behind. Once the lock
is released the same requests succeed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from app.core.config import Settings

from .conftest import ADMIN, Api, ledger_state, report


def test_statement_timeout_is_configurable(monkeypatch: Any) -> None:
    monkeypatch.setenv("DPQUANT_STATEMENT_TIMEOUT_MS", "1234")
    assert Settings().statement_timeout_ms == 1234
    monkeypatch.delenv("DPQUANT_STATEMENT_TIMEOUT_MS")
    assert Settings().statement_timeout_ms > 0  # on by default


def test_a_held_lock_gives_503_within_the_statement_timeout(
    make_app: Callable[..., Any], hdb: Engine
) -> None:
    timeout_ms = 500
    with make_app(statement_timeout_ms=timeout_ms) as client:
        api = Api(client)
        ds = api.dataset(values=[float(v) for v in range(50)], epsilon="1")
        before = ledger_state(hdb, ds["id"])
        timings: dict[str, float] = {}
        with hdb.connect() as holder:
            holder.execute(text("SELECT 1 FROM dataset WHERE id = :d FOR UPDATE"), {"d": ds["id"]})
            for label, call in (
                (
                    "grant",
                    lambda: client.post(
                        f"/v1/datasets/{ds['id']}/grants",
                        json={"epsilon": "1", "reason": "blocked"},
                        headers=ADMIN,
                    ),
                ),
                ("release", lambda: api.query(ds["id"], epsilon="0.1")),
            ):
                t0 = time.perf_counter()
                r = call()
                timings[label] = time.perf_counter() - t0
                assert r.status_code == 503, (label, r.text)
                assert r.json()["type"] == "database_unavailable"
                assert r.headers["retry-after"] == "1"
                assert timings[label] < timeout_ms / 1000 + 2.0, timings
            holder.rollback()
        assert ledger_state(hdb, ds["id"]) == before
        assert api.query(ds["id"], epsilon="0.1").status_code == 201
    report(
        "3 lock wait bounded",
        statement_timeout_ms=timeout_ms,
        grant_s=f"{timings['grant']:.2f}",
        release_s=f"{timings['release']:.2f}",
    )
