"""Issue 5, point 6: a hostile input corpus gets the right 4xx naming the field; nothing is
stored and nothing is debited.

Every case is sent raw (exact bytes and Content-Type), so JSON tokens such as ``NaN`` or
``1e309`` reach the server unaltered. After each case the dataset's ledger, releases and
stored values are compared, in raw SQL, with their state before it.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from .conftest import ADMIN, Api, ledger_state, report

JSON = "application/json"
# (id, raw body, content type, expected status, substring the detail must contain)
Case = tuple[str, bytes | str, str, int, str]


def _j(obj: Any) -> str:
    return json.dumps(obj)


QUERY_OK = {"quantiles": [0.25, 0.5], "epsilon": "0.1", "method": "indexp"}


def _q(**change: Any) -> str:
    body = dict(QUERY_OK)
    body.update(change)
    return _j({k: v for k, v in body.items() if v is not _DROP})


_DROP = object()

QUERY_CASES: list[Case] = [
    ("quantiles-empty", _q(quantiles=[]), JSON, 422, "body.quantiles"),
    ("quantiles-duplicate", _q(quantiles=[0.5, 0.5]), JSON, 422, "body.quantiles"),
    ("quantiles-unsorted", _q(quantiles=[0.9, 0.1]), JSON, 422, "body.quantiles"),
    ("quantiles-zero", _q(quantiles=[0.0, 0.5]), JSON, 422, "body.quantiles"),
    ("quantiles-one", _q(quantiles=[0.5, 1.0]), JSON, 422, "body.quantiles"),
    ("quantiles-negative", _q(quantiles=[-0.1]), JSON, 422, "body.quantiles"),
    ("quantiles-above-one", _q(quantiles=[1.5]), JSON, 422, "body.quantiles"),
    ("quantiles-nan-string", _q(quantiles=["NaN"]), JSON, 422, "body.quantiles"),
    ("quantiles-inf-string", _q(quantiles=["Infinity"]), JSON, 422, "body.quantiles"),
    ("quantiles-nan-token", '{"quantiles": [NaN], "epsilon": "0.1"}', JSON, 422, "body"),
    ("quantiles-1e309", '{"quantiles": [1e309], "epsilon": "0.1"}', JSON, 422, "body.quantiles"),
    ("quantiles-1e400-str", _q(quantiles=["1e400"]), JSON, 422, "body.quantiles"),
    ("quantiles-string", _q(quantiles="0.5"), JSON, 422, "body.quantiles"),
    ("quantiles-nested", _q(quantiles=[[0.5]]), JSON, 422, "body.quantiles"),
    (
        "quantiles-too-many",
        _q(quantiles=list(np.linspace(0.01, 0.99, 5000))),
        JSON,
        422,
        "body.quantiles",
    ),
    ("quantiles-missing", _q(quantiles=_DROP), JSON, 422, "body.quantiles"),
    ("epsilon-zero", _q(epsilon="0"), JSON, 422, "body.epsilon"),
    ("epsilon-negative", _q(epsilon="-1"), JSON, 422, "body.epsilon"),
    ("epsilon-number-negative", '{"quantiles": [0.5], "epsilon": -0.5}', JSON, 422, "body.epsilon"),
    ("epsilon-1e-320", _q(epsilon="1e-320"), JSON, 422, "body.epsilon"),
    ("epsilon-1e-320-number", '{"quantiles": [0.5], "epsilon": 1e-320}', JSON, 422, "body.epsilon"),
    ("epsilon-huge", _q(epsilon="1e300"), JSON, 422, "body.epsilon"),
    ("epsilon-1e400", _q(epsilon="1e400"), JSON, 422, "body.epsilon"),
    ("epsilon-1e309-number", '{"quantiles": [0.5], "epsilon": 1e309}', JSON, 422, "body.epsilon"),
    ("epsilon-nan", _q(epsilon="NaN"), JSON, 422, "body.epsilon"),
    ("epsilon-infinity", _q(epsilon="Infinity"), JSON, 422, "body.epsilon"),
    ("epsilon-text", _q(epsilon="a lot"), JSON, 422, "body.epsilon"),
    ("epsilon-bool", _q(epsilon=True), JSON, 422, "body.epsilon"),
    ("epsilon-missing", _q(epsilon=_DROP), JSON, 422, "body.epsilon"),
    ("delta-one", _q(method="appindexp", delta="1"), JSON, 422, "body.delta"),
    ("delta-above-one", _q(method="appindexp", delta="1.5"), JSON, 422, "body.delta"),
    ("delta-zero", _q(method="appindexp", delta="0"), JSON, 422, "body.delta"),
    ("delta-negative", _q(method="appindexp", delta="-1e-6"), JSON, 422, "body.delta"),
    ("delta-unused", _q(method="indexp", delta="1e-6"), JSON, 422, "body.delta"),
    ("delta-missing", _q(method="appindexp"), JSON, 422, "body.delta"),
    ("method-unknown", _q(method="nope"), JSON, 422, "body.method"),
    ("method-empty", _q(method=""), JSON, 422, "body.method"),
    ("method-long", _q(method="x" * 10_000), JSON, 422, "body.method"),
    ("unknown-field", _q(extra_field=1), JSON, 422, "extra_field"),
    ("malformed-json", '{"quantiles": [0.5], "epsilon": ', JSON, 422, "body"),
    ("json-array", "[0.5]", JSON, 422, "body"),
    ("json-null", "null", JSON, 422, "body"),
    ("empty-body", "", JSON, 422, "body"),
    ("text-plain", _q(), "text/plain", 422, "body"),
    ("form", "quantiles=0.5&epsilon=0.1", "application/x-www-form-urlencoded", 422, "body"),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000, JSON, 422, "body"),
]

CREATE_OK = {"lower": 0, "upper": 1, "epsilon": "1"}


def _c(**change: Any) -> str:
    body: dict[str, Any] = {"name": "hostile-" + uuid.uuid4().hex[:8], **CREATE_OK}
    body.update(change)
    return _j({k: v for k, v in body.items() if v is not _DROP})


CREATE_CASES: list[Case] = [
    ("lower-nan", _c(lower="NaN"), JSON, 422, "body.lower"),
    ("lower-1e309", _c().replace('"lower": 0', '"lower": 1e309'), JSON, 422, "body.lower"),
    ("lower-1e400-string", _c(lower="1e400"), JSON, 422, "body.lower"),
    ("upper-minus-inf", _c(upper="-Infinity"), JSON, 422, "body.upper"),
    ("nan-token", _c().replace('"lower": 0', '"lower": NaN'), JSON, 422, "body"),
    ("lower-equals-upper", _c(lower=1, upper=1), JSON, 422, "lower"),
    ("lower-above-upper", _c(lower=2, upper=1), JSON, 422, "lower"),
    ("span-overflows", _c(lower=-1.7e308, upper=1.7e308), JSON, 422, "upper"),
    ("epsilon-negative", _c(epsilon="-1"), JSON, 422, "body.epsilon"),
    ("epsilon-1e-320", _c(epsilon="1e-320"), JSON, 422, "body.epsilon"),
    ("epsilon-huge", _c(epsilon="1e400"), JSON, 422, "body.epsilon"),
    ("delta-negative", _c(delta="-0.1"), JSON, 422, "body.delta"),
    ("granularity-zero", _c(granularity=0), JSON, 422, "body.granularity"),
    ("granularity-negative", _c(granularity=-1), JSON, 422, "body.granularity"),
    ("granularity-nan", _c(granularity="NaN"), JSON, 422, "body.granularity"),
    ("granularity-too-coarse", _c(granularity=5), JSON, 422, "body.granularity"),
    ("granularity-too-fine", _c(granularity=1e-300), JSON, 422, "body.granularity"),
    ("neighbors-unknown", _c(neighbors="cousins"), JSON, 422, "body.neighbors"),
    ("name-empty", _c(name=""), JSON, 422, "body.name"),
    ("name-long", _c(name="n" * 100_000), JSON, 422, "body.name"),
    ("name-whitespace", _c(name="  padded  "), JSON, 422, "body.name"),
    ("description-long", _c(description="d" * 100_000), JSON, 422, "body.description"),
    ("name-missing", _c(name=_DROP), JSON, 422, "body.name"),
    ("unknown-field", _c(owner="me"), JSON, 422, "owner"),
    ("malformed-json", "{", JSON, 422, "body"),
    ("text-plain", _c(), "text/plain", 422, "body"),
]

OCTET = "application/octet-stream"
CSV = "text/csv"
UPLOAD_CASES: list[tuple[str, bytes | str, str, dict[str, str], int, str]] = [
    ("json-nan", "[1.0, NaN]", JSON, {}, 422, "body"),
    ("json-infinity", "[1.0, Infinity]", JSON, {}, 422, "body"),
    ("json-minus-infinity", "[1.0, -Infinity]", JSON, {}, 422, "body"),
    ("json-1e309", "[1.0, 2.0, 1e309]", JSON, {}, 422, "index 2"),
    ("json-huge-int", "[1.0, " + "9" * 400 + "]", JSON, {}, 422, "index 1"),
    ("json-1e400-string", '[1.0, "1e400"]', JSON, {}, 422, "index 1"),
    ("json-string", '[1.0, "2.0"]', JSON, {}, 422, "index 1"),
    ("json-null", "[1.0, null]", JSON, {}, 422, "index 1"),
    ("json-bool", "[1.0, true]", JSON, {}, 422, "index 1"),
    ("json-nested", "[1.0, [2.0]]", JSON, {}, 422, "index 1"),
    ("json-object", '{"values": [1.0]}', JSON, {}, 422, "body"),
    ("json-empty-array", "[]", JSON, {}, 422, "body"),
    ("json-malformed", "[1.0, 2.0", JSON, {}, 422, "body"),
    ("json-deep", "[" * 100_000 + "]" * 100_000, JSON, {}, 422, "body"),
    ("empty-body", "", JSON, {}, 422, "body"),
    ("csv-no-column", "v\n1\n", CSV, {}, 422, "query.column"),
    ("csv-unknown-column", "v\n1\n", CSV, {"column": "w"}, 422, "query.column"),
    ("csv-text-cell", "v\n1\nabc\n", CSV, {"column": "v"}, 422, "row 2"),
    ("csv-nan-cell", "v\n1\nnan\n", CSV, {"column": "v"}, 422, "row 2"),
    ("csv-inf-cell", "v\n1\n-inf\n", CSV, {"column": "v"}, 422, "row 2"),
    ("csv-1e400-cell", "v\n1\n1e400\n", CSV, {"column": "v"}, 422, "row 2"),
    ("csv-empty-cell", "v,w\n1,2\n,3\n", CSV, {"column": "v"}, 422, "row 2"),
    ("csv-missing-cell", "v,w\n1,2\n3\n", CSV, {"column": "w"}, 422, "row 2"),
    ("csv-unterminated-quote", 'v\n1\n"2\n', CSV, {"column": "v"}, 422, "row 2"),
    ("csv-header-only", "v\n", CSV, {"column": "v"}, 422, "body"),
    ("csv-not-utf8", b"v\n1\n\xff\xfe\n", CSV, {"column": "v"}, 422, "body"),
    ("csv-nul-byte", "v\n1\n2\x00\n", CSV, {"column": "v"}, 422, "row 2"),
    ("octet-odd-length", b"\x00" * 13, OCTET, {}, 422, "body"),
    ("octet-nan", struct.pack("<2d", 1.0, float("nan")), OCTET, {}, 422, "index 1"),
    ("octet-inf", struct.pack("<2d", float("inf"), 1.0), OCTET, {}, 422, "index 0"),
    ("wrong-type-xml", "<v>1</v>", "application/xml", {}, 415, "Content-Type"),
    ("wrong-type-text", "1\n2\n", "text/plain", {}, 415, "Content-Type"),
    ("no-content-type", "[1.0]", "", {}, 415, "Content-Type"),
]


@pytest.fixture
def target(hapi: Api) -> dict[str, Any]:
    ds = hapi.dataset(values=[1.0, 2.0, 3.0, 4.0], epsilon="1", delta="0.001")
    return ds


def _send(
    client: TestClient, method: str, path: str, body: bytes | str, ctype: str, **kw: Any
) -> Any:
    headers = dict(ADMIN)
    if ctype:
        headers["content-type"] = ctype
    content = body.encode() if isinstance(body, str) else body
    return client.request(method, path, content=content, headers=headers, **kw)


def _check(r: Any, status: int, field: str, case: str) -> None:
    assert r.status_code == status, (case, r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"type", "detail"}, (case, body)
    assert field in body["detail"], (case, body["detail"])
    assert len(r.content) < 2000, case  # never an echo of a huge input


@pytest.mark.parametrize("case", QUERY_CASES, ids=[c[0] for c in QUERY_CASES])
def test_hostile_quantile_queries(
    case: Case, hclient: TestClient, hdb: Engine, target: dict[str, Any]
) -> None:
    name, body, ctype, status, field = case
    before = ledger_state(hdb, target["id"])
    r = _send(hclient, "POST", f"/v1/datasets/{target['id']}/quantiles", body, ctype)
    _check(r, status, field, name)
    assert ledger_state(hdb, target["id"]) == before  # nothing debited, nothing released


@pytest.mark.parametrize("case", CREATE_CASES, ids=[c[0] for c in CREATE_CASES])
def test_hostile_dataset_definitions(case: Case, hclient: TestClient, hdb: Engine) -> None:
    name, body, ctype, status, field = case
    with hdb.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM dataset")).scalar_one()
        grants = conn.execute(text("SELECT count(*) FROM ledger_entry")).scalar_one()
    r = _send(hclient, "POST", "/v1/datasets", body, ctype)
    _check(r, status, field, name)
    with hdb.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM dataset")).scalar_one() == count
        assert conn.execute(text("SELECT count(*) FROM ledger_entry")).scalar_one() == grants


@pytest.mark.parametrize("case", UPLOAD_CASES, ids=[c[0] for c in UPLOAD_CASES])
def test_hostile_uploads(
    case: tuple[str, bytes | str, str, dict[str, str], int, str],
    hclient: TestClient,
    hdb: Engine,
    target: dict[str, Any],
) -> None:
    name, body, ctype, params, status, field = case
    before = ledger_state(hdb, target["id"])
    r = _send(hclient, "PUT", f"/v1/datasets/{target['id']}/values", body, ctype, params=params)
    _check(r, status, field, name)
    assert ledger_state(hdb, target["id"]) == before  # values, version, ledger unchanged


def test_hostile_grants(hclient: TestClient, hdb: Engine, target: dict[str, Any]) -> None:
    path = f"/v1/datasets/{target['id']}/grants"
    cases = [
        ({"epsilon": "-1", "reason": "x"}, "body.epsilon"),
        ({"epsilon": "1e-320", "reason": "x"}, "body.epsilon"),
        ({"epsilon": "1e400", "reason": "x"}, "body.epsilon"),
        ({"epsilon": "NaN", "reason": "x"}, "body.epsilon"),
        ({"epsilon": "0", "delta": "0", "reason": "x"}, "body"),
        ({"epsilon": "1"}, "body.reason"),
        ({"epsilon": "1", "reason": "r" * 5000}, "body.reason"),
        ({"epsilon": "1", "reason": "x", "kind": "debit"}, "kind"),
    ]
    before = ledger_state(hdb, target["id"])
    for body, field in cases:
        r = hclient.post(path, json=body, headers=ADMIN)
        _check(r, 422, field, str(body)[:60])
    assert ledger_state(hdb, target["id"]) == before


def test_oversized_bodies_are_refused_before_parsing(
    make_app: Callable[..., Any], hdb: Engine
) -> None:
    with make_app(max_upload_bytes=1000, max_body_bytes=4096) as client:
        api = Api(client)
        ds = api.dataset(values=[1.0, 2.0], epsilon="1")
        before = ledger_state(hdb, ds["id"])
        big = _j([float(i) for i in range(1000)])  # ~6 KB
        r = _send(client, "PUT", f"/v1/datasets/{ds['id']}/values", big, JSON)
        _check(r, 413, "1000 bytes", "upload content-length")

        def chunks(n: int = 20, size: int = 100) -> Any:  # no Content-Length: streamed
            for _ in range(n):
                yield b" " * size

        r = client.put(
            f"/v1/datasets/{ds['id']}/values",
            content=chunks(),
            headers=ADMIN | {"content-type": JSON},
        )
        _check(r, 413, "1000 bytes", "upload chunked")
        huge_query = _j({"quantiles": [0.5], "epsilon": "0.1", "pad": "x" * 10_000})
        r = _send(client, "POST", f"/v1/datasets/{ds['id']}/quantiles", huge_query, JSON)
        _check(r, 413, "4096 bytes", "query body")
        r = client.post(
            f"/v1/datasets/{ds['id']}/quantiles",
            content=chunks(20, 300),
            headers=ADMIN | {"content-type": JSON},
        )
        _check(r, 413, "4096 bytes", "query body chunked")
        assert ledger_state(hdb, ds["id"]) == before
    report(
        "6 hostile corpus",
        query_cases=len(QUERY_CASES),
        create_cases=len(CREATE_CASES),
        upload_cases=len(UPLOAD_CASES),
        grant_cases=8,
        oversize_cases=4,
    )
