"""Fair, bounded queues (issue 28): caps on the releases a key and a dataset may have
waiting, and claims that serve every key and dataset in turn."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app.api.factory import create_app
from app.core.db import upgrade_database
from app.core.pg import Link
from app.runtime.worker import process_batch
from tests.support import ApiBase, app_settings

from .conftest import ADMIN, ADMIN_KEY, SAMPLE


class Queue:
    """An app without workers (releases wait until the test runs them) and its schema."""

    def __init__(self, url: str, client: TestClient, link: Link, settings: Any) -> None:
        self.url, self.client, self.link, self.settings = url, client, link, settings
        self.api = ApiBase(client, ADMIN, "queue")

    def submit(self, ds: str, headers: dict[str, str]) -> Any:
        return self.client.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"},
            headers=headers | {"Prefer": "respond-async"},
        )

    def status(self, rid: str) -> str:
        r = self.client.get(f"/v1/releases/{rid}", headers=ADMIN)
        return str(r.json()["status"])

    def drain(self) -> None:
        while process_batch(self.link, self.settings, limit=1):
            pass


@pytest.fixture
def queue(make_schema: Callable[[], str]) -> Iterator[Queue]:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(
        url, admin_key=ADMIN_KEY, max_pending_per_key=3, max_pending_per_dataset=5
    )
    link = Link(url, settings)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield Queue(url, client, link, settings)
    link.close()


def test_pending_caps_answer_429_and_charge_nothing(queue: Queue) -> None:
    """A key may have 3 releases waiting and a dataset 5 (this app's settings): the next one
    is 429 too_many_pending, reserves and debits nothing; once one has run, there is room."""
    ds = queue.api.dataset(values=SAMPLE, epsilon="10")["id"]
    other = queue.api.dataset(values=SAMPLE, epsilon="10")["id"]
    _, a = queue.api.new_key("analyst")
    _, b = queue.api.new_key("analyst")
    assert [queue.submit(ds, a).status_code for _ in range(3)] == [202] * 3
    refused = queue.submit(ds, a)
    assert refused.status_code == 429, refused.text
    assert refused.json()["type"] == "too_many_pending"
    assert "DPQUANT_MAX_PENDING_PER_KEY" in refused.json()["detail"]
    assert refused.headers["retry-after"] == "1"
    assert queue.submit(other, a).status_code == 429  # the key's cap, on any dataset
    assert [queue.submit(ds, b).status_code for _ in range(2)] == [202] * 2
    full = queue.submit(ds, b)  # the dataset holds 5
    assert full.status_code == 429 and "PER_DATASET" in full.json()["detail"]
    budget = queue.client.get(f"/v1/datasets/{ds}/budget", headers=ADMIN).json()
    assert budget["spent"]["epsilon"] == "0.05"  # five releases, not eight
    engine = create_engine(queue.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM release")).scalar_one()
    finally:
        engine.dispose()
    assert rows == 5
    # one run (B's oldest: B has fewer waiting) makes room in the dataset and for B
    assert process_batch(queue.link, queue.settings, limit=1) == 1
    assert queue.submit(ds, b).status_code == 202
    assert queue.submit(ds, a).status_code == 429  # A still holds its 3
    queue.drain()


def test_a_backlog_waits_behind_another_keys_release(queue: Queue) -> None:
    """Issue 28: one global FIFO let six queued runs of one key hold a victim's release.
    Key A queues 3 releases on one dataset, then key B one on another; the next claim runs
    B's (fewer waiting), then A's in their order. With a run of A's in flight, B's release
    is the next claim even when it is newer than all of A's."""
    ds_a = queue.api.dataset(values=SAMPLE, epsilon="10")["id"]
    ds_b = queue.api.dataset(values=SAMPLE, epsilon="10")["id"]
    _, a = queue.api.new_key("analyst")
    _, b = queue.api.new_key("analyst")
    backlog = [queue.submit(ds_a, a).json()["id"] for _ in range(3)]
    victim = queue.submit(ds_b, b).json()["id"]
    assert process_batch(queue.link, queue.settings, limit=1) == 1
    assert queue.status(victim) == "done"
    assert [queue.status(r) for r in backlog] == ["pending"] * 3
    queue.drain()
    assert [queue.status(r) for r in backlog] == ["done"] * 3

    # In flight: a batch of two claimed while A has one run leased elsewhere.
    from app.releases.runner import claim_batch

    first = queue.submit(ds_a, a).json()["id"]
    later = [queue.submit(ds_a, a).json()["id"] for _ in range(2)]
    newer = queue.submit(ds_b, b).json()["id"]

    # one worker takes A's oldest (A and B both have turn 1; B has fewer waiting: B first)
    taken, _ = queue.link.run(
        lambda c: claim_batch(c, lease_s=600, max_runs=3, token=uuid.uuid4(), limit=2)
    )
    assert [str(c.release_id) for c in taken] == [newer, first]
    assert all(queue.status(r) == "pending" for r in later)
    # both have a run in flight; B's next (2 in the queue) goes before A's (3), whatever
    # their age, then A's in order
    newer2 = queue.submit(ds_b, b).json()["id"]
    taken, _ = queue.link.run(
        lambda c: claim_batch(c, lease_s=600, max_runs=3, token=uuid.uuid4(), limit=5)
    )
    assert [str(c.release_id) for c in taken] == [newer2, *later]


def test_the_caps_are_settings(make_schema: Callable[[], str]) -> None:
    """0 turns a cap off; the defaults allow 64 per key and 256 per dataset."""
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY)
    assert (settings.max_pending_per_key, settings.max_pending_per_dataset) == (64, 256)
    off = app_settings(url, admin_key=ADMIN_KEY, max_pending_per_key=0)
    with TestClient(create_app(off), raise_server_exceptions=False) as client:
        q = Queue(url, client, Link(url, off), off)
        ds = q.api.dataset(values=SAMPLE, epsilon="10")["id"]
        _, a = q.api.new_key("analyst")
        assert all(q.submit(ds, a).status_code == 202 for _ in range(70))
        q.link.close()


