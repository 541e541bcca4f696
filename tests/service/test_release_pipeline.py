"""Issue 8: reserve, then sample — the release state machine, the queue and the balance row.

Most tests here run on their own fresh schema with *no* worker attached ("quiet"), so that
each step of a release (reservation, claim, run, completion) can be driven and observed
one at a time, in process, with the real runner functions the workers use.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from app.api.factory import create_app
from app.api.http import encode_cursor
from app.core.config import Settings
from app.core.db import upgrade_database
from app.core.pg import Link
from app.mechanisms import MECHANISMS
from app.runtime.worker import process_one
from tests.support import (
    ApiBase,
    app_settings,
    auth,
    count_statements,
    release_workers,
    wait_for,
)

from .conftest import ADMIN, ADMIN_KEY, SAMPLE


def broken_indexp(boom: Any) -> Any:
    """IndExp with both entry points (raw array and grid) replaced by ``boom``."""
    return dataclasses.replace(MECHANISMS["indexp"], fn=boom, core=boom)


@dataclasses.dataclass
class Quiet:
    """A schema without workers: an app, a raw engine and the runner's connection."""

    url: str
    client: TestClient
    api: ApiBase
    engine: Engine
    link: Link
    settings: Settings

    def run_one(self) -> bool:
        """What one worker iteration does, in this process."""
        return process_one(self.link, self.settings)

    def release_row(self, release_id: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = conn.execute(
                text("SELECT status, attempts, failure FROM release WHERE id = :i"),
                {"i": release_id},
            ).one()
        return {"status": row[0], "attempts": row[1], "failure": row[2]}

    def ledger(self, dataset_id: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            sums = conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE kind = 'debit'),"
                    " coalesce(sum(epsilon) FILTER (WHERE kind = 'debit'), 0),"
                    " coalesce(sum(epsilon) FILTER (WHERE kind = 'grant'), 0)"
                    " FROM ledger_entry WHERE dataset_id = :d"
                ),
                {"d": dataset_id},
            ).one()
            balance = conn.execute(
                text(
                    "SELECT granted_epsilon, spent_epsilon FROM budget_balance "
                    "WHERE dataset_id = :d"
                ),
                {"d": dataset_id},
            ).one()
        return {
            "debits": int(sums[0]),
            "spent": Decimal(sums[1]),
            "granted": Decimal(sums[2]),
            "balance_granted": Decimal(balance[0]),
            "balance_spent": Decimal(balance[1]),
        }


@pytest.fixture(scope="module")
def quiet(make_schema: Callable[[], str]) -> Iterator[Quiet]:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY, sync_wait_s=0.5)
    link = Link(url, settings)
    raw = create_engine(url)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield Quiet(
            url=url,
            client=client,
            api=ApiBase(client, ADMIN, "quiet"),
            engine=raw,
            link=link,
            settings=settings,
        )
    link.close()
    raw.dispose()


def _claim(q: Quiet, *, lease_s: float, token: uuid.UUID | None = None) -> Any:
    """What a worker's claim of one release does (None when nothing is runnable)."""
    from app.releases.runner import claim_batch

    while True:
        claims, taken = q.link.run(
            lambda c: claim_batch(
                c, lease_s=lease_s, max_runs=3, token=token or uuid.uuid4(), limit=1
            )
        )
        if claims or not taken:  # taken but not runnable: failed after max_runs; next one
            return claims[0] if claims else None


def _query(
    q: Quiet, ds: str, *, key: str | None = None, prefer: str | None = None, **body: Any
) -> Any:
    headers = dict(ADMIN)
    if key is not None:
        headers["Idempotency-Key"] = key
    if prefer is not None:
        headers["Prefer"] = prefer
    payload = {"quantiles": [0.25, 0.5, 0.75], "epsilon": "0.1", "method": "indexp"} | body
    return q.client.post(f"/v1/datasets/{ds}/quantiles", json=payload, headers=headers)


# --------------------------------------------------------------------------- reserve, then run


