"""dpquant_client against a live server (issue 11, item 3)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from dpquant_client import (
    BudgetExhausted,
    Client,
    ConnectionFailed,
    Dataset,
    Forbidden,
    NameTaken,
    NotFound,
    NotSupported,
    Release,
    Unauthorized,
    ValidationError,
)

from tests.client.conftest import VALUES, name
from tests.live import LiveServer


def analyst_for(admin: Client, server: LiveServer, ds: Dataset, **kw: Any) -> Client:
    key = admin.create_key("analyst", dataset_id=ds.id, name="client test")
    return Client(server.base_url, key.key, backoff=0.01, **kw)


def test_sync_release_budget_and_reads(admin: Client, server: LiveServer) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1", description="sync")
    assert isinstance(ds, Dataset) and ds.budget_remaining.epsilon == Decimal("1")
    uploaded = admin.upload(ds.id, VALUES)
    assert uploaded.n == len(VALUES)
    with analyst_for(admin, server, ds) as analyst:
        assert analyst.me().role == "analyst"
        release = analyst.quantiles(ds.id, [0.25, 0.5, 0.75], epsilon="0.1", method="indexp")
        assert isinstance(release, Release) and release.done
        assert release.estimates is not None and len(release.estimates) == 3
        assert release.estimates == sorted(release.estimates)
        assert release.cost.epsilon == Decimal("0.1") and not release.replayed
        assert analyst.last_status == 201
        budget = analyst.budget(ds.id)
        assert budget.remaining.epsilon == Decimal("0.9")
        assert isinstance(budget.remaining.epsilon, Decimal)
        assert analyst.release(release.id) == release
        assert [r.id for r in analyst.releases(ds.id)] == [release.id]
        assert [d.id for d in analyst.datasets()] == [ds.id]
        # under swap (this dataset's relation) n is public: every role sees it
        assert analyst.dataset(ds.id).n == len(VALUES)
    ledger = admin.ledger(ds.id)
    assert [e.kind for e in ledger] == ["debit", "grant"]
    entry = admin.grant(ds.id, epsilon="0.5", reason="client test")
    assert entry.kind == "grant" and entry.epsilon == Decimal("0.5")
    assert admin.budget(ds.id).granted.epsilon == Decimal("1.5")


def test_budget_exhaustion_is_a_typed_error(admin: Client, server: LiveServer) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="0.3")
    admin.upload(ds.id, VALUES)
    with analyst_for(admin, server, ds) as analyst:
        for _ in range(3):
            analyst.quantiles(ds.id, [0.5], epsilon="0.1", method="indexp")
        with pytest.raises(BudgetExhausted) as info:
            analyst.quantiles(ds.id, [0.5], epsilon="0.1", method="indexp")
        assert info.value.status == 409 and info.value.type == "budget_exhausted"
        assert info.value.requested_epsilon == Decimal("0.1")
        assert info.value.remaining_epsilon == Decimal("0")
        assert analyst.budget(ds.id).remaining.epsilon == Decimal("0")


class LoseFirstAnswer(httpx.BaseTransport):
    """Forwards every request; the first quantile answer is lost (a read error) after the
    server has acted on it, or replaced by a 503 before it reaches the server."""

    def __init__(self, mode: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.mode = mode
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        is_query = request.url.path.endswith("/quantiles")
        if is_query:
            self.sent.append(request)
        first = is_query and len(self.sent) == 1
        if first and self.mode == "503":
            body = {"type": "overloaded", "detail": "try again"}
            return httpx.Response(503, json=body, headers={"Retry-After": "0"})
        response = self.inner.handle_request(request)
        if first and self.mode == "lost":
            response.read()
            raise httpx.ReadError("connection dropped after the server answered", request=request)
        return response


@pytest.mark.parametrize("mode", ["lost", "503"])
def test_retries_reuse_the_idempotency_key_and_pay_once(
    admin: Client, server: LiveServer, mode: str
) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    admin.upload(ds.id, VALUES)
    flaky = LoseFirstAnswer(mode)
    with analyst_for(admin, server, ds, transport=flaky) as analyst:
        release = analyst.quantiles(ds.id, [0.1, 0.9], epsilon="0.2", method="indexp")
    assert len(flaky.sent) == 2
    keys = {r.headers["idempotency-key"] for r in flaky.sent}
    assert len(keys) == 1  # the retry carried the same key
    assert release.replayed is (mode == "lost")  # the server replayed the first release
    assert admin.budget(ds.id).spent.epsilon == Decimal("0.2")  # paid once
    assert len(admin.releases(ds.id)) == 1


def test_connection_errors_on_unsafe_calls_are_not_retried(server: LiveServer) -> None:
    class Down(httpx.BaseTransport):
        calls = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            Down.calls += 1
            raise httpx.ConnectError("down", request=request)

    with Client(server.base_url, "k", transport=Down(), retries=2, backoff=0) as c:
        with pytest.raises(ConnectionFailed):
            c.create_dataset(name(), lower=0, upper=1)
        assert Down.calls == 1  # creating twice is not safe: no retry
        with pytest.raises(ConnectionFailed):
            c.datasets()
        assert Down.calls == 4  # reads are retried


def test_async_release_contract(admin: Client, server: LiveServer) -> None:
    """``wait=False`` asks for ``Prefer: respond-async``. A server with asynchronous releases
    answers 202 with a pending release that ``wait`` polls to done; one without answers 201
    with the done release. Both paths end with the same typed, done release."""
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    admin.upload(ds.id, VALUES)
    with analyst_for(admin, server, ds) as analyst:
        first = analyst.quantiles(ds.id, [0.5], epsilon="0.1", method="jointexp", wait=False)
        assert analyst.last_status in (201, 202)
        if analyst.last_status == 202:
            assert first.status in ("pending", "done")
        else:
            assert first.done and first.estimates is not None
        final = analyst.wait(first, timeout=60)
        assert final.done and final.estimates is not None and len(final.estimates) == 1
        assert final.id == first.id
        polled = analyst.release(first.id)  # cached: answered 304
        assert analyst.last_status == 304 and polled == final
    assert admin.budget(ds.id).spent.epsilon == Decimal("0.1")


def test_etag_cache_answers_polls_with_304(admin: Client) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=1, epsilon="2")
    first = admin.budget(ds.id)
    assert admin.last_status == 200
    again = admin.budget(ds.id)
    assert admin.last_status == 304 and again == first
    admin.grant(ds.id, epsilon="1", reason="changes the budget")
    changed = admin.budget(ds.id)
    assert admin.last_status == 200 and changed.granted.epsilon == Decimal("3")


def test_typed_errors(admin: Client, server: LiveServer) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    admin.upload(ds.id, VALUES)
    with pytest.raises(NotFound):
        admin.dataset("00000000-0000-0000-0000-000000000000")
    with pytest.raises(NameTaken):
        admin.create_dataset(ds.name, lower=0, upper=1)
    with pytest.raises(ValidationError) as info:
        admin.quantiles(ds.id, [1.5], epsilon="0.1")
    assert "quantiles[0]" in info.value.detail
    with Client(server.base_url, "dpq_" + "x" * 43) as stranger, pytest.raises(Unauthorized):
        stranger.datasets()
    viewer_key = admin.create_key("viewer", dataset_id=ds.id).key
    with Client(server.base_url, viewer_key) as viewer:
        with pytest.raises(Forbidden):
            viewer.quantiles(ds.id, [0.5], epsilon="0.1")
        with pytest.raises(Forbidden):
            viewer.api_keys()
    assert admin.budget(ds.id).spent.epsilon == Decimal("0")


def test_upload_from_files(admin: Client, tmp_path: Path) -> None:
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    csv = tmp_path / "values.csv"
    csv.write_text("id,income\n" + "".join(f"{i},{v}\n" for i, v in enumerate(VALUES)))
    assert admin.upload(ds.id, path=csv, column="income").n == len(VALUES)
    as_json = tmp_path / "values.json"
    as_json.write_text(json.dumps(VALUES[:50]))
    assert admin.upload(ds.id, path=as_json).n == 50
    import struct

    raw = tmp_path / "values.bin"
    raw.write_bytes(struct.pack("<10d", *VALUES[:10]))
    assert admin.upload(ds.id, path=raw).n == 10
    with pytest.raises(TypeError):
        admin.upload(ds.id)


def test_a_dataset_with_a_privacy_unit(admin: Client, tmp_path: Path) -> None:
    ds = admin.create_dataset(
        name(), lower=0, upper=250, epsilon="5", privacy_unit="person", max_rows_per_unit=2
    )
    assert (ds.privacy_unit, ds.max_rows_per_unit, ds.max_groups_per_unit) == ("person", 2, 1)
    csv = tmp_path / "visits.csv"
    rows = [(f"p{i % 40}", v) for i, v in enumerate(VALUES)]  # 40 people
    csv.write_text("person,income\n" + "".join(f"{p},{v}\n" for p, v in rows))
    stored = admin.upload(ds.id, path=csv, column="income")
    assert stored.units == 40 and stored.n == 80
    assert stored.rows_dropped == len(VALUES) - 80
    release = admin.quantiles(ds.id, [0.5], epsilon="1", method="jointexp")
    assert release.estimates is not None and len(release.estimates) == 1


def test_a_zcdp_table(admin: Client) -> None:
    ds = admin.create_dataset(
        name(), lower=0, upper=250, epsilon="1", delta="0.000001", accounting="zcdp"
    )
    assert (ds.accounting, ds.accounting_delta) == ("zcdp", Decimal("0.000001"))
    admin.upload(ds.id, values=VALUES)
    before = admin.budget(ds.id)
    assert before.rho is not None and before.releases_left is not None
    assert before.releases_left.count == 19  # JointExp at 0.1: rho 0.00125 each
    quote = admin.quote(ds.id, [0.5], epsilon="0.1", method="jointexp")
    assert quote.rho == Decimal("0.00125") and quote.releases_left == 19
    release = admin.quantiles(ds.id, [0.5], epsilon="0.1", method="jointexp")
    assert release.remaining is None and release.rho is not None
    assert release.rho["cost"] == Decimal("0.00125")
    after = admin.budget(ds.id, typical="0.2")
    assert after.rho is not None and after.rho.spent == Decimal("0.00125")
    assert after.guarantee is not None and 0 < after.guarantee.epsilon < 1
    assert after.releases_left is not None and after.releases_left.epsilon == Decimal("0.2")
    grant = admin.grant(ds.id, reason="more", rho="0.5")
    assert grant.rho == Decimal("0.5")


def test_a_table_with_two_numeric_columns(admin: Client, tmp_path: Path) -> None:
    ds = admin.create_dataset(
        name(),
        columns=[
            {"name": "age", "type": "integer", "lower": 0, "upper": 120},
            {"name": "income", "type": "numeric", "lower": 0, "upper": 250},
        ],
        epsilon="1",
    )
    assert [c["name"] for c in ds.columns] == ["age", "income"]
    csv = tmp_path / "people.csv"
    csv.write_text("age,income\n" + "".join(f"{30 + i % 40},{v}\n" for i, v in enumerate(VALUES)))
    assert admin.upload(ds.id, path=csv).n == len(VALUES)
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "people.parquet"
    pq.write_table(pa.table({"age": [30, 40], "income": [10.0, 20.0]}), parquet)
    assert admin.upload(ds.id, path=parquet).n == 2
    assert admin.upload(ds.id, path=csv).n == len(VALUES)
    for column in ("age", "income"):
        assert admin.quote(ds.id, [0.5], epsilon="0.1", column=column).cost.epsilon == Decimal(
            "0.1"
        )
        release = admin.quantiles(ds.id, [0.5], epsilon="0.1", column=column)
        assert release.column == column and release.data_version == 3
    with pytest.raises(ValidationError):
        admin.quantiles(ds.id, [0.5], epsilon="0.1")  # two numeric columns: name one


def test_keys_lifecycle(admin: Client, server: LiveServer) -> None:
    created = admin.create_key("viewer", name="to revoke")
    assert created.key.startswith("dpq_") and created.role == "viewer"
    assert created.id in {k.id for k in admin.api_keys()}
    admin.revoke_key(created.id)
    with Client(server.base_url, created.key) as revoked, pytest.raises(Unauthorized):
        revoked.me()
    assert "dpq_" not in repr(admin)


def test_quote_and_methods_are_guarded(admin: Client) -> None:
    """Before issue 10 lands the server has neither endpoint: NotSupported, not a 404."""
    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    if admin._run(admin._has("/v1/datasets/{dataset_id}/quote", "post")):
        admin.upload(ds.id, VALUES)
        quote = admin.quote(ds.id, [0.5], epsilon="0.1")
        assert quote.cost is not None
    else:
        with pytest.raises(NotSupported):
            admin.quote(ds.id, [0.5], epsilon="0.1")
    if not admin._run(admin._has("/v1/methods", "get")):
        with pytest.raises(NotSupported):
            admin.methods()
    assert admin.budget(ds.id).spent.epsilon == Decimal("0")


def test_typed_methods_get_or_create_and_to_pandas(
    admin: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    methods = {m.name: m for m in admin.methods()}
    assert methods["jointexp"].guarantee == "pure_dp" and methods["jointexp"].zcdp
    assert methods["smooth"].zcdp is None and methods["smooth"].needs_delta
    title = name()
    made = admin.get_or_create_dataset(title, lower=0, upper=250, epsilon="1")
    again = admin.get_or_create_dataset(title, lower=0, upper=999, epsilon="5")
    assert again.id == made.id and again.upper == 250  # returned as it is
    admin.upload(made.id, VALUES)
    release = admin.quantiles(made.id, [0.25, 0.5, 0.75], epsilon="1", method="jointexp")
    frame = release.to_pandas()
    assert list(frame["quantile"]) == [0.25, 0.5, 0.75]
    assert list(frame["estimate"]) == release.estimates
    assert {"expected_mean", "expected_bound90"} <= set(frame.columns)  # n is public (swap)
    assert release.expected_error is not None and release.expected_error[1].quantile == 0.5
    assert release.expected_error[1].bound90 >= release.expected_error[1].mean > 0
    assert release.expected_error[1].size == len(VALUES)  # the public n it assumes
    # error bars in the data's units, typed, and in the frame
    assert release.intervals is not None and release.estimates is not None
    for bar, estimate in zip(release.intervals, release.estimates, strict=True):
        assert bar.low <= estimate <= bar.high
    assert list(frame["low"]) == [bar.low for bar in release.intervals]
    assert list(frame["high"]) == [bar.high for bar in release.intervals]
    assert isinstance(release.warnings, list)
    quote = admin.quote(made.id, [0.5], epsilon="0.1")
    assert quote.expected_error is not None and quote.expected_error[0].quantile == 0.5
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        release.to_pandas()


def test_governance_methods(admin: Client, server: LiveServer) -> None:
    """Issue 12 through the client: caps, rotation, rename, archive, the audit log."""
    from dpquant_client import DatasetArchived, KeyBudgetExhausted, KeyNotRotatable

    ds = admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
    admin.upload(ds.id, VALUES)
    capped = admin.create_key("analyst", dataset_id=ds.id, name="capped", max_epsilon="0.15")
    assert capped.max_epsilon == Decimal("0.15") and capped.spent_epsilon == Decimal(0)
    with Client(server.base_url, capped.key, backoff=0.01) as analyst:
        analyst.quantiles(ds.id, [0.5], epsilon="0.1", method="indexp")
        with pytest.raises(KeyBudgetExhausted) as caught:
            analyst.quantiles(ds.id, [0.5], epsilon="0.1", method="indexp")
    assert caught.value.cap_epsilon == Decimal("0.15")
    assert caught.value.spent_epsilon == Decimal("0.1")
    rotated = admin.rotate_key(capped.id)
    assert rotated.id == capped.id and rotated.key != capped.key
    with Client(server.base_url, capped.key) as old, pytest.raises(Unauthorized):
        old.me()
    admin.revoke_key(capped.id)
    with pytest.raises(KeyNotRotatable):
        admin.rotate_key(capped.id)
    renamed = admin.update_dataset(ds.id, name=ds.name + "-v2")
    assert renamed.name == ds.name + "-v2"
    admin.archive_dataset(ds.id)
    assert admin.dataset(ds.id).archived_at is not None
    with pytest.raises(DatasetArchived):
        admin.quantiles(ds.id, [0.5], epsilon="0.1", method="indexp")
    actions = [e.action for e in admin.audit() if e.target_id in (str(ds.id), str(capped.id))]
    assert actions[0] == "dataset.archive" and "key.rotate" in actions


def test_grouped_release_through_the_client(admin: Client, tmp_path: Path) -> None:
    ds = admin.create_dataset(
        name(),
        epsilon="4",
        columns=[
            {"name": "income", "type": "numeric", "lower": 0, "upper": 1000, "granularity": 1},
            {"name": "region", "type": "categorical", "keys": ["north", "south"]},
        ],
    )
    rng = np.random.default_rng(9)
    lines = ["income,region"]
    for i in range(1200):
        region = "north" if i % 2 else "south"
        lines.append(f"{rng.normal(300 if region == 'north' else 700, 15):.1f},{region}")
    csv = tmp_path / "rows.csv"
    csv.write_text("\n".join(lines) + "\n")
    admin.upload(ds.id, path=csv)
    quote = admin.quote(ds.id, [0.5], epsilon="1", group_by="region")
    assert quote.group_error is not None and quote.group_error.by_size is not None
    assert quote.group_error.by_size[0].size == 10
    release = admin.quantiles(
        ds.id, [0.25, 0.75], epsilon="1", group_by="region", keys=["south", "north", "west"]
    )
    assert release.estimates is None and release.group_by == "region"
    assert release.groups is not None
    assert [g.key for g in release.groups] == ["south", "north", "west"]
    south, north, _ = release.groups
    assert south.estimates is not None and north.estimates is not None
    assert 650 < south.estimates[0] < south.estimates[1] < 750
    assert 250 < north.estimates[0] < north.estimates[1] < 350
    frame = release.to_pandas()
    assert list(frame.columns) == ["region", "quantile", "estimate"]
    assert len(frame) == 6 and list(frame["region"][:2]) == ["south", "south"]
    assert admin.release(release.id).groups == release.groups
    # size hints (public, typed here): the hinted group gets its expected error and bars
    hints = {"south": 600}
    quote = admin.quote(ds.id, [0.5], epsilon="1", group_by="region", size_hints=hints)
    assert quote.group_error is not None and quote.group_error.by_key is not None
    assert [(k.key, k.size) for k in quote.group_error.by_key] == [("south", 600)]
    hinted = admin.quantiles(ds.id, [0.25, 0.75], epsilon="1", group_by="region",
                             size_hints=hints)  # fmt: skip
    assert hinted.groups is not None
    north, south = hinted.groups  # the column's declared order
    assert south.expected_error is not None and south.expected_error.size == 600
    assert south.intervals is not None and south.estimates is not None
    for bar, estimate in zip(south.intervals, south.estimates, strict=True):
        assert bar.low <= estimate <= bar.high
    assert north.expected_error is None and north.intervals is None
    frame = hinted.to_pandas()
    assert {"low", "high", "expected_mean"} <= set(frame.columns)
    assert frame["low"][:2].isna().all() and frame["low"][2:].notna().all()
