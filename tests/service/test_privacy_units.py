"""Privacy units through the API: a dataset names the column that identifies a person and
bounds the rows each person contributes; uploads keep at most k rows per unit (across
appends), releases are calibrated for a unit of k rows, and no unit id or per-unit figure
reaches a non-admin.
"""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.codec.histogram import decode_histogram
from app.datasets.units import unit_hash

from .conftest import Api

CSV = {"content-type": "text/csv"}
#: A unit id planted in the data; it must never come back in any response.
PLANTED = "patient-7f3c9e0b-PLANTED"


def visits_csv(rows: list[tuple[str, float]], extra_column: bool = True) -> bytes:
    out = io.StringIO()
    out.write("visit_value,patient,site\n" if extra_column else "visit_value,patient\n")
    for unit, value in rows:
        out.write(f"{value!r},{unit}{',north' if extra_column else ''}\n")
    return out.getvalue().encode()


def patients(big_rows: int = 1500) -> list[tuple[str, float]]:
    """1,000 patients with one visit around 10, and one patient with ``big_rows`` visits at
    90 (the issue's example)."""
    rng = np.random.default_rng(11)
    rows = [(f"p{i}", float(round(v, 2))) for i, v in enumerate(rng.normal(10, 1, 1000))]
    rows += [(PLANTED, 90.0)] * big_rows
    return rows


def unit_dataset(api: Api, k: int, **extra: Any) -> dict[str, Any]:
    return api.dataset(
        lower=0.0,
        upper=100.0,
        epsilon="100",
        granularity=0.01,
        privacy_unit="patient",
        max_rows_per_unit=k,
        **extra,
    )


def put_csv(client: TestClient, api: Api, ds: str, body: bytes, *, append: bool = False) -> Any:
    call = client.post if append else client.put
    return call(
        f"/v1/datasets/{ds}/values?column=visit_value",
        content=body,
        headers={**api.admin, **CSV},
    )


@pytest.mark.parametrize("k", [1, 5])
def test_one_person_with_1500_visits_does_not_decide_the_median(
    api: Api, client: TestClient, k: int
) -> None:
    ds = unit_dataset(api, k)
    assert (ds["privacy_unit"], ds["max_rows_per_unit"]) == ("patient", k)
    r = put_csv(client, api, ds["id"], visits_csv(patients()))
    assert r.status_code == 200, r.text
    admin = r.json()
    assert admin["n"] == 1000 + k and admin["units"] == 1001
    assert admin["rows_dropped"] == 1500 - k
    close = 0
    for _ in range(10):
        rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp")
        assert rel.status_code == 201, rel.text
        close += abs(rel.json()["estimates"][0] - 10.0) <= 2.0
    assert close >= 9


def test_without_the_bound_the_same_person_moves_the_median(api: Api, client: TestClient) -> None:
    """Negative control: the same rows in a dataset without a privacy unit (each row its own
    unit) put the ε = 1 median outside 10 ± 2, where the bounded dataset keeps it: the one
    person decides it. (The exact law spreads it over the gap between the 1,000 visits
    around 10 and the 1,500 at 90, almost uniformly: P(> 20) is only ~0.91, P(> 12) > 0.999.)"""
    ds = api.dataset(lower=0.0, upper=100.0, epsilon="10", granularity=0.01)
    body = visits_csv(patients())
    r = client.put(
        f"/v1/datasets/{ds['id']}/values?column=visit_value",
        content=body,
        headers={**api.admin, **CSV},
    )
    assert r.status_code == 200, r.text
    far = 0
    for _ in range(5):
        rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp")
        assert rel.status_code == 201, rel.text
        far += rel.json()["estimates"][0] > 12.0
    assert far >= 4