def test_a_small_release_is_not_held_behind_a_run_that_times_out(
    make_schema: Callable[[], str],
) -> None:
    """Issue 28, batch coupling: a worker once claimed several releases together, so a 5 ms
    release co-claimed behind a run that hit the time limit answered after that limit and ran
    twice. Now a worker claims one release at a time: with two real workers, a run that is
    killed at its 2 s limit holds one of them, and another key's small release on another
    dataset, asked right after, answers in well under a second with one attempt."""
    import time

    from tests.support import release_workers

    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY, publish_scale=1.0)  # as served
    with (
        release_workers(url, concurrency=2, run_timeout_s=2, publish_scale=1),
        TestClient(create_app(settings), raise_server_exceptions=False) as client,
    ):
        api = ApiBase(client, ADMIN, "coupling")
        # JointExp with m = 999 quantiles on ~700 distinct values (20,000 values rounded to
        # 0.1) keeps up to m repeat levels a row: ~17 s, far past the 2 s limit
        rng = np.random.default_rng(1)
        slow_values = np.clip(np.round(rng.normal(50.0, 10.0, 20_000), 1), 0.0, 100.0)
        slow_ds = api.dataset(values=[float(v) for v in slow_values], epsilon="10")["id"]
        fast_ds = api.dataset(values=SAMPLE, epsilon="10")["id"]
        slow_key = api.new_key("analyst", slow_ds)[1]
        fast_key = api.new_key("analyst", fast_ds)[1]
        # the workers' kernels are warm (their first run compiles nothing from here on)
        warm = client.post(
            f"/v1/datasets/{fast_ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"},
            headers=fast_key,
        )
        assert warm.status_code == 201, warm.text
        slow = client.post(
            f"/v1/datasets/{slow_ds}/quantiles",
            json={
                "quantiles": [(j + 1) / 1000 for j in range(999)],
                "epsilon": "1",
                "method": "jointexp",
            },
            headers=slow_key | {"Prefer": "respond-async"},
        )
        assert slow.status_code == 202, slow.text
        time.sleep(0.3)  # the slow run has started on one worker
        t0 = time.monotonic()
        fast = client.post(
            f"/v1/datasets/{fast_ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.01", "method": "indexp"},
            headers=fast_key,
        )
        took = time.monotonic() - t0
        assert fast.status_code == 201 and fast.json()["status"] == "done", fast.text
        assert took < 1.0, took
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                attempts = conn.execute(
                    text("SELECT attempts FROM release WHERE id = :i"), {"i": fast.json()["id"]}
                ).scalar_one()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    row = conn.execute(
                        text("SELECT status, failure FROM release WHERE id = :i"),
                        {"i": slow.json()["id"]},
                    ).one()
                    if row[0] != "pending":
                        break
                    conn.commit()
                    time.sleep(0.2)
        finally:
            engine.dispose()
        assert attempts == 1
        assert tuple(row) == ("failed", "timeout")  # the slow run did hit its limit
