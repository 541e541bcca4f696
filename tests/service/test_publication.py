"""Publication times (issue 28): what a non-admin sees of a release follows a public bound.

A release is published at its run's start plus a run-time bound computed from public figures
only (:mod:`app.releases.schedule`). Non-admin readers see it pending until then and its
publication time as ``finished_at``; a synchronous POST holds its answer until then; the
worker holds its slot until then. Admins see the stored row.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.api.factory import create_app
from app.core.config import Settings
from app.core.db import upgrade_database
from app.core.pg import Link
from app.releases import schedule
from app.releases.service import ReleaseRecord, published_view
from app.runtime.worker import process_one, warm_up
from tests.support import ApiBase, app_settings, auth

ADMIN_KEY = "publication-admin-" + "k" * 24
ADMIN = auth(ADMIN_KEY)
SAMPLE = [float(x) for x in range(1, 41)]


# -- the bound: public figures only ----------------------------------------------------------


def test_the_cells_bound_uses_public_figures_only() -> None:
    common = {"grid_points": 2_000_001, "max_cells": 10**7}
    # add/remove: n is private; only the grid, the limit and a declared hint count
    assert schedule.cells_bound(neighbors="add_remove", n=None, size_hint=None, **common) == (
        2_000_001
    )
    assert schedule.cells_bound(neighbors="add_remove", n=None, size_hint=500, **common) == 500
    # swap: n is public and bounds the distinct cells
    assert schedule.cells_bound(neighbors="swap", n=40, size_hint=None, **common) == 40
    # a private n passed by mistake under add/remove is ignored
    assert schedule.cells_bound(neighbors="add_remove", n=40, size_hint=None, **common) == (
        2_000_001
    )
    assert (
        schedule.cells_bound(
            grid_points=10**9, max_cells=10**7, neighbors="add_remove", n=None, size_hint=None
        )
        == 10**7
    )


def test_the_run_bound_grows_with_the_work_and_is_capped() -> None:
    small = schedule.run_bound_s(m=9, cells=1_000, scale=1.0, cap_s=120.0)
    assert small >= schedule.FLOOR_S
    assert schedule.run_bound_s(m=99, cells=1_000, scale=1.0, cap_s=120.0) > small
    assert schedule.run_bound_s(m=9, cells=10**6, scale=1.0, cap_s=120.0) > small
    assert schedule.run_bound_s(m=9, cells=1_000, scale=3.0, cap_s=120.0) == pytest.approx(
        3 * small
    )
    assert schedule.run_bound_s(m=1000, cells=10**7, scale=1.0, cap_s=120.0) == 120.0
    assert schedule.run_bound_s(m=9, cells=1_000, scale=0.0, cap_s=120.0) == 0.0


def test_aqs_bound_counts_the_levels_of_its_recursion_not_its_quantiles() -> None:
    """AQ weighs every cell once per level (floor(log2 m) + 1 of them), IndExp once per
    quantile: at m = 999 on 10^6 cells AQ's bound stays within a few times its m = 1 bound
    (measured runs: 0.05 s at n = 4.6e5, m = 980), IndExp's grows ~m-fold."""

    def bound(method: str, m: int) -> float:
        return schedule.run_bound_s(
            m=m, cells=10**6, scale=1.0, cap_s=math.inf, method=method, epsilon=1.0
        )

    assert schedule.passes("aq", 999) == 10
    assert schedule.passes("aq", 1) == 1
    assert schedule.passes("indexp", 999) == 999
    assert bound("aq", 1) == pytest.approx(bound("indexp", 1))
    assert bound("aq", 999) < 4 * bound("aq", 1)
    assert bound("indexp", 999) > 50 * bound("indexp", 1)
    assert bound("aq", 999) < bound("aq", 1023) < bound("aq", 1024)