def test_an_append_keeps_every_unit_at_k_rows(api: Api, client: TestClient) -> None:
    ds = unit_dataset(api, 2)
    rows = [("a", 10.0), ("a", 11.0), ("a", 12.0), ("b", 20.0)]
    r = put_csv(client, api, ds["id"], visits_csv(rows))
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (3, 2, 1)
    more = [("a", 13.0), ("b", 21.0), ("b", 22.0), ("c", 30.0)]
    r = put_csv(client, api, ds["id"], visits_csv(more), append=True)
    assert r.status_code == 200, r.text
    # a: already 2 (nothing more); b: 1 + 1 of 2; c: 1 new unit
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (5, 3, 3)
    # a replace starts the counts afresh
    r = put_csv(client, api, ds["id"], visits_csv(more))
    assert (r.json()["n"], r.json()["units"], r.json()["rows_dropped"]) == (4, 3, 0)


def test_the_kept_rows_are_a_uniform_choice(
    api: Api, client: TestClient, db_engine: Engine
) -> None:
    """One unit with rows at 0, 1, 2, 3 and k = 1: which row is kept is uniform (400 uploads
    would be slow; the stored histogram is read directly, 200 uploads, each value kept
    ~50 times, 5 standard deviations allowed)."""
    ds = unit_dataset(api, 1)
    seen = {v: 0 for v in (0.0, 1.0, 2.0, 3.0)}
    for _ in range(200):
        r = put_csv(client, api, ds["id"], visits_csv([("u", v) for v in seen]))
        assert r.status_code == 200, r.text
        assert r.json()["n"] == 1
        kept = _stored_value(db_engine, ds["id"])
        seen[kept] += 1
    for count in seen.values():
        assert abs(count - 50) <= 5 * (200 * 0.25 * 0.75) ** 0.5


def _stored_value(engine: Engine, ds: str) -> float:
    """The single stored value (grid step 0.01), decoded from the stored histogram."""
    with engine.connect() as conn:
        blob = conn.execute(
            text("SELECT data FROM dataset_data WHERE dataset_id = :id"), {"id": uuid.UUID(ds)}
        ).scalar_one()
    cells, counts = decode_histogram(bytes(blob))
    assert counts.tolist() == [1]
    return float(cells[0]) * 0.01


def test_bad_declarations_and_uploads_are_refused_by_name(api: Api, client: TestClient) -> None:
    body = {"name": f"u-{uuid.uuid4().hex[:8]}", "lower": 0, "upper": 1}
    r = client.post("/v1/datasets", json={**body, "max_rows_per_unit": 3}, headers=api.admin)
    assert r.status_code == 422 and "privacy_unit" in r.text
    for bad in (0, 10_001, 2.5, "x"):
        r = client.post(
            "/v1/datasets",
            json={**body, "privacy_unit": "p", "max_rows_per_unit": bad},
            headers=api.admin,
        )
        assert r.status_code == 422 and "max_rows_per_unit" in r.text, r.text
    ds = unit_dataset(api, 2)
    # the unit column missing from the header, an empty unit, other media types, histograms
    r = put_csv(client, api, ds["id"], b"visit_value\n1.0\n")
    assert r.status_code == 422 and "privacy_unit" in r.text
    r = put_csv(client, api, ds["id"], b"visit_value,patient\n1.0,\n")
    assert r.status_code == 422 and "row 1" in r.text
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
    assert r.status_code == 409 and r.json()["type"] == "privacy_unit_needs_rows"
    # nothing was stored
    assert client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()["n"] is None


def test_an_epsilon_too_small_per_row_is_refused_before_any_debit(
    api: Api, client: TestClient
) -> None:
    ds = unit_dataset(api, 10_000)
    r = put_csv(client, api, ds["id"], visits_csv([("a", 1.0), ("b", 2.0)]))
    assert r.status_code == 200, r.text
    before = api.budget(ds["id"])
    r = api.query(ds["id"], quantiles=[0.5], epsilon="0.0001", method="jointexp")
    assert r.status_code == 422 and "epsilon" in r.text
    assert api.budget(ds["id"]) == before


