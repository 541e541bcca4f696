"""Dataset endpoints: create, read by role, upload in every format, validation, freezing."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from .conftest import ADMIN, SAMPLE, Api


def test_create_dataset_returns_admin_view_with_default_grid(api: Api) -> None:
    ds = api.dataset(lower=-50.0, upper=150.0, epsilon="2.5", description="heights")
    assert ds["granularity"] == 1e-4  # largest power of ten <= 200 / 10^6
    assert ds["budget_remaining"] == {"epsilon": "2.5", "delta": "0"}
    assert ds["n"] is None and ds["frozen_at"] is None


def test_explicit_granularity_is_kept(api: Api) -> None:
    assert api.dataset(granularity=0.5)["granularity"] == 0.5


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"lower": 5, "upper": 5}, "body"),
        ({"lower": 10, "upper": 1}, "body"),
        ({"upper": "inf"}, "body.upper"),
        ({"lower": "1e400"}, "body.lower"),
        ({"neighbors": "bogus"}, "body.neighbors"),
        ({"epsilon": -1}, "body.epsilon"),
        ({"delta": "-0.1"}, "body.delta"),
        ({"granularity": 0}, "body.granularity"),
        ({"granularity": 1000}, "body.granularity"),
        ({"name": ""}, "body.name"),
        ({"unknown": 1}, "body.unknown"),
    ],
)
def test_create_dataset_validation_names_the_field(
    client: TestClient, change: dict[str, Any], field: str
) -> None:
    body = {"name": "v-" + uuid.uuid4().hex[:8], "lower": 0, "upper": 100, **change}
    r = client.post("/v1/datasets", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "validation_error"
    assert r.json()["detail"].startswith(field)


def test_nan_literal_in_json_is_rejected(client: TestClient) -> None:
    r = client.post(
        "/v1/datasets",
        content=b'{"name": "nan", "lower": NaN, "upper": 1}',
        headers=ADMIN | {"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.json()["detail"].startswith("body")


def test_malformed_json_body_is_422(client: TestClient) -> None:
    r = client.post(
        "/v1/datasets", content=b"{not json", headers=ADMIN | {"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert "malformed JSON" in r.json()["detail"]


def test_duplicate_name_is_409(api: Api, client: TestClient) -> None:
    ds = api.dataset()
    r = client.post(
        "/v1/datasets", json={"name": ds["name"], "lower": 0, "upper": 1}, headers=ADMIN
    )
    assert r.status_code == 409
    assert r.json()["type"] == "name_taken"


@pytest.mark.parametrize("neighbors", ["swap", "add_remove"])
def test_admin_sees_sizes_others_see_n_only_where_it_is_public(
    api: Api, client: TestClient, neighbors: str
) -> None:
    """Under swap n is public (issue 28: analysts need it to read a quote's missed points);
    under add_remove only admins see it. The upload state stays the admins'."""
    ds = api.dataset(values=[*SAMPLE, -5.0, 500.0, 1000.0], neighbors=neighbors)
    admin_view = client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()
    assert admin_view["n"] == 103
    assert admin_view["n_outside_bounds"] == 3
    for role in ("analyst", "viewer"):
        key = api.key(role, ds["id"])
        view = client.get(f"/v1/datasets/{ds['id']}", headers=key).json()
        assert set(view) == {
            "id", "name", "description", "lower", "upper", "neighbors", "granularity",
            "size_hint", "n", "budget_remaining", "created_at", "archived_at",
            "privacy_unit", "max_rows_per_unit", "max_groups_per_unit", "columns",
            "accounting", "accounting_delta", "restore_hold_since",
        }  # fmt: skip
        assert view["n"] == (103 if neighbors == "swap" else None)
        listed = client.get("/v1/datasets", headers=key).json()["items"]
        assert [d["n"] for d in listed] == [view["n"]]


def test_list_datasets_pages_and_respects_scope(api: Api, client: TestClient) -> None:
    a, b = api.dataset(), api.dataset()
    page = client.get("/v1/datasets?limit=1", headers=ADMIN).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    page2 = client.get(f"/v1/datasets?limit=1&cursor={page['next_cursor']}", headers=ADMIN).json()
    assert page2["items"][0]["id"] != page["items"][0]["id"]
    scoped = client.get("/v1/datasets", headers=api.key("analyst", a["id"])).json()
    assert [d["id"] for d in scoped["items"]] == [a["id"]]
    assert scoped["items"][0]["n"] is None  # nothing uploaded yet
    assert b["id"] not in {d["id"] for d in scoped["items"]}


def test_bad_cursor_is_422(client: TestClient) -> None:
    r = client.get("/v1/datasets?cursor=%%%garbage", headers=ADMIN)
    assert r.status_code == 422
    assert r.json()["detail"].startswith("query.cursor")


def test_upload_json_csv_and_octet_stream(api: Api, client: TestClient) -> None:
    ds = api.dataset()
    url = f"/v1/datasets/{ds['id']}/values"
    r = client.put(url, json=[3, 1.5, 2], headers=ADMIN)
    assert r.status_code == 200 and r.json()["n"] == 3
    csv_body = b"id,height\n1,170.5\n2,180\n3,165.25\n4,199\n"
    r = client.put(
        url + "?column=height", content=csv_body, headers=ADMIN | {"content-type": "text/csv"}
    )
    assert r.status_code == 200 and r.json()["n"] == 4
    assert r.json()["n_outside_bounds"] == 4
    raw = struct.pack("<5d", 1, 2, 3, 4, 5)
    r = client.put(url, content=raw, headers=ADMIN | {"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["n"] == 5


@pytest.mark.parametrize(
    ("content", "ctype", "query", "expected"),
    [
        (b"[1, 2, NaN]", "application/json", "", "body: malformed JSON"),
        (b"[1, 2, 1e400]", "application/json", "", "body: index 2: not a finite number"),
        (b'[1, "x", 3]', "application/json", "", "body: index 1: not a number"),
        (b"[1, true]", "application/json", "", "body: index 1: not a number"),
        (b"[]", "application/json", "", "body: the upload contains no values"),
        (b"", "application/json", "", "body: the upload is empty"),
        (b'{"a": 1}', "application/json", "", "body: expected a JSON array"),
        (b"v\n1\nabc\n", "text/csv", "?column=v", "body: row 2: not a number"),
        (b"v\n1\ninf\n", "text/csv", "?column=v", "body: row 2: not a finite number"),
        (b"v\n1\n", "text/csv", "?column=w", "query.column: no such column"),
        (b"v\n1\n", "text/csv", "", "query.column: is required"),
        (b"a,v\n1,2\n3\n", "text/csv", "?column=v", "body: row 2: missing cell"),
        (b"\x00" * 12, "application/octet-stream", "", "body: octet-stream length"),
        (struct.pack("<2d", 1.0, float("nan")), "application/octet-stream", "", "body: index 1"),
    ],
)
def test_bad_uploads_are_atomic_422_naming_the_first_bad_row(
    api: Api, client: TestClient, content: bytes, ctype: str, query: str, expected: str
) -> None:
    ds = api.dataset(values=[1.0, 2.0])
    r = client.put(
        f"/v1/datasets/{ds['id']}/values{query}",
        content=content,
        headers=ADMIN | {"content-type": ctype},
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(expected)
    after = client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN).json()
    assert after["n"] == 2  # the previous values are untouched


def test_unsupported_content_type_is_415(api: Api, client: TestClient) -> None:
    ds = api.dataset()
    r = client.put(
        f"/v1/datasets/{ds['id']}/values",
        content=b"1 2 3",
        headers=ADMIN | {"content-type": "text/plain"},
    )
    assert r.status_code == 415
    assert r.json()["type"] == "unsupported_media_type"


def test_upload_above_the_size_limit_is_413(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = api.dataset()
    settings = client.app.state.settings  # type: ignore[attr-defined]
    monkeypatch.setattr(settings, "max_upload_bytes", 64)
    r = client.put(f"/v1/datasets/{ds['id']}/values", json=list(range(100)), headers=ADMIN)
    assert r.status_code == 413
    assert r.json()["type"] == "payload_too_large"
    monkeypatch.setattr(settings, "max_upload_bytes", 10**6)
    monkeypatch.setattr(settings, "max_values", 10)
    r = client.put(f"/v1/datasets/{ds['id']}/values", json=list(range(11)), headers=ADMIN)
    assert r.status_code == 413


def test_values_are_frozen_after_the_first_release(api: Api, client: TestClient) -> None:
    ds = api.dataset(values=SAMPLE)
    api.upload(ds["id"], [1.0, 2.0, 3.0])  # replacing before any release is allowed
    assert api.query(ds["id"]).status_code == 201
    r = client.put(f"/v1/datasets/{ds['id']}/values", json=[1, 2], headers=ADMIN)
    assert r.status_code == 409
    assert r.json()["type"] == "dataset_frozen"


def test_large_upload_is_stored_as_a_compact_grid_histogram(api: Api, db_engine: Any) -> None:
    from sqlalchemy import text

    from app.codec.grid import cell_of
    from app.codec.histogram import decode_histogram

    values = np.random.default_rng(1).normal(50, 10, 100_000)
    ds = api.dataset()
    r = api.client.put(
        f"/v1/datasets/{ds['id']}/values",
        content=values.astype("<f8").tobytes(),
        headers=ADMIN | {"content-type": "application/octet-stream"},
    )
    assert r.status_code == 200
    with db_engine.connect() as conn:
        blob = conn.execute(
            text("SELECT data FROM dataset_data WHERE dataset_id = :d"), {"d": ds["id"]}
        ).scalar_one()
    assert len(blob) < 8 * values.size // 10  # O(distinct cells), compressed
    cells, counts = decode_histogram(bytes(blob))
    expected = np.unique(cell_of(values, 0.0, 100.0, ds["granularity"]), return_counts=True)
    np.testing.assert_array_equal(cells, expected[0])
    np.testing.assert_array_equal(counts, expected[1])
    assert r.json()["n_cells"] == cells.size and r.json()["n"] == values.size


def test_unknown_dataset_is_404(client: TestClient) -> None:
    r = client.get(f"/v1/datasets/{uuid.uuid4()}", headers=ADMIN)
    assert r.status_code == 404
    assert r.json() == {"type": "not_found", "detail": "dataset not found"}
    assert client.get("/v1/datasets/not-a-uuid", headers=ADMIN).status_code == 422


def test_values_cache_never_serves_replaced_values(api: Api, db_engine: Any) -> None:
    from sqlalchemy.orm import Session

    from app.datasets.service import VALUES_CACHE, load_histogram

    ds = api.dataset(values=[1.0, 2.0, 3.0])
    dataset_id = uuid.UUID(ds["id"])
    with Session(db_engine) as session:
        first = load_histogram(session, dataset_id=dataset_id)
    assert first is not None and list(first[2]) == [1, 1, 1]
    assert list(first[1]) == [10_000, 20_000, 30_000]  # grid 1e-4
    assert VALUES_CACHE.get((dataset_id, first[0], "histogram")) is not None
    api.upload(ds["id"], [9.0, 7.0])
    with Session(db_engine) as session:
        hist = load_histogram(session, dataset_id=dataset_id)
    assert hist is not None and hist[0] == first[0] + 1
    assert list(hist[1]) == [70_000, 90_000] and list(hist[2]) == [1, 1]
    with Session(db_engine) as session:
        assert load_histogram(session, dataset_id=uuid.UUID(api.dataset()["id"])) is None


def test_upload_checks_the_key_before_reading_the_body(
    api: Api, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = api.dataset()
    viewer = api.key("viewer", ds["id"])
    # A body over the limit would give 413 if it were read before the key is checked.
    monkeypatch.setattr(client.app.state.settings, "max_upload_bytes", 10)  # type: ignore[attr-defined]
    r = client.put(f"/v1/datasets/{ds['id']}/values", content=b"x" * 100, headers=viewer)
    assert r.status_code == 403
    r = client.put(f"/v1/datasets/{ds['id']}/values", content=b"x" * 100)
    assert r.status_code == 401