def test_the_bound_of_a_claim_reads_public_figures_only() -> None:
    """Under add/remove the stored n is never used (the claim does not even read it): the
    size hint, else the service's value limit, stands for it; under swap n is public."""
    row: dict[str, Any] = {
        "lower": 0.0,
        "upper": 100.0,
        "granularity": 1.0,
        "neighbors": "add_remove",
        "public_n": None,
        "size_hint": None,
        "method": "jointexp",
        "quantiles": [0.1 * j for j in range(1, 10)],
        "epsilon": 0.001,
    }
    limits = {"scale": 1.0, "max_cells": 10**7, "cap_s": 120.0}
    no_hint = schedule.bound_of_claim(row, max_values=10**9, **limits)
    # the value limit bounds the decay tables' reach: a smaller limit, a smaller bound
    assert schedule.bound_of_claim(row, max_values=10**3, **limits) < no_hint
    hinted = schedule.bound_of_claim(row | {"size_hint": 1000}, max_values=10**9, **limits)
    assert hinted < no_hint
    # a private n that leaked into the row under add/remove changes nothing
    assert schedule.bound_of_claim(row | {"public_n": 10}, max_values=10**9, **limits) == no_hint
    swap = row | {"neighbors": "swap", "public_n": 1000}
    assert schedule.bound_of_claim(swap, max_values=10**9, **limits) == pytest.approx(hinted)
    # the smoothed variant runs JointExp on the refined grid: a larger bound
    smooth = schedule.bound_of_claim(
        row | {"method": "jointexp_smooth"}, max_values=10**9, **limits
    )
    assert smooth > no_hint
    assert schedule.bound_of_claim(row, max_values=10**9, **(limits | {"scale": 0.0})) == 0.0


def _record(**kw: Any) -> ReleaseRecord:
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "seq": 1,
        "dataset_id": uuid.uuid4(),
        "method": "jointexp",
        "quantiles": [0.5],
        "estimates": [1.0],
        "epsilon": Decimal("1"),
        "delta": None,
        "cost_epsilon": Decimal("1"),
        "cost_delta": Decimal("0"),
        "remaining_epsilon": Decimal("0"),
        "remaining_delta": Decimal("0"),
        "created_at": now - timedelta(seconds=2),
        "status": "done",
        "failure": None,
        "finished_at": now - timedelta(seconds=1),
        "expected_error": None,
        "warnings": [],
        "published_at": now + timedelta(seconds=1),
    }
    values.update(kw)
    return ReleaseRecord(**values)


def test_a_non_admin_sees_a_release_only_from_its_publication_time() -> None:
    rec = _record()
    assert rec.published_at is not None
    before = published_view(rec, admin=False, now=rec.published_at - timedelta(microseconds=1))
    assert before.status == "pending" and before.estimates is None
    assert before.finished_at is None and before.failure is None
    after = published_view(rec, admin=False, now=rec.published_at)
    assert after.status == "done" and after.estimates == [1.0]
    assert after.finished_at == rec.published_at  # never the run's finish time
    admin = published_view(rec, admin=True, now=rec.published_at - timedelta(seconds=5))
    assert admin == rec  # admins see the stored row
    failed = _record(status="failed", failure="mechanism_error", estimates=None)
    assert published_view(failed, admin=False, now=datetime.now(UTC)).failure is None
    # rows finished before publication times existed are published at their finish
    old = _record(published_at=None)
    assert published_view(old, admin=False, now=datetime.now(UTC)).finished_at == old.finished_at


# -- through the service ---------------------------------------------------------------------


@dataclass
class Served:
    client: TestClient
    api: ApiBase
    link: Link
    settings: Settings
    url: str

    def run_one(self) -> bool:
        return process_one(self.link, self.settings)

    def row(self, release_id: str) -> dict[str, Any]:
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                row = conn.execute(
                    text(
                        "SELECT run_started_at, finished_at, published_at FROM release"
                        " WHERE id = :i"
                    ),
                    {"i": release_id},
                ).one()
        finally:
            engine.dispose()
        return {"run_started_at": row[0], "finished_at": row[1], "published_at": row[2]}


#: A publication scale that makes the bound of a small release ~1 s (the floor times 100).
SCALE = 100.0


@pytest.fixture
def served(make_schema: Callable[[], str]) -> Iterator[Served]:
    url = make_schema()
    upgrade_database(url)
    warm_up()  # compiled kernels, as a worker has them before its first claim
    settings = app_settings(url, admin_key=ADMIN_KEY, sync_wait_s=5.0, publish_scale=SCALE)
    link = Link(url, settings)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield Served(client, ApiBase(client, ADMIN, "publication"), link, settings, url)
    link.close()