def test_reservation_debits_first_and_the_run_completes_it(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    r = _query(quiet, ds, prefer="respond-async")
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/releases/{r.json()['id']}"
    assert r.headers["preference-applied"] == "respond-async"
    pending = r.json()
    assert pending["status"] == "pending" and pending["estimates"] is None
    # Paid before any run: the debit exists, the dataset is frozen, nothing ran yet.
    assert quiet.ledger(ds)["debits"] == 1 and quiet.ledger(ds)["spent"] == Decimal("0.1")
    assert quiet.release_row(pending["id"]) == {"status": "pending", "attempts": 0, "failure": None}
    frozen = quiet.client.get(f"/v1/datasets/{ds}", headers=ADMIN).json()["frozen_at"]
    assert frozen is not None
    poll = quiet.client.get(r.headers["location"], headers=ADMIN)
    assert poll.status_code == 200 and poll.json()["status"] == "pending"
    etag = poll.headers["etag"]
    assert (
        quiet.client.get(r.headers["location"], headers=ADMIN | {"If-None-Match": etag}).status_code
        == 304
    )

    assert quiet.run_one() is True
    assert quiet.run_one() is False  # nothing left
    done = quiet.client.get(r.headers["location"], headers=ADMIN | {"If-None-Match": etag})
    assert done.status_code == 200  # the ETag changed with the state
    body = done.json()
    assert body["status"] == "done" and len(body["estimates"]) == 3 and body["finished_at"]
    again = quiet.client.get(r.headers["location"], headers=ADMIN)
    assert again.content == done.content  # byte-identical from now on
    assert quiet.release_row(pending["id"])["attempts"] == 1
    assert quiet.ledger(ds)["debits"] == 1


def test_a_synchronous_query_without_a_worker_answers_202_after_its_wait(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    t0 = time.monotonic()
    r = _query(quiet, ds, key="sync-" + uuid.uuid4().hex)
    assert r.status_code == 202, r.text  # sync_wait_s=0.5 ran out: paid, queued, pollable
    assert 0.4 < time.monotonic() - t0 < 5
    assert r.json()["status"] == "pending"
    assert quiet.run_one()
    # The retry with the same key returns the finished release, no new debit.
    retry = _query(quiet, ds, key=r.request.headers["idempotency-key"])
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json()["status"] == "done" and retry.json()["id"] == r.json()["id"]
    assert quiet.ledger(ds)["debits"] == 1


def test_a_failed_run_keeps_its_debit_and_a_replay_returns_it_failed_without_a_rerun(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed release is final (issue 28, migration 0011): resuming it until a run finishes
    in time would release an output conditioned on its own run time. A replay with the same
    key returns it as it stands, runs nothing and debits nothing."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    key = "fails-once-" + uuid.uuid4().hex

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise FloatingPointError("injected failure 42.5")  # a message a value could be in

    monkeypatch.setitem(MECHANISMS, "indexp", broken_indexp(boom))
    first = _query(quiet, ds, key=key, prefer="respond-async")
    assert first.status_code == 202
    assert quiet.run_one()
    failed = quiet.client.get(f"/v1/releases/{first.json()['id']}", headers=ADMIN).json()
    assert failed["status"] == "failed" and failed["failure"] == "mechanism_error"
    assert failed["estimates"] is None and "42.5" not in str(failed)
    assert failed["cost"] == {"epsilon": "0.1", "delta": "0"}
    assert quiet.ledger(ds)["debits"] == 1 and quiet.ledger(ds)["spent"] == Decimal("0.1")

    monkeypatch.undo()
    retry = _query(quiet, ds, key=key, prefer="respond-async")
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json()["id"] == first.json()["id"] and retry.json()["status"] == "failed"
    assert not quiet.run_one()  # nothing was queued again
    assert quiet.release_row(first.json()["id"])["attempts"] == 1
    assert quiet.ledger(ds)["debits"] == 1 and quiet.ledger(ds)["spent"] == Decimal("0.1")
    # A different body with the same key is still refused.
    assert _query(quiet, ds, key=key, epsilon="0.2").json()["type"] == "idempotency_conflict"


def test_a_synchronous_failure_is_answered_from_its_announcement_byte_identically(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails while its request waits: the 201 is built from the announced outcome
    (status, public reason, finish time, no estimates) and equals a later GET byte for byte."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise FloatingPointError("injected failure")

    monkeypatch.setitem(MECHANISMS, "indexp", broken_indexp(boom))
    answer: list[Any] = []
    waiting = threading.Thread(target=lambda: answer.append(_query(quiet, ds, epsilon="1e-1")))
    waiting.start()
    try:
        with quiet.engine.connect() as conn:
            for _ in range(200):  # the reservation, then run it while the request waits
                pending = conn.execute(
                    text("SELECT count(*) FROM release WHERE dataset_id = :d"), {"d": ds}
                ).scalar_one()
                if pending:
                    break
                time.sleep(0.005)
        assert quiet.run_one()
    finally:
        waiting.join(timeout=30)
    created = answer[0]
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "failed"
    assert created.json()["failure"] == "mechanism_error" and created.json()["estimates"] is None
    again = quiet.client.get(f"/v1/releases/{created.json()['id']}", headers=ADMIN)
    assert again.content == created.content


def test_a_lost_lease_is_claimed_again_and_attempts_are_capped(quiet: Quiet) -> None:
    """A worker that died mid-run: its lease expires, another worker runs the release."""
    from app.releases.runner import complete_batch

    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    rid = _query(quiet, ds, prefer="respond-async").json()["id"]
    # A worker claims with a 0.2 s lease and dies without a word.
    claim = _claim(quiet, lease_s=0.2)
    assert claim is not None and str(claim.release_id) == rid
    assert _claim(quiet, lease_s=0.2) is None
    time.sleep(0.3)
    assert quiet.run_one()  # the lease expired: claimed again and completed
    assert quiet.release_row(rid) == {"status": "done", "attempts": 2, "failure": None}
    # The dead worker's late completion is refused by the lease token.
    assert quiet.link.run(lambda c: complete_batch(c, [(claim, [1.0])])) == 0
    assert quiet.ledger(ds)["debits"] == 1


def test_releases_whose_workers_keep_dying_end_failed_with_one_debit(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    rid = _query(quiet, ds, prefer="respond-async").json()["id"]
    for _ in range(3):
        assert _claim(quiet, lease_s=0.05)
        time.sleep(0.1)
    assert _claim(quiet, lease_s=0.05) is None
    assert quiet.release_row(rid) == {"status": "failed", "attempts": 4, "failure": "worker_lost"}
    assert quiet.ledger(ds)["debits"] == 1


def test_a_worker_claims_a_batch_in_one_statement_and_stores_each_run_at_once(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a worker claims its share of the queue in one statement; each run after
    the first starts with its own lease and attempt, and each result is stored the moment
    it exists (issue 28: a finished release used to wait for the next run of its batch, and
    was lost and ran again when that run hit the time limit). When the second run starts,
    the first release is already done in the database. Each release gets exactly its own
    estimates, one debit, one attempt, and a byte-identical later read."""
    import app.runtime.worker as worker_module
    from app.runtime.worker import process_batch

    ds = quiet.api.dataset(values=SAMPLE, epsilon="10")["id"]
    assert _query(quiet, ds, prefer="respond-async").status_code == 202  # warm-up
    assert quiet.run_one()
    rids = [_query(quiet, ds, prefer="respond-async").json()["id"] for _ in range(5)]
    seen_before_run: list[list[str]] = []
    real_run = worker_module.run_job

    def spy(job: Any) -> Any:
        seen_before_run.append([quiet.release_row(r)["status"] for r in rids[:4]])
        return real_run(job)

    monkeypatch.setattr(worker_module, "run_job", spy)
    log = count_statements(monkeypatch)
    assert process_batch(quiet.link, quiet.settings, limit=4) == 4
    claimed = [q for q in log["sync"] if q.startswith("WITH queue AS")]
    started = [q for q in log["sync"] if "attempts = r.attempts + 1" in q]
    stored = [q for q in log["sync"] if "SET status = 'done'" in q]
    assert (len(claimed), len(started), len(stored)) == (1, 3, 4), log["sync"]
    assert seen_before_run == [
        ["pending"] * 4,
        ["done"] + ["pending"] * 3,
        ["done"] * 2 + ["pending"] * 2,
        ["done"] * 3 + ["pending"],
    ]
    rows = [quiet.release_row(rid) for rid in rids]
    assert [r["status"] for r in rows] == ["done"] * 4 + ["pending"]  # the oldest four
    assert [r["attempts"] for r in rows] == [1] * 4 + [0]
    assert quiet.run_one() and quiet.release_row(rids[4])["status"] == "done"
    for rid in rids:
        got = quiet.client.get(f"/v1/releases/{rid}", headers=ADMIN)
        assert got.status_code == 200 and len(got.json()["estimates"]) == 3
    assert quiet.ledger(ds)["debits"] == 6


def test_a_run_past_its_deadline_in_a_batch_fails_alone_and_the_rest_is_given_back(
    quiet: Quiet,
) -> None:
    """The supervisor knows the release a worker was running and the batch's lease token:
    the late one is failed (charged), the others of the batch go back to the queue at once
    and run (once) elsewhere, with one attempt each: they never started here (issue 28:
    attempts count runs that started)."""
    from app.releases.runner import Claim, claim_batch
    from app.runtime.worker import Supervisor

    ds = quiet.api.dataset(values=SAMPLE, epsilon="10")["id"]
    rids = [_query(quiet, ds, prefer="respond-async").json()["id"] for _ in range(3)]
    token = uuid.uuid4()
    claims, taken = quiet.link.run(
        lambda c: claim_batch(c, lease_s=600, max_runs=3, token=token, limit=3)
    )
    assert taken == 3 and [str(c.release_id) for c in claims] == rids
    supervisor = Supervisor(quiet.url, quiet.settings, 1)
    try:  # the worker was killed while running the first of its batch, past its deadline
        supervisor._settle(Claim(claims[0].release_id, token, 1), timed_out=True)
    finally:
        supervisor.link.close()
    assert quiet.release_row(rids[0]) == {"status": "failed", "attempts": 1, "failure": "timeout"}
    assert [quiet.release_row(r)["status"] for r in rids[1:]] == ["pending", "pending"]
    while quiet.run_one():
        pass
    assert [quiet.release_row(r) for r in rids[1:]] == [
        {"status": "done", "attempts": 1, "failure": None}
    ] * 2
    assert quiet.ledger(ds)["debits"] == 3


def test_a_worker_keeps_the_histograms_it_ran_on(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releases on the same data reuse the worker's validated histogram (and what the
    mechanisms derived from it); a new upload version is a new histogram; at most
    KEPT_HISTOGRAMS are kept."""
    import app.releases.runner as runner

    monkeypatch.setattr(runner, "KEPT_HISTOGRAMS", 2)
    monkeypatch.setattr(runner, "_kept", type(runner._kept)())
    seen: list[Any] = []
    real = runner.run_job

    def spy(job: Any, **kwargs: Any) -> list[float]:
        seen.append(job.histogram)
        return real(job, **kwargs)

    monkeypatch.setattr("app.runtime.worker.run_job", spy)
    first = quiet.api.dataset(values=SAMPLE, epsilon="10")["id"]
    for _ in range(2):
        assert _query(quiet, first, prefer="respond-async").status_code == 202
        assert quiet.run_one()
    assert seen[0] is seen[1]
    others = [quiet.api.dataset(values=SAMPLE, epsilon="10")["id"] for _ in range(2)]
    for ds in others:
        assert _query(quiet, ds, prefer="respond-async").status_code == 202
        assert quiet.run_one()
    assert len(runner._kept) == 2 and all(seen[0] is not h for h in runner._kept.values())


# --------------------------------------------------------------------------- refusals


def test_refusals_read_no_value(quiet: Quiet) -> None:
    """With the values table locked exclusively, refusals still answer (and fast)."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="0.05")["id"]
    analyst = quiet.api.new_key("analyst", ds)[1]
    blocker = quiet.engine.connect()
    tx = blocker.begin()
    try:
        blocker.execute(text("LOCK TABLE dataset_data IN ACCESS EXCLUSIVE MODE"))
        t0 = time.monotonic()
        r = quiet.client.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"},
            headers=analyst,
        )
        elapsed = time.monotonic() - t0
        assert r.status_code == 409 and r.json()["type"] == "budget_exhausted"
        assert elapsed < 2.0
        # The reservation itself reads no value either.
        ok = quiet.client.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.05", "method": "indexp"},
            headers=analyst | {"Prefer": "respond-async"},
        )
        assert ok.status_code == 202
    finally:
        tx.rollback()
        blocker.close()
    assert quiet.run_one()


# --------------------------------------------------------------------------- the balance row


def test_the_database_refuses_an_overdrawing_debit_written_by_hand(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    rid = _query(quiet, ds, prefer="respond-async", epsilon="0.4").json()["id"]
    with quiet.engine.begin() as conn:  # a code path that "forgot the lock"
        key = conn.execute(text("SELECT id FROM api_key LIMIT 1")).scalar_one()
        conn.execute(
            text(
                "INSERT INTO release (id, dataset_id, api_key_id, method, quantiles, epsilon,"
                " cost_epsilon, cost_delta, remaining_epsilon, remaining_delta, created_at,"
                " status, failure, attempts) VALUES (:i, :d, :k, 'indexp', '{0.5}', 0.7, 0.7,"
                " 0, 0, 0, now(), 'failed', 'mechanism_error', 0)"
            ),
            {"i": uuid.uuid4(), "d": ds, "k": key},
        )
    with quiet.engine.connect() as conn:
        rogue = conn.execute(
            text("SELECT id FROM release WHERE dataset_id = :d AND id <> :r"), {"d": ds, "r": rid}
        ).scalar_one()
    for amount in ("0.7", "0.600000000000000000001"):
        with pytest.raises(DBAPIError) as caught, quiet.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, release_id,"
                    " created_at) VALUES (:d, 'debit', :e, 0, :r, now())"
                ),
                {"d": ds, "e": Decimal(amount), "r": rogue},
            )
        assert "no_overdraft" in str(caught.value.orig)
    # Exactly the rest still fits; the balance row equals the ledger sums.
    with quiet.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_entry (dataset_id, kind, epsilon, delta, release_id,"
                " created_at) VALUES (:d, 'debit', 0.6, 0, :r, now())"
            ),
            {"d": ds, "r": rogue},
        )
    figures = quiet.ledger(ds)
    assert figures["spent"] == figures["balance_spent"] == figures["granted"] == Decimal(1)
    assert quiet.run_one()  # the honest reservation still runs


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE budget_balance SET spent_epsilon = 0",
        "UPDATE budget_balance SET granted_epsilon = granted_epsilon + 5",
        "DELETE FROM budget_balance",
        "TRUNCATE budget_balance",
        "INSERT INTO budget_balance VALUES ('{ds}', 100, 0, 0, 0)",
    ],
)
def test_the_balance_row_refuses_direct_writes(quiet: Quiet, statement: str) -> None:
    ds = quiet.api.dataset(epsilon="1")["id"]
    before = quiet.ledger(ds)
    with pytest.raises(DBAPIError) as caught, quiet.engine.begin() as conn:
        conn.execute(text(statement.format(ds=ds)))
    assert "budget_balance is written only by ledger_entry inserts" in str(caught.value.orig)
    assert quiet.ledger(ds) == before


def test_a_done_release_is_immutable_in_the_database(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    rid = _query(quiet, ds, prefer="respond-async").json()["id"]
    with pytest.raises(DBAPIError), quiet.engine.begin() as conn:
        conn.execute(text("UPDATE release SET cost_epsilon = 0 WHERE id = :i"), {"i": rid})
    assert quiet.run_one()
    for statement in (
        "UPDATE release SET estimates = '{1,2,3}' WHERE id = :i",
        "UPDATE release SET status = 'pending', estimates = NULL WHERE id = :i",
        "DELETE FROM release WHERE id = :i",
    ):
        with pytest.raises(DBAPIError), quiet.engine.begin() as conn:
            conn.execute(text(statement), {"i": rid})
    assert quiet.release_row(rid)["status"] == "done"


def test_balance_equals_the_ledger_sums_after_grants_and_releases(quiet: Quiet) -> None:
    ds = quiet.api.dataset(values=SAMPLE, epsilon="0.3", delta="0.001")["id"]
    for eps in ("0.1", "0.05", "0.15"):
        assert _query(quiet, ds, prefer="respond-async", epsilon=eps).status_code == 202
    r = quiet.client.post(
        f"/v1/datasets/{ds}/grants",
        json={"epsilon": "0.7", "delta": "0.000001", "reason": "more"},
        headers=ADMIN,
    )
    assert r.status_code == 201
    while quiet.run_one():
        pass
    figures = quiet.ledger(ds)
    assert figures["spent"] == figures["balance_spent"] == Decimal("0.3")
    assert figures["granted"] == figures["balance_granted"] == Decimal("1.0")
    budget = quiet.api.budget(ds)
    assert Decimal(budget["remaining"]["epsilon"]) == Decimal("0.7")
    assert Decimal(budget["granted"]["delta"]) == Decimal("0.001001")


# --------------------------------------------------------------------------- small ones


@pytest.mark.parametrize("position", ["-1", "99999999999999999999", "0", "1.5", "", " 7"])
def test_malformed_cursors_are_422_naming_the_field(quiet: Quiet, position: str) -> None:
    import base64

    ds = quiet.api.dataset(epsilon="1")["id"]
    cursor = base64.urlsafe_b64encode(f"v1:{position}".encode()).decode().rstrip("=")
    for path in (f"/v1/datasets/{ds}/releases", f"/v1/datasets/{ds}/ledger"):
        r = quiet.client.get(path, params={"cursor": cursor}, headers=ADMIN)
        assert r.status_code == 422, (path, r.text)
        assert r.json()["detail"].startswith("query.cursor")
    assert (
        quiet.client.get(
            f"/v1/datasets/{ds}/ledger", params={"cursor": encode_cursor(2**63 - 1)}, headers=ADMIN
        ).status_code
        == 200
    )


def test_the_bootstrap_key_follows_the_environment_variable(
    make_schema: Callable[[], str],
) -> None:
    url = make_schema()
    upgrade_database(url)
    first, second = ("dpq_boot-" + uuid.uuid4().hex * 2 for _ in range(2))

    def start(key: str | None) -> Any:
        settings = app_settings(url, admin_key=first)
        settings = settings.model_copy(update={"bootstrap_admin_key": None})
        if key is not None:
            settings = app_settings(url, admin_key=key)
        return TestClient(create_app(settings))

    def status(client: TestClient, key: str) -> int:
        return client.get("/v1/keys", headers=auth(key)).status_code

    with start(first) as c:
        assert status(c, first) == 200
    with start(second) as c:  # rotated: the old one is revoked, the new one works
        assert status(c, first) == 401 and status(c, second) == 200
        keys = c.get("/v1/keys", headers=auth(second)).json()["items"]
    assert sum(1 for k in keys if k["revoked_at"] is None and k["role"] == "admin") == 1
    with start(None) as c:  # removed: no bootstrap key works any more
        assert status(c, first) == 401 and status(c, second) == 401
    with start(second) as c:  # the same value again: the retired key is restored (issue 28)
        assert status(c, second) == 200 and status(c, first) == 401
    # an admin's revocation sticks: tests/service/test_bootstrap_key.py


def test_the_mechanism_runs_with_a_float_at_most_the_paid_decimal(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[float] = []
    real = MECHANISMS["indexp"]

    def spy(support: Any, rng: Any, **kwargs: Any) -> Any:
        seen.append(support.epsilon)
        assert real.core is not None
        return real.core(support, rng, **kwargs)

    monkeypatch.setitem(MECHANISMS, "indexp", dataclasses.replace(real, core=spy))
    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    assert _query(quiet, ds, prefer="respond-async", epsilon="0.1").status_code == 202
    assert quiet.run_one()
    assert seen and Decimal(seen[0]) <= Decimal("0.1") and seen[0] < 0.1
    assert quiet.ledger(ds)["spent"] == Decimal("0.1")


# --------------------------------------------------------------------------- with real workers


def test_concurrent_whole_budget_queries_run_one_mechanism_and_refuse_at_once(
    make_schema: Callable[[], str],
) -> None:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY)
    with (
        release_workers(url, concurrency=2, chaos_run_delay_ms=1500),
        TestClient(create_app(settings), raise_server_exceptions=False) as client,
    ):
        api = ApiBase(client, ADMIN, "whole")
        ds = api.dataset(values=SAMPLE, epsilon="0.5")["id"]
        analyst = api.new_key("analyst", ds)[1]
        results: list[tuple[int, float]] = []
        lock = threading.Lock()
        start = threading.Barrier(4)

        def one() -> None:
            start.wait()
            t0 = time.monotonic()
            r = client.post(
                f"/v1/datasets/{ds}/quantiles",
                json={"quantiles": [0.1, 0.5, 0.9], "epsilon": "0.5", "method": "jointexp"},
                headers=analyst,
            )
            with lock:
                results.append((r.status_code, time.monotonic() - t0))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        statuses = sorted(s for s, _ in results)
        assert statuses == [201, 409, 409, 409], results
        refusal_times = [dt for s, dt in results if s == 409]
        success_time = next(dt for s, dt in results if s == 201)
        assert success_time >= 1.5  # the one run, with its injected 1.5 s
        assert max(refusal_times) < 1.0  # the refusals did not wait for it
        with create_engine(url).connect() as conn:
            runs = conn.execute(
                text("SELECT coalesce(sum(attempts), 0), count(*) FROM release")
            ).one()
        assert tuple(runs) == (1, 1)  # exactly one mechanism run for one debit


def test_a_run_past_the_time_limit_is_killed_and_failed_with_its_debit(
    make_schema: Callable[[], str],
) -> None:
    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY)
    with (
        release_workers(url, concurrency=1, chaos_run_delay_ms=120_000, run_timeout_s=1),
        TestClient(create_app(settings), raise_server_exceptions=False) as client,
    ):
        api = ApiBase(client, ADMIN, "slow")
        ds = api.dataset(values=SAMPLE, epsilon="1")["id"]
        t0 = time.monotonic()
        r = api.query(ds)
        elapsed = time.monotonic() - t0
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["status"] == "failed" and body["failure"] == "timeout"
        assert body["estimates"] is None and body["cost"]["epsilon"] == "0.1"
        # Killed at its 1 s limit, long before the injected 120 s run would end; the upper
        # bound leaves room for a loaded CI machine (it once took 10.3 s to answer).
        assert 0.9 < elapsed < 60
        assert Decimal(api.budget(ds)["spent"]["epsilon"]) == Decimal("0.1")


def test_a_worker_killed_right_after_its_claim_commits_gets_its_lease_given_back(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker publishes its lease token to the supervisor *before* claiming, so a SIGKILL
    between the claim's commit and the worker's next word still lets the supervisor give
    the lease back at once (by token), instead of the release waiting out run_timeout +
    margin. (CI once caught the test below waiting out its 150 s lease that way.)"""
    import multiprocessing

    import app.runtime.worker as worker_module
    from app.releases.runner import Claim
    from app.runtime.worker import Slot, Supervisor

    ds = quiet.api.dataset(values=SAMPLE, epsilon="1")["id"]
    rid = _query(quiet, ds, prefer="respond-async").json()["id"]
    slot = Slot(multiprocessing.get_context("spawn"))
    published: list[Any] = []

    def spy(conn: Any, **kwargs: Any) -> Any:
        published.append((slot.read(), kwargs["token"]))
        raise KeyboardInterrupt  # stands in for the SIGKILL: no claim, nothing settled

    monkeypatch.setattr(worker_module, "claim_batch", spy)
    with pytest.raises(KeyboardInterrupt):
        process_one(quiet.link, quiet.settings, slot)
    ((seen, token),) = published
    assert seen is not None, "the supervisor would not know the lease of a worker dying now"
    assert seen[0].token == token and seen[0].release_id == uuid.UUID(int=0)
    assert slot.read() is None  # cleared again on the way out

    # The claim commits, the worker dies before saying which release: settle by token.
    claim = _claim(quiet, lease_s=600, token=token)
    assert claim is not None and str(claim.release_id) == rid
    supervisor = Supervisor(quiet.url, quiet.settings, 1)
    try:
        supervisor._settle(Claim(uuid.UUID(int=0), token, 0), timed_out=False)
    finally:
        supervisor.link.close()
    again = _claim(quiet, lease_s=600)
    assert again is not None and str(again.release_id) == rid and again.attempts == 2


def test_killing_a_worker_mid_run_resumes_the_release_once(
    make_schema: Callable[[], str],
) -> None:
    import psutil

    url = make_schema()
    upgrade_database(url)
    settings = app_settings(url, admin_key=ADMIN_KEY)
    raw = create_engine(url)
    with (
        release_workers(url, concurrency=1, chaos_run_delay_ms=2000) as supervisor,
        TestClient(create_app(settings), raise_server_exceptions=False) as client,
    ):
        api = ApiBase(client, ADMIN, "kill")
        ds = api.dataset(values=SAMPLE, epsilon="1")["id"]
        key = "kill-" + uuid.uuid4().hex
        first = client.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.2", "method": "indexp"},
            headers=ADMIN | {"Idempotency-Key": key, "Prefer": "respond-async"},
        )
        assert first.status_code == 202
        rid = first.json()["id"]

        def claimed() -> bool:
            with raw.connect() as conn:
                return bool(
                    conn.execute(
                        text("SELECT attempts = 1 FROM release WHERE id = :i"), {"i": rid}
                    ).scalar_one()
                )

        wait_for(claimed, timeout=30)

        def worker_process() -> list[psutil.Process]:
            return [
                child
                for child in psutil.Process(supervisor.pid).children()
                if "spawn_main" in " ".join(child.cmdline())
                and "resource_tracker" not in " ".join(child.cmdline())
            ]

        (worker,) = wait_for(worker_process, timeout=10)
        worker.kill()  # SIGKILL between reservation and completion
        retry = client.post(
            f"/v1/datasets/{ds}/quantiles",
            json={"quantiles": [0.5], "epsilon": "0.2", "method": "indexp"},
            headers=ADMIN | {"Idempotency-Key": key},
        )
        assert retry.status_code == 201, retry.text
        assert retry.json()["id"] == rid and retry.json()["status"] == "done"
        with raw.connect() as conn:
            attempts, debits = conn.execute(
                text(
                    "SELECT r.attempts, (SELECT count(*) FROM ledger_entry l"
                    " WHERE l.release_id = r.id) FROM release r WHERE r.id = :i"
                ),
                {"i": rid},
            ).one()
        assert (attempts, debits) == (2, 1)
        assert Decimal(api.budget(ds)["spent"]["epsilon"]) == Decimal("0.2")
    raw.dispose()


# --------------------------------------------------------------------------- round trips


def test_a_small_release_costs_few_statements(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 (throughput): a reservation is 2 statements from the web process (the key
    lookup, and one ``release_reserve()`` call that locks, checks, inserts and debits) and a
    worker's run 2 (the claim, which also returns the data version, and the completion).
    A regression that adds round trips per release fails here."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="10")["id"]
    # Warm-up: plans the dataset's figures, refreshes the key's last use, fills the cache.
    assert _query(quiet, ds, prefer="respond-async").status_code == 202
    assert quiet.run_one()
    log = count_statements(monkeypatch)
    r = _query(quiet, ds, prefer="respond-async")
    assert r.status_code == 202, r.text
    assert len(log["async"]) == 2 and not log["sync"], log
    assert quiet.run_one()
    assert len(log["sync"]) == 2 and len(log["async"]) == 2, log
    assert quiet.release_row(r.json()["id"])["status"] == "done"


def test_the_completion_is_on_disk_when_its_autocommit_statement_returns(
    quiet: Quiet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stores ``done`` in one autocommit statement that sets
    ``synchronous_commit = on`` for its own implicit transaction: even on a connection whose
    default is ``off`` (as the reservation's commit is), the WAL is flushed past the
    completion before the statement returns, so no answer can leave ahead of it."""
    import app.runtime.worker as worker_module

    ds = quiet.api.dataset(values=SAMPLE, epsilon="10")["id"]
    link = Link(quiet.url, quiet.settings)
    link.connection().execute("SET synchronous_commit = off")  # async commits by default
    lsn: list[str] = []
    real = worker_module.complete_batch

    def marked(conn: Any, done: Any, bounds: Any = None) -> int:
        with quiet.engine.connect() as other:  # the WAL position just before the completion
            lsn.append(other.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one())
        return real(conn, done, bounds)

    monkeypatch.setattr(worker_module, "complete_batch", marked)
    try:
        r = _query(quiet, ds, prefer="respond-async")
        assert r.status_code == 202, r.text
        assert link.connection().execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert process_one(link, quiet.settings)
        assert len(lsn) == 1
        flushed = (
            link.connection()
            .execute("SELECT pg_current_wal_flush_lsn() > %s::pg_lsn", (lsn[0],))
            .fetchone()
        )
        assert flushed == (True,), "the completion returned before its commit reached the disk"
        assert quiet.release_row(r.json()["id"])["status"] == "done"
    finally:
        link.close()


def _reserve_by_hand(quiet: Quiet, ds: str, key_id: uuid.UUID, cost: str) -> dict[str, Any]:
    """One ``release_reserve()`` call with the dataset's current figures (raw SQL)."""
    with quiet.engine.begin() as conn:
        neighbors, size = conn.execute(
            text(
                "SELECT neighbors, CASE WHEN neighbors = 'swap' THEN n ELSE size_hint END"
                " FROM dataset WHERE id = :d"
            ),
            {"d": ds},
        ).one()
        row = conn.execute(
            text(
                "SELECT * FROM release_reserve(:id, :d, :k, 'indexp', '{0.5}', :c, NULL, :c, 0,"
                " NULL, 'h', NULL, '[]', :nb, :size, 3, 0, 0)"
            ),
            {"id": uuid.uuid4(), "d": ds, "k": key_id, "c": Decimal(cost), "nb": neighbors,
             "size": size},
        ).mappings().one()  # fmt: skip
    return dict(row)


def test_a_reservation_that_does_not_fit_writes_nothing_and_reports_the_locked_budget(
    quiet: Quiet,
) -> None:
    """``release_reserve()`` checks the cost against the balance it reads itself under the
    dataset lock: too expensive, nothing is written and the figures of that read come back
    for the 409; affordable, the release and its debit are written together."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="0.25")["id"]
    with quiet.engine.connect() as conn:
        key_id = conn.execute(text("SELECT id FROM api_key LIMIT 1")).scalar_one()
    refused = _reserve_by_hand(quiet, ds, key_id, "0.3")
    assert refused["outcome"] == "budget_exhausted" and refused["seq"] is None
    assert refused["left_epsilon"] == Decimal("0.25")
    assert quiet.ledger(ds)["debits"] == 0
    fitted = _reserve_by_hand(quiet, ds, key_id, "0.25")
    assert fitted["outcome"] == "reserved" and fitted["seq"] is not None
    assert fitted["left_epsilon"] == Decimal("0.25")
    assert quiet.ledger(ds)["debits"] == 1 and quiet.ledger(ds)["balance_spent"] == Decimal("0.25")
    again = _reserve_by_hand(quiet, ds, key_id, "0.000001")
    assert again["outcome"] == "budget_exhausted" and again["left_epsilon"] == Decimal("0.00")
    while quiet.run_one():
        pass


def test_a_reservation_planned_on_stale_figures_is_planned_again(quiet: Quiet) -> None:
    """The web process prices a query on the public figures it last saw; when they changed
    (here: the size hint of an add_remove dataset, which ``method: auto`` and the expected
    error depend on), ``release_reserve()`` answers ``replan`` and the release is priced on
    the figures under the lock."""
    ds = quiet.api.dataset(values=SAMPLE, epsilon="10", neighbors="add_remove", size_hint=1000)[
        "id"
    ]
    first = _query(quiet, ds, prefer="respond-async", epsilon="1")
    assert first.status_code == 202, first.text
    patched = quiet.client.patch(f"/v1/datasets/{ds}", json={"size_hint": 10**6}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    second = _query(quiet, ds, prefer="respond-async", epsilon="1")
    assert second.status_code == 202, second.text
    mean = [r.json()["expected_error"][0]["mean"] for r in (first, second)]
    assert mean[0] != mean[1]  # planned on the new hint, not on the remembered one
    while quiet.run_one():
        pass