def test_unit_ids_and_per_unit_figures_reach_no_reader(
    api: Api, client: TestClient, db_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ds = unit_dataset(api, 3)
    bad = put_csv(client, api, ds["id"], visits_csv([(PLANTED, 1.0)]) + b"oops,PLANTED2\n")
    assert bad.status_code == 422 and "row 2" in bad.text and "PLANTED" not in bad.text
    r = put_csv(client, api, ds["id"], visits_csv(patients(40)))
    assert r.status_code == 200, r.text
    admin_view = r.text
    _, viewer = api.new_key("viewer", ds["id"])
    _, analyst = api.new_key("analyst", ds["id"])
    rel = api.query(ds["id"], headers=analyst, quantiles=[0.5], epsilon="1", method="jointexp")
    assert rel.status_code == 201, rel.text
    seen = [admin_view, rel.text]
    for headers in (viewer, analyst):
        for path in (
            f"/v1/datasets/{ds['id']}",
            "/v1/datasets",
            f"/v1/datasets/{ds['id']}/budget",
            f"/v1/datasets/{ds['id']}/ledger",
            f"/v1/releases/{rel.json()['id']}",
        ):
            got = client.get(path, headers=headers)
            seen.append(got.text)
            if path == f"/v1/datasets/{ds['id']}":
                body = got.json()
                assert "rows_dropped" not in body and "units" not in body
    seen.append(client.get("/metrics", headers=api.admin).text)
    seen.append(caplog.text)
    with db_engine.connect() as conn:
        key = conn.execute(
            text("SELECT unit_key FROM dataset WHERE id = :id"), {"id": uuid.UUID(ds["id"])}
        ).scalar_one()
        stored = {
            bytes(h)
            for h in conn.execute(
                text("SELECT unit_hash FROM dataset_unit WHERE dataset_id = :id"),
                {"id": uuid.UUID(ds["id"])},
            ).scalars()
        }
    hashed = unit_hash(bytes(key), PLANTED)
    assert hashed in stored  # what is kept is the keyed hash, never the id
    digest = hashed.hex()
    for page in seen:
        assert PLANTED not in page and "PLANTED" not in page and digest not in page


def test_appends_after_releases_keep_the_bound_and_old_releases_read_the_same(
    api: Api, client: TestClient
) -> None:
    k = 5
    ds = unit_dataset(api, k)
    r = put_csv(client, api, ds["id"], visits_csv(patients()))
    assert r.status_code == 200, r.text
    first = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp")
    assert first.status_code == 201, first.text
    assert first.json()["data_version"] == 1
    before = client.get(f"/v1/releases/{first.json()['id']}", headers=api.admin)
    # the large unit sends 100 more rows, a new unit 3 (its rows are counted, up to k)
    more = [(PLANTED, 90.0)] * 100 + [("newcomer", 11.0)] * 3
    r = put_csv(client, api, ds["id"], visits_csv(more), append=True)
    assert r.status_code == 200, r.text
    assert (r.json()["n"], r.json()["units"]) == (1000 + k + 3, 1002)
    assert r.json()["rows_dropped"] == (1500 - k) + 100
    # a replace stays refused after the first release
    assert put_csv(client, api, ds["id"], visits_csv(more)).status_code == 409
    close = 0
    for _ in range(10):
        rel = api.query(ds["id"], quantiles=[0.5], epsilon="1", method="jointexp")
        assert rel.status_code == 201, rel.text
        assert rel.json()["data_version"] == 2
        close += abs(rel.json()["estimates"][0] - 10.0) <= 2.0
    assert close >= 9
    after = client.get(f"/v1/releases/{first.json()['id']}", headers=api.admin)
    assert after.status_code == 200 and after.content == before.content


def test_concurrent_appends_never_take_a_unit_past_k(api: Api, client: TestClient) -> None:
    """Eight appends at once, each giving one unit 3 rows, on k = 3: the dataset row lock
    serialises the bounding, so the unit keeps exactly 3 rows whatever the interleaving."""
    from concurrent.futures import ThreadPoolExecutor

    ds = unit_dataset(api, 3)
    assert put_csv(client, api, ds["id"], visits_csv([("other", 1.0)])).status_code == 200
    body = visits_csv([("busy", 50.0)] * 3)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: put_csv(client, api, ds["id"], body, append=True), range(8))
        )
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    final = client.get(f"/v1/datasets/{ds['id']}", headers=api.admin).json()
    assert (final["n"], final["units"], final["rows_dropped"]) == (4, 2, 21)