def _iso(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_readers_see_the_release_at_its_publication_time_and_admins_at_its_finish(
    served: Served,
) -> None:
    ds = served.api.dataset(values=SAMPLE, epsilon="5", neighbors="add_remove", size_hint=40)["id"]
    analyst = served.api.new_key("analyst", ds)[1]
    viewer = served.api.new_key("viewer", ds)[1]
    body = {"quantiles": [0.25, 0.5, 0.75], "epsilon": "1", "method": "jointexp"}
    r = served.client.post(
        f"/v1/datasets/{ds}/quantiles",
        json=body,
        headers=analyst | {"Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    t0 = time.monotonic()
    assert served.run_one()
    held = time.monotonic() - t0
    row = served.row(rid)
    bound = (row["published_at"] - row["run_started_at"]).total_seconds()
    # the bound is the public one (add/remove, the declared size hint of 40 cells, m = 3)
    assert bound >= schedule.FLOOR_S * SCALE - 0.01
    assert row["finished_at"] < row["published_at"]
    assert held >= bound - 0.05  # the worker held its slot until the publication time
    # by now it is published: everyone sees it done
    for headers in (analyst, viewer):
        seen = served.client.get(f"/v1/releases/{rid}", headers=headers).json()
        assert seen["status"] == "done"
        assert _iso(seen["finished_at"]) == row["published_at"]
    admin_view = served.client.get(f"/v1/releases/{rid}", headers=ADMIN).json()
    assert _iso(admin_view["finished_at"]) == row["finished_at"]


def test_before_publication_a_finished_release_reads_as_pending_to_non_admins(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = served.api.dataset(values=SAMPLE, epsilon="5", neighbors="add_remove", size_hint=40)["id"]
    analyst = served.api.new_key("analyst", ds)[1]
    viewer = served.api.new_key("viewer", ds)[1]
    body = {"quantiles": [0.5], "epsilon": "1", "method": "jointexp"}
    rid = served.client.post(
        f"/v1/datasets/{ds}/quantiles", json=body, headers=analyst | {"Prefer": "respond-async"}
    ).json()["id"]
    # the worker stores the result but does not hold (so the test can look in between)
    monkeypatch.setattr("app.runtime.worker._hold", lambda *args, **kwargs: None)
    assert served.run_one()
    row = served.row(rid)
    assert row["published_at"] > datetime.now(UTC)
    for headers in (analyst, viewer):
        seen = served.client.get(f"/v1/releases/{rid}", headers=headers)
        assert seen.json()["status"] == "pending" and seen.json()["estimates"] is None
        assert seen.json()["finished_at"] is None
        listed = served.client.get(f"/v1/datasets/{ds}/releases", headers=headers).json()
        assert listed["items"][0]["status"] == "pending"
    assert served.client.get(f"/v1/releases/{rid}", headers=ADMIN).json()["status"] == "done"
    # a replay of the same request now waits (Prefer: wait=0.1 is shorter than the bound)
    left = (row["published_at"] - datetime.now(UTC)).total_seconds()
    assert left > 0.3
    time.sleep(left + 0.05)
    seen = served.client.get(f"/v1/releases/{rid}", headers=viewer).json()
    assert seen["status"] == "done" and _iso(seen["finished_at"]) == row["published_at"]


def test_a_synchronous_post_answers_at_the_publication_time_or_202_before_it(
    served: Served,
) -> None:
    import threading

    ds = served.api.dataset(values=SAMPLE, epsilon="5", neighbors="add_remove", size_hint=40)["id"]
    analyst = served.api.new_key("analyst", ds)[1]
    body = {"quantiles": [0.5], "epsilon": "1", "method": "jointexp"}
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            if not served.run_one():
                time.sleep(0.02)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        t0 = time.monotonic()
        sync = served.client.post(f"/v1/datasets/{ds}/quantiles", json=body, headers=analyst)
        took = time.monotonic() - t0
        assert sync.status_code == 201, sync.text
        row = served.row(sync.json()["id"])
        bound = (row["published_at"] - row["run_started_at"]).total_seconds()
        assert took >= bound - 0.05  # held until published, though the run took ~ms
        assert _iso(sync.json()["finished_at"]) == row["published_at"]
        t1 = time.monotonic()
        short = served.client.post(
            f"/v1/datasets/{ds}/quantiles",
            json=body | {"epsilon": "0.5"},
            headers=analyst | {"Prefer": "wait=0.2"},
        )
        took_short = time.monotonic() - t1
        assert short.status_code == 202 and short.json()["status"] == "pending"
        # the run ended within milliseconds, yet the 202 comes when the wait ends, as for a
        # run still going (answering at once told that the run had finished)
        assert took_short >= 0.2, took_short
        row = served.row(short.json()["id"])
        assert row["finished_at"] is not None
        assert (row["finished_at"] - row["run_started_at"]).total_seconds() < 0.2
    finally:
        stop.set()
        worker.join(timeout=10)
