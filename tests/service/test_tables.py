"""A dataset is a table: declared columns, one budget for every column, releases that name
their column."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from .conftest import Api

CSV = {"content-type": "text/csv"}

COLUMNS = [
    {"name": "age", "type": "integer", "lower": 0, "upper": 120},
    {"name": "income", "type": "numeric", "lower": 0, "upper": 500_000, "granularity": 10},
    {"name": "region", "type": "categorical", "keys": ["north", "south"]},
]


def people_csv(n: int = 2000, *, unit: bool = True, seed: int = 5) -> bytes:
    rng = np.random.default_rng(seed)
    ages = rng.integers(18, 90, n)
    incomes = np.round(rng.lognormal(10.5, 0.5, n), 2)
    head = "person,age,income,region,ignored\n" if unit else "age,income,region,ignored\n"
    lines = [head]
    for i in range(n):
        region = "north" if i % 3 else "south"
        prefix = f"id{i // 2}," if unit else ""  # two rows per person
        lines.append(f"{prefix}{ages[i]},{incomes[i]},{region},x\n")
    return "".join(lines).encode()


def table(api: Api, **extra: Any) -> dict[str, Any]:
    body = {
        "name": f"t-{uuid.uuid4().hex[:10]}",
        "columns": COLUMNS,
        "epsilon": "1",
        **extra,
    }
    r = api.client.post("/v1/datasets", json=body, headers=api.admin)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def put(client: TestClient, api: Api, ds: str, body: bytes, *, append: bool = False) -> Any:
    call = client.post if append else client.put
    return call(f"/v1/datasets/{ds}/values", content=body, headers={**api.admin, **CSV})


def test_two_numeric_columns_share_one_budget(api: Api, client: TestClient) -> None:
    ds = table(api, privacy_unit="person", max_rows_per_unit=2)
    assert [c["name"] for c in ds["columns"]] == ["age", "income", "region"]
    assert ds["columns"][0]["granularity"] == 1.0  # integer: step 1 by default
    r = put(client, api, ds["id"], people_csv())
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (2000, 1000, 0)
    for column, (lo, hi, step) in (("age", (0, 120, 1)), ("income", (0, 500_000, 10))):
        for _ in range(5):
            rel = api.query(
                ds["id"], quantiles=[0.25, 0.5, 0.75], epsilon="0.1", method="jointexp",
                column=column,
            )  # fmt: skip
            assert rel.status_code == 201, rel.text
            body = rel.json()
            assert body["column"] == column
            est = body["estimates"]
            assert est == sorted(est) and all(lo <= e <= hi for e in est)
            assert all(abs(e / step - round(e / step)) < 1e-6 for e in est)
    for column in ("age", "income"):
        refused = api.query(ds["id"], quantiles=[0.5], epsilon="0.1", column=column)
        assert refused.status_code == 409 and refused.json()["type"] == "budget_exhausted"
    ledger = client.get(f"/v1/datasets/{ds['id']}/ledger?limit=100", headers=api.admin).json()
    debits = [e for e in ledger["items"] if e["kind"] == "debit"]
    assert len(debits) == 10
    assert sum(Decimal(e["epsilon"]) for e in debits) == Decimal("1")
    assert api.budget(ds["id"])["remaining"]["epsilon"] == "0"


def test_the_column_is_required_where_there_are_several(api: Api, client: TestClient) -> None:
    ds = table(api)
    assert put(client, api, ds["id"], people_csv(300, unit=False)).status_code == 200
    before = api.budget(ds["id"])
    for body, problem in (
        ({}, "is required"),
        ({"column": "nope"}, "not a numeric column"),
        ({"column": "region"}, "not a numeric column"),
    ):
        r = api.query(ds["id"], quantiles=[0.5], epsilon="0.1", **body)
        assert r.status_code == 422 and "body.column" in r.text and problem in r.text, r.text
        q = client.post(
            f"/v1/datasets/{ds['id']}/quote",
            json={"quantiles": [0.5], "epsilon": "0.1", **body},
            headers=api.admin,
        )
        assert q.status_code == 422 and "body.column" in q.text
    assert api.budget(ds["id"]) == before
    ok = api.query(ds["id"], quantiles=[0.5], epsilon="0.1", column="age")
    assert ok.status_code == 201 and ok.json()["column"] == "age"


def test_the_one_column_shape_is_a_table_of_one_column(api: Api) -> None:
    ds = api.dataset(values=[1.0, 2.0, 3.0], lower=0, upper=10)
    assert ds["columns"] == [
        {
            "name": "value",
            "type": "numeric",
            "lower": 0.0,
            "upper": 10.0,
            "granularity": ds["granularity"],
            "keys": None,
        }
    ]
    rel = api.query(ds["id"], quantiles=[0.5], epsilon="0.1")
    assert rel.status_code == 201 and rel.json()["column"] == "value"
    named = api.query(ds["id"], quantiles=[0.5], epsilon="0.1", column="value")
    assert named.status_code == 201


def test_table_uploads_are_checked_by_name_and_store_nothing_when_bad(
    api: Api, client: TestClient
) -> None:
    ds = table(api)
    cases = [
        (b"age,income\n1,2\n", "region"),  # a declared column missing from the header
        (b"age,income,region\n1,2,east\n", "row 1"),  # not a declared key
        (b"age,income,region\n1,,north\n", "row 1"),  # empty cell
        (b"age,income,region\n1,abc,north\n", "row 1"),
    ]
    for body, needle in cases:
        r = put(client, api, ds["id"], body)
        assert r.status_code == 422 and needle in r.text, r.text
        assert "east" not in r.text and "abc" not in r.text
    r = client.put(
        f"/v1/datasets/{ds['id']}/values?column=age",
        content=b"age,income,region\n1,2,north\n",
        headers={**api.admin, **CSV},
    )
    assert r.status_code == 422 and "query.column" in r.text
    r = client.put(f"/v1/datasets/{ds['id']}/values", json=[1.0], headers=api.admin)
    assert r.status_code == 422 and "index 0: not an object" in r.text
    r = client.put(
        f"/v1/datasets/{ds['id']}/values",
        content=b"\0" * 8,
        headers={**api.admin, "content-type": "application/octet-stream"},
    )
    assert r.status_code == 415
    r = client.put(
        f"/v1/datasets/{ds['id']}/histogram",
        json={"cells": [1], "counts": [1]},
        headers=api.admin,
    )
    assert r.status_code == 422 and "query.column" in r.text and "age, income" in r.text
    assert client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()["n"] is None
    skipped = client.put(
        f"/v1/datasets/{ds['id']}/values?missing=skip",
        content=b"age,income,region\n1,,north\n2,3,south\n",
        headers={**api.admin, **CSV},
    )
    assert skipped.status_code == 200, skipped.text
    assert (skipped.json()["n"], skipped.json()["values_skipped"]) == (1, 1)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"lower": 0, "upper": 1}, "either columns"),
        ({"columns": [COLUMNS[0], COLUMNS[0]]}, "distinct"),
        ({"columns": [COLUMNS[2]]}, "numeric column"),
        ({"columns": COLUMNS, "privacy_unit": "age"}, "privacy_unit"),
        ({"columns": [{**COLUMNS[0], "granularity": 0.5}]}, "whole number"),
        ({"columns": [{**COLUMNS[1], "lower": 5, "upper": 5}]}, "lower must be smaller"),
        ({"columns": [{"name": "x", "type": "text"}]}, "type"),
        ({"columns": [{**COLUMNS[2], "keys": ["a", "a"]}]}, "distinct"),
        ({"columns": [{**COLUMNS[1], "granularity": 1e-12}]}, "granularity"),
        ({}, "give columns, or lower and upper"),
    ],
)
def test_bad_schemas_are_refused_by_name(
    api: Api, client: TestClient, extra: dict[str, Any], needle: str
) -> None:
    body = {"name": f"t-{uuid.uuid4().hex[:10]}", **extra}
    if "columns" not in extra and "lower" in extra:
        body["columns"] = COLUMNS
    r = client.post("/v1/datasets", json=body, headers=api.admin)
    assert r.status_code == 422 and needle in r.text, r.text


def test_a_json_array_of_objects_is_a_table_upload(api: Api, client: TestClient) -> None:
    ds = table(api, privacy_unit="person", max_rows_per_unit=1)
    rows = [
        {"person": 7, "age": 30, "income": 1000.5, "region": "north", "other": [1]},
        {"person": 7, "age": 31, "income": 2000, "region": "south"},  # same person: 1 kept
        {"person": "ann", "age": 40, "income": 3000, "region": "north"},
    ]
    r = client.put(f"/v1/datasets/{ds['id']}/values", json=rows, headers=api.admin)
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (2, 2, 1)
    bad = [
        ([{"age": 1, "income": 2, "region": "north"}], "index 0", "privacy_unit"),
        ([{"person": "a", "income": 2, "region": "north"}], "index 0", "'age'"),
        ([{"person": "a", "age": "x", "income": 2, "region": "north"}], "index 0", "number"),
        ([{"person": "a", "age": True, "income": 2, "region": "north"}], "index 0", "number"),
        ([{"person": "a", "age": 1, "income": 2, "region": 5}], "index 0", "string"),
        ([{"person": "", "age": 1, "income": 2, "region": "north"}], "index 0", "unit"),
        ([{"person": 1.5, "age": 1, "income": 2, "region": "north"}], "index 0", "unit"),
        ([{"person": "a", "age": 1, "income": 2, "region": "north"}, 3], "index 1", "object"),
    ]
    for body, where, what in bad:
        r = client.post(f"/v1/datasets/{ds['id']}/values", json=body, headers=api.admin)
        assert r.status_code == 422 and where in r.text and what in r.text, r.text
    r = client.post(
        f"/v1/datasets/{ds['id']}/values",
        content=b'[{"person": "a", "age": 1,',
        headers={**api.admin, "content-type": "application/json"},
    )
    assert r.status_code == 422 and "malformed JSON" in r.text
    # deep nesting is refused at once (ijson's prefixed events grew quadratically with it)
    for body in (b"[" * 200_000, b'[{"person": 1, "x": ' + b"[" * 100_000):
        r = client.post(
            f"/v1/datasets/{ds['id']}/values",
            content=body,
            headers={**api.admin, "content-type": "application/json"},
        )
        assert r.status_code == 422 and ("nested" in r.text or "object" in r.text), r.text
    assert client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()["n"] == 2


def test_a_parquet_file_is_a_table_upload(api: Api, client: TestClient) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = table(api, privacy_unit="person", max_rows_per_unit=2)
    n = 3000
    rng = np.random.default_rng(2)
    frame = pa.table(
        {
            "person": pa.array([i // 3 for i in range(n)], pa.int64()),  # 3 rows each
            "age": pa.array(rng.integers(18, 90, n), pa.int32()),
            "income": pa.array(rng.lognormal(10, 0.5, n)),
            "region": pa.array(["north" if i % 2 else "south" for i in range(n)]),
            "ignored": pa.array(np.zeros(n)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(frame, sink)
    parquet = {**api.admin, "content-type": "application/vnd.apache.parquet"}
    r = client.put(f"/v1/datasets/{ds['id']}/values", content=sink.getvalue(), headers=parquet)
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (2000, 1000, 1000)
    rel = api.query(ds["id"], quantiles=[0.5], epsilon="0.5", column="age")
    assert rel.status_code == 201 and 18 <= rel.json()["estimates"][0] <= 90
    wrong = io.BytesIO()
    pq.write_table(frame.drop_columns(["age"]), wrong)
    r = client.post(f"/v1/datasets/{ds['id']}/values", content=wrong.getvalue(), headers=parquet)
    assert r.status_code == 422 and "'age'" in r.text
    typed = io.BytesIO()
    pq.write_table(frame.set_column(1, "age", pa.array(["x"] * n)), typed)
    r = client.post(f"/v1/datasets/{ds['id']}/values", content=typed.getvalue(), headers=parquet)
    assert r.status_code == 422 and "wrong type" in r.text


def test_missing_value_markers_are_missing_numbers_but_keys_and_ids(
    api: Api, client: TestClient
) -> None:
    ds = table(api, privacy_unit="person", max_rows_per_unit=3)
    body = (
        b"person,age,income,region\n"
        b"NA,30,100,north\n"  # a unit called NA
        b"p2,NaN,200,south\n"
        b"p3,40,null,north\n"
        b"p4,50, N/A ,south\n"
        b"p5,60,300,north\n"
    )
    refused = put(client, api, ds["id"], body)
    assert refused.status_code == 422 and "row 2: empty cell" in refused.text
    r = client.put(f"/v1/datasets/{ds['id']}/values?missing=skip", content=body,
                   headers={**api.admin, **CSV})  # fmt: skip
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["values_skipped"], r.json()["units"]) == (2, 3, 2)
    one = api.dataset(values=None, lower=0, upper=100)
    csv = b"v\n1\nNA\n2\nnan\n\n3\n"
    r = client.put(f"/v1/datasets/{one['id']}/values?column=v", content=csv,
                   headers={**api.admin, **CSV})  # fmt: skip
    assert r.status_code == 422 and "row 2: missing-value marker" in r.text
    r = client.put(f"/v1/datasets/{one['id']}/values?column=v&missing=skip", content=csv,
                   headers={**api.admin, **CSV})  # fmt: skip
    assert (r.json()["n"], r.json()["values_skipped"]) == (3, 2)


def test_a_csv_without_a_header_row_picks_its_column_by_position(
    api: Api, client: TestClient
) -> None:
    ds = api.dataset(values=None, lower=0, upper=100)
    body = b"1,10\n2,20\n3,NA\n4,40\n"
    up = client.put(f"/v1/datasets/{ds['id']}/values?header=false&column=2&missing=skip",
                    content=body, headers={**api.admin, **CSV})  # fmt: skip
    assert up.status_code == 200, up.text
    assert (up.json()["n"], up.json()["values_skipped"]) == (3, 1)
    first = client.put(f"/v1/datasets/{ds['id']}/values?header=false", content=body,
                       headers={**api.admin, **CSV})  # fmt: skip
    assert first.status_code == 200 and first.json()["n"] == 4  # column 1 by default
    for query, field in (
        ("header=false&column=income", "query.column"),
        ("header=false&column=0", "query.column"),
        ("header=false&column=3", "body"),  # row 1 has two cells
    ):
        r = client.put(f"/v1/datasets/{ds['id']}/values?{query}", content=body,
                       headers={**api.admin, **CSV})  # fmt: skip
        assert r.status_code == 422 and field in r.text, r.text
    r = client.put(f"/v1/datasets/{ds['id']}/values?header=false", json=[1.0], headers=api.admin)
    assert r.status_code == 422 and "query.header" in r.text
    tab = table(api)
    r = client.put(f"/v1/datasets/{tab['id']}/values?header=false", content=body,
                   headers={**api.admin, **CSV})  # fmt: skip
    assert r.status_code == 422 and "query.header" in r.text
