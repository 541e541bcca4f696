"""A table's histograms uploaded at once (what ``dpquant ingest --columns`` sends): every
numeric column, one section each, all or nothing."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from .conftest import Api

COLUMNS = [
    {"name": "age", "type": "integer", "lower": 0, "upper": 100},
    {"name": "income", "type": "numeric", "lower": 0, "upper": 1000, "granularity": 10},
    {"name": "region", "type": "categorical"},
]
OCTET = {"content-type": "application/octet-stream"}


def table(api: Api, **extra: Any) -> dict[str, Any]:
    body = {"name": f"t-{uuid.uuid4().hex[:10]}", "columns": COLUMNS, "epsilon": "100", **extra}
    r = api.client.post("/v1/datasets", json=body, headers=api.admin)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def section(cells: list[int], counts: list[int], *, declared: int | None = None) -> bytes:
    pairs = np.column_stack([cells, counts]).astype("<i8").tobytes()
    return np.int64(len(cells) if declared is None else declared).astype("<i8").tobytes() + pairs


# age: 50 rows on each of 60..79 (median in [60, 80]); income: 100 rows on each of the
# cells 20..29 (values 200..290: median in [200, 300])
AGE = (list(range(60, 80)), [50] * 20)
INCOME = (list(range(20, 30)), [100] * 10)


def put(client: TestClient, api: Api, ds: str, body: bytes, query: str, **headers: str) -> Any:
    return client.put(
        f"/v1/datasets/{ds}/histogram?{query}", content=body, headers={**api.admin, **headers}
    )


def median(api: Api, ds: str, column: str) -> float:
    rel = api.query(ds, quantiles=[0.5], epsilon="20", method="jointexp", column=column)
    assert rel.status_code == 201, rel.text
    assert rel.json()["column"] == column
    return float(rel.json()["estimates"][0])


@pytest.mark.parametrize("order", [("age", "income"), ("income", "age")])
def test_sections_in_any_named_order_fill_every_column(
    api: Api, client: TestClient, order: tuple[str, str]
) -> None:
    ds = table(api)
    parts = {"age": section(*AGE), "income": section(*INCOME)}
    body = b"".join(parts[name] for name in order)
    outside = {"age": 0, "income": 7}
    query = "&".join(f"column={n}" for n in order) + "".join(
        f"&n_outside={outside[n]}" for n in order
    )
    r = put(client, api, ds["id"], body, query + "&values_skipped=3", **OCTET)
    assert r.status_code == 200, r.text
    view = r.json()
    assert (view["n"], view["values_skipped"]) == (1000, 3)
    assert 60 <= median(api, ds["id"], "age") <= 80
    assert 200 <= median(api, ds["id"], "income") <= 300


def test_the_json_form_is_keyed_by_column(api: Api, client: TestClient) -> None:
    ds = table(api)
    body = {
        "income": {"cells": INCOME[0], "counts": INCOME[1]},
        "age": {"cells": AGE[0], "counts": AGE[1]},
    }
    r = client.put(
        f"/v1/datasets/{ds['id']}/histogram?column=age&column=income", json=body, headers=api.admin
    )
    assert r.status_code == 200, r.text
    assert r.json()["n"] == 1000
    assert 60 <= median(api, ds["id"], "age") <= 80


def test_a_unit_table_takes_a_sender_bounded_histogram_and_then_refuses_appends(
    api: Api, client: TestClient
) -> None:
    ds = table(api, privacy_unit="person", max_rows_per_unit=2)
    body = section(*AGE) + section(*INCOME)
    refused = put(client, api, ds["id"], body, "column=age&column=income", **OCTET)
    assert refused.status_code == 409 and refused.json()["type"] == "privacy_unit_needs_rows"
    query = "column=age&column=income&rows_per_unit=2&units=600&rows_dropped=40"
    r = put(client, api, ds["id"], body, query, **OCTET)
    assert r.status_code == 200, r.text
    assert (r.json()["units"], r.json()["rows_dropped"]) == (600, 40)
    append = client.post(
        f"/v1/datasets/{ds['id']}/values",
        content=b"person,age,income,region\np1,1,1,x\n",
        headers={**api.admin, "content-type": "text/csv"},
    )
    assert append.status_code == 409 and append.json()["type"] == "unit_counts_unknown"


BAD = [
    # (query, body, field, problem)
    ("", section(*AGE), "query.column", "is required"),
    ("column=age", section(*AGE), "query.column", "misses 'income'"),
    ("column=age&column=age", section(*AGE) * 2, "query.column", "twice"),
    ("column=age&column=region", section(*AGE) * 2, "query.column", "'region' is not a numeric"),
    ("column=age&column=income&n_outside=1", section(*AGE) + section(*INCOME),
     "query.n_outside", "one per column"),
    ("column=age&column=income&n_outside=0&n_outside=1001", section(*AGE) + section(*INCOME),
     "query.n_outside", "must not exceed"),
    ("column=age&column=income", section(*AGE) + section([25], [999]), "body",
     "the columns' totals differ"),
    ("column=age&column=income", section(*AGE) + section(*INCOME)[:-3], "body",
     "ends inside column 'income'"),
    ("column=age&column=income", section(*AGE), "body", "ends inside column 'income'"),
    ("column=age&column=income", section(*AGE) + section(*INCOME) + section(*AGE), "body",
     "more than 2 sections"),
    ("column=age&column=income", section(*AGE) + section([], [], declared=0), "body",
     "column 'income': the section's pair count"),
    ("column=age&column=income", section(*AGE) + section([101], [1000]), "body",
     "column 'income': pair 0: cell outside the grid [0, 100]"),
    ("column=age&column=income", section([60, 70], [500, 0]) + section(*INCOME), "body",
     "column 'age': pair 1: count must be at least 1"),
    ("column=age&column=income", section(*AGE, declared=21) + section(*INCOME), "body",
     "ends inside column 'income'"),
]  # fmt: skip


@pytest.mark.parametrize(("query", "body", "field", "problem"), BAD)
def test_bad_table_histograms_are_refused_by_name_and_store_nothing(
    api: Api, client: TestClient, query: str, body: bytes, field: str, problem: str
) -> None:
    ds = table(api)
    r = put(client, api, ds["id"], body, query, **OCTET)
    assert r.status_code == 422, r.text
    error = r.json()
    assert field in r.text and problem in r.text, error
    view = client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()
    assert view["n"] is None and view["values_uploaded_at"] is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"age": {"cells": [30], "counts": [1000]}}, "no histogram for column 'income'"),
        ({"age": {"cells": [30], "counts": [1000]}, "income": {"cells": [25]}}, "body.income"),
        (
            {"age": {"cells": [30], "counts": [1]}, "income": {"cells": [1], "counts": [1]},
             "tenure": {"cells": [1], "counts": [1]}},
            "'tenure' is not named",
        ),
        ([1, 2], "expected {"),
    ],
)  # fmt: skip
def test_bad_json_table_histograms_name_the_column(
    api: Api, client: TestClient, body: Any, problem: str
) -> None:
    ds = table(api)
    r = client.put(
        f"/v1/datasets/{ds['id']}/histogram?column=age&column=income", json=body, headers=api.admin
    )
    assert r.status_code == 422 and problem in r.text, r.text
    assert client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()["n"] is None


def test_one_column_datasets_keep_the_plain_body_and_may_name_their_column(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=None, lower=0, upper=100, granularity=1)
    plain = np.array([[30, 5], [70, 6]], dtype="<i8").tobytes()
    r = put(client, api, ds["id"], plain, "n_outside=2", **OCTET)
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["n_outside_bounds"]) == (11, 2)
    named = put(client, api, ds["id"], section([30], [4]), "column=value", **OCTET)
    assert named.status_code == 200, named.text
    assert named.json()["n"] == 4
    wrong = put(client, api, ds["id"], plain, "column=x", **OCTET)
    assert wrong.status_code == 422 and "'x' is not a numeric column" in wrong.text


@pytest.mark.parametrize("seed", range(6))
def test_sections_are_read_exactly_whatever_the_chunking(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Section headers and pairs split anywhere across the body's chunks (down to one byte)."""
    from app.codec.histogram import HistogramBuilder
    from app.datasets import upload
    from app.datasets.histogram_upload import PairSink, read_sections_octet

    monkeypatch.setattr(upload, "BLOCK_BYTES", 1)  # every chunk is its own block
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, size=3)
    want = [
        (np.sort(rng.choice(500, size=s, replace=False)), rng.integers(1, 9, size=s)) for s in sizes
    ]
    body = b"".join(section(list(c), list(n)) for c, n in want)
    cuts = np.sort(rng.choice(np.arange(1, len(body)), size=len(body) // 3, replace=False))
    chunks = [body[a:b] for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(body)], strict=True)]
    sinks = [
        PairSink(HistogramBuilder(lower=0, upper=499, granularity=1), max_values=10**6, label=n)
        for n in ("a", "b", "c")
    ]
    read_sections_octet(iter(chunks), sinks)
    for sink, (cells, counts) in zip(sinks, want, strict=True):
        got_cells, got_counts = sink.builder.result()
        assert got_cells.tolist() == cells.tolist() and got_counts.tolist() == counts.tolist()
