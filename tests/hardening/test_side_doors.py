"""Issue 5, point 9: no raw data value leaks through logs, error bodies, headers or the API docs.

A real uvicorn (in a thread of this process, so failures can be injected) serves the app
with every logger at DEBUG — root, ``uvicorn.*`` (access log included), ``sqlalchemy.*``
(statements, parameters and result rows), ``app.*``. Values with a recognisable pattern are
uploaded in all three formats; then every endpoint and every error path is exercised with
every role, including injected mechanism, database and programming errors whose messages
quote a secret value. All response bodies, all headers, every log record (message and
traceback), the served and the committed OpenAPI documents are searched for the values in
decimal text, as little-endian float64 hex and as Python bytes escapes.

``DPQUANT_MIN_RELEASE_MS`` (release timing padding) is tested at the end.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from app.api.factory import create_app
from app.mechanisms import MECHANISMS, GridHistogram
from app.releases.runner import Claim, Job, RunFailed, run_job
from tests.servers import ThreadedServer

from .conftest import ADMIN, Api, report, settings_for

# Recognisable values; integer parts >= 600 cannot collide with timestamps' fields.
SECRETS = [613.371337, 742.424242, 877.077077, 912.345678, 698.765432, 755.555555]
LOGGERS = [
    "",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "uvicorn.asgi",
    "sqlalchemy",
    "sqlalchemy.engine",
    "sqlalchemy.engine.Engine",
    "sqlalchemy.pool",
    "sqlalchemy.orm",
    "app",
    "fastapi",
    "starlette",
]


def broken_indexp(boom: Any) -> Any:
    """IndExp with both entry points (raw array and grid) replaced by ``boom``."""
    return dataclasses.replace(MECHANISMS["indexp"], fn=boom, core=boom)


def patterns() -> list[str]:
    out: list[str] = []
    for v in SECRETS:
        raw = struct.pack("<d", v)
        out += [repr(v), f"{v:.4f}"[:-1], raw.hex(), repr(raw)[2:-1]]
        out.append(raw[::-1].hex())  # big-endian spelling too
    return out


PATTERNS = patterns()


def leaks(text: str) -> list[str]:
    return [p for p in PATTERNS if p in text]


@pytest.fixture
def live(hdb_url: str, hworkers: None) -> Iterator[tuple[str, Any]]:
    """(base URL, app) of a uvicorn server in a thread, all loggers at DEBUG."""
    app = create_app(
        settings_for(
            hdb_url,
            log_level="DEBUG",
            max_upload_bytes=100_000,
            max_body_bytes=200_000,
            rate_limit_per_minute=600,
            rate_limit_burst=150,
        )
    )
    with ThreadedServer(app, log_config=None, log_level="debug", access_log=True) as server:
        yield server.base_url, app


def test_no_data_value_in_logs_bodies_headers_or_docs(
    live: tuple[str, Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, app = live
    previous = {name: logging.getLogger(name).level for name in LOGGERS}
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    seen: list[tuple[str, str]] = []  # (where, text)
    calls = 0

    def record(label: str, r: httpx.Response) -> httpx.Response:
        nonlocal calls
        calls += 1
        seen.append((f"{label} body", r.text))
        seen.append((f"{label} headers", json.dumps(dict(r.headers))))
        return r

    try:
        with httpx.Client(base_url=base, timeout=60.0) as c:

            def call(label: str, method: str, path: str, **kw: Any) -> httpx.Response:
                return record(label, c.request(method, path, **kw))

            values = SECRETS * 40
            ds = call(
                "create",
                "POST",
                "/v1/datasets",
                json={
                    "name": "leak-" + uuid.uuid4().hex[:8],
                    "lower": 0,
                    "upper": 1000,
                    "epsilon": "100",
                    "delta": "0.5",
                    "granularity": 1.0,
                },
                headers=ADMIN,
            ).json()
            did = ds["id"]
            other = call(
                "create other",
                "POST",
                "/v1/datasets",
                json={"name": "leak-o-" + uuid.uuid4().hex[:8], "lower": 0, "upper": 1},
                headers=ADMIN,
            ).json()
            csv_text = "v,w\n" + "\n".join(f"{v},{v}" for v in values) + "\n"
            octet = np.asarray(values, dtype="<f8").tobytes()
            up = f"/v1/datasets/{did}/values"
            assert (
                call(
                    "upload csv",
                    "PUT",
                    up,
                    params={"column": "v"},
                    content=csv_text,
                    headers=ADMIN | {"content-type": "text/csv"},
                ).status_code
                == 200
            )
            assert (
                call(
                    "upload octet",
                    "PUT",
                    up,
                    content=octet,
                    headers=ADMIN | {"content-type": "application/octet-stream"},
                ).status_code
                == 200
            )
            assert call("upload json", "PUT", up, json=values, headers=ADMIN).status_code == 200
            # bad uploads quoting the values
            for label, content, ctype, params in [
                ("csv bad cell", "v\n613.371337\n742.424242x\n", "text/csv", {"column": "v"}),
                ("csv bad column", "v\n613.371337\n", "text/csv", {"column": "nosuchcol"}),
                ("csv unterminated", 'v\n"613.371337\n', "text/csv", {"column": "v"}),
                ("json string", '[613.371337, "742.424242"]', "application/json", {}),
                ("json nan", "[613.371337, NaN]", "application/json", {}),
                ("json huge", "[613.371337, 1e400]", "application/json", {}),
                ("json object", '{"613.371337": 742.424242}', "application/json", {}),
                ("json broken", "[613.371337, 742.42", "application/json", {}),
                ("octet odd", octet[:13], "application/octet-stream", {}),
                (
                    "octet nan",
                    octet[:8] + struct.pack("<d", float("nan")),
                    "application/octet-stream",
                    {},
                ),
                ("xml", "<v>613.371337</v>", "application/xml", {}),
            ]:
                r = call(
                    label,
                    "PUT",
                    up,
                    content=content,
                    params=params,
                    headers=ADMIN | {"content-type": ctype},
                )
                assert r.status_code < 500, (label, r.status_code)

            _, analyst = Api.__new__(Api), None  # placeholder for type checkers
            keys: dict[str, dict[str, str]] = {}
            for role, scope in (("analyst", did), ("viewer", did), ("analyst", other["id"])):
                r = call(
                    f"key {role}",
                    "POST",
                    "/v1/keys",
                    json={"role": role, "dataset_id": scope},
                    headers=ADMIN,
                )
                keys[f"{role}-{'own' if scope == did else 'other'}"] = {
                    "Authorization": f"Bearer {r.json()['key']}"
                }
            analyst = keys["analyst-own"]
            q = f"/v1/datasets/{did}/quantiles"
            release_ids: list[str] = []
            for name, mech in MECHANISMS.items():
                body: dict[str, Any] = {
                    "quantiles": [0.1, 0.5, 0.9],
                    "epsilon": "1",
                    "method": name,
                }
                if mech.requires_delta or mech.uses_delta:
                    body["delta"] = "0.000001"
                r = call(f"release {name}", "POST", q, json=body, headers=analyst)
                assert r.status_code == 201, (name, r.text)
                release_ids.append(r.json()["id"])
            idem = {"Idempotency-Key": "leak-1"}
            call(
                "idem",
                "POST",
                q,
                json={"quantiles": [0.5], "epsilon": "0.5", "method": "indexp"},
                headers=analyst | idem,
            )
            call(
                "idem replay",
                "POST",
                q,
                json={"quantiles": [0.5], "epsilon": "0.5", "method": "indexp"},
                headers=analyst | idem,
            )
            call(
                "idem conflict",
                "POST",
                q,
                json={"quantiles": [0.6], "epsilon": "0.5", "method": "indexp"},
                headers=analyst | idem,
            )
            for label, body in [
                ("over budget", {"quantiles": [0.5], "epsilon": "1000", "method": "indexp"}),
                ("bad quantiles", {"quantiles": [0.9, 0.1], "epsilon": "1"}),
                ("bad method", {"quantiles": [0.5], "epsilon": "1", "method": "no-such-method"}),
                ("bad epsilon", {"quantiles": [0.5], "epsilon": "-613.371337"}),
                ("unknown field", {"quantiles": [0.5], "epsilon": "1", "surprise": 1}),
                (
                    "delta where none",
                    {"quantiles": [0.5], "epsilon": "1", "delta": "0.5", "method": "indexp"},
                ),
            ]:
                r = call(label, "POST", q, json=body, headers=analyst)
                assert 400 <= r.status_code < 500, (label, r.text)
            call("frozen upload", "PUT", up, json=values, headers=ADMIN)

            # every read endpoint with every kind of caller
            reads = [
                "/v1/datasets",
                f"/v1/datasets/{did}",
                f"/v1/datasets/{did}/budget",
                f"/v1/datasets/{did}/releases",
                f"/v1/datasets/{did}/ledger",
                f"/v1/releases/{release_ids[0]}",
                "/v1/keys",
                f"/v1/datasets/{uuid.uuid4()}",
                f"/v1/releases/{uuid.uuid4()}",
                "/v1/datasets?cursor=notacursor",
                "/v1/datasets?limit=613",
                "/healthz",
                "/readyz",
                "/openapi.json",
                "/docs",
                "/nowhere/at-all",
            ]
            callers = {
                "admin": ADMIN,
                "none": {},
                "bad": {"Authorization": "Bearer dpq_613.371337"},
            } | keys
            for who, headers in callers.items():
                for path in reads:
                    r = call(f"GET {path} as {who}", "GET", path, headers=headers)
                    assert r.status_code < 500, (path, who, r.status_code)
                    if "etag" in r.headers:
                        r = call(
                            f"GET {path} 304",
                            "GET",
                            path,
                            headers=headers | {"If-None-Match": r.headers["etag"]},
                        )
            call(
                "grant",
                "POST",
                f"/v1/datasets/{did}/grants",
                json={"epsilon": "1", "reason": "leak test"},
                headers=ADMIN,
            )
            call("patch", "PATCH", f"/v1/datasets/{did}", headers=ADMIN)

            # limits: oversized upload and body (413), a key over its rate (429)
            many = json.dumps(SECRETS * 3000)  # ~ 300 KB of values
            r = call(
                "upload too large",
                "PUT",
                up,
                content=many,
                headers=ADMIN | {"content-type": "application/json"},
            )
            assert r.status_code == 413
            r = call(
                "body too large",
                "POST",
                "/v1/datasets",
                content='{"name": "x", "description": ' + json.dumps(many * 4) + "}",
                headers=ADMIN | {"content-type": "application/json"},
            )
            assert r.status_code == 413
            flood = keys["analyst-other"]
            for _ in range(200):
                r = call("flood", "GET", f"/v1/datasets/{other['id']}/budget", headers=flood)
                if r.status_code == 429:
                    break
            assert r.status_code == 429 and "retry-after" in r.headers

            # injected failures whose messages quote a data value
            secret_msg = f"value {SECRETS[0]!r} and {SECRETS[1]!r}"

            def boom(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(secret_msg)

            def db_down(*args: Any, **kwargs: Any) -> Any:
                raise OperationalError(
                    f"SELECT {secret_msg}", {"v": SECRETS[2]}, Exception(secret_msg)
                )

            def key_error(*args: Any, **kwargs: Any) -> Any:
                raise KeyError(secret_msg)

            with monkeypatch.context() as m:
                # Mechanisms run in the workers (issue 8): the text a worker logs for a
                # failed run is the RunFailed message, built from the class name only.
                m.setitem(
                    MECHANISMS,
                    "indexp",
                    broken_indexp(boom),
                )
                job = Job(
                    claim=Claim(uuid.uuid4(), uuid.uuid4(), 1),
                    method="indexp",
                    quantiles=[0.5],
                    epsilon=Decimal("0.1"),
                    delta=None,
                    lower=0.0,
                    upper=1000.0,
                    granularity=1.0,
                    neighbors="swap",
                    histogram=GridHistogram(
                        cells=np.array([int(v) for v in SECRETS[:3]], dtype=np.int64),
                        counts=np.ones(3, dtype=np.int64),
                        grid_points=1001,
                    ),
                )
                with pytest.raises(RunFailed) as failed:
                    run_job(job)
                logging.getLogger("dpquant.worker").error(
                    "release %s failed: %s (charged)", job.claim.release_id, failed.value
                )
                assert secret_msg not in str(failed.value)
            with monkeypatch.context() as m:
                m.setattr("app.releases.service._call_reserve", db_down)
                r = call(
                    "database failure",
                    "POST",
                    q,
                    json={"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"},
                    headers=analyst,
                )
                assert r.status_code == 503 and r.json()["type"] == "database_unavailable"
            with monkeypatch.context() as m:
                m.setattr("app.releases.service._call_reserve", key_error)
                r = call(
                    "programming error",
                    "POST",
                    q,
                    json={"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"},
                    headers=analyst,
                )
                assert r.status_code == 503 and r.json()["type"] == "internal_error"
                r = call("after programming error", "GET", "/healthz")
                assert r.status_code == 200  # the connection survived the error
    finally:
        for name, level in previous.items():
            logging.getLogger(name).setLevel(level)

    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    log_text = "\n".join(formatter.format(rec) for rec in caplog.records)
    seen.append(("logs", log_text))
    seen.append(("openapi (served)", json.dumps(app.openapi())))
    committed = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
    seen.append(("openapi (committed)", committed.read_text()))
    found = [(where, leaks(text)) for where, text in seen if leaks(text)]
    found += [
        (f"log {rec.name}", [*leaks(formatter.format(rec))[:1], formatter.format(rec)[:300]])
        for rec in caplog.records
        if leaks(formatter.format(rec))
    ][:8]
    loggers = sorted({rec.name for rec in caplog.records})
    report(
        "9 side doors",
        requests=calls,
        log_records=len(caplog.records),
        loggers=len(loggers),
        sql_records=sum(rec.name.startswith("sqlalchemy") for rec in caplog.records),
        access_records=sum(rec.name == "uvicorn.access" for rec in caplog.records),
        patterns=len(PATTERNS),
        leaks=len(found),
    )
    assert any(n.startswith("sqlalchemy.engine") for n in loggers), loggers
    assert "uvicorn.access" in loggers, loggers
    assert not found, json.dumps(found, indent=1)[:6000]


def test_min_release_ms_pads_release_timing(make_app: Callable[..., Any]) -> None:
    pad_ms = 400
    timings: dict[str, list[float]] = {}
    for label, setting in (("padded", pad_ms), ("unpadded", 0)):
        with make_app(min_release_ms=setting) as client:
            api = Api(client)
            ds = api.dataset(values=[float(v) for v in range(100)], epsilon="10")
            for i in range(3):
                t0 = time.perf_counter()
                r = api.query(ds["id"], method="indexp", epsilon="0.1", quantiles=[0.5 + i / 10])
                timings.setdefault(label, []).append(time.perf_counter() - t0)
                assert r.status_code == 201, r.text
    report(
        "9 min release ms",
        setting_ms=pad_ms,
        padded_min_ms=f"{1000 * min(timings['padded']):.0f}",
        unpadded_min_ms=f"{1000 * min(timings['unpadded']):.0f}",
    )
    assert min(timings["padded"]) >= pad_ms / 1000
    assert min(timings["unpadded"]) < pad_ms / 1000  # the padding is what makes it slow


def test_min_release_ms_also_pads_every_error_of_the_quantile_endpoint(
    make_app: Callable[..., Any],
) -> None:
    """A fast refusal must not be distinguishable from a slow release by its timing."""
    pad_ms = 300
    with make_app(min_release_ms=pad_ms) as client:
        api = Api(client)
        ds = api.dataset(values=[float(v) for v in range(100)], epsilon="0.2")
        outcomes: dict[int, float] = {}
        for body in (
            {"quantiles": [0.5], "epsilon": "0.1", "method": "indexp"},  # 201
            {"quantiles": [0.5], "epsilon": "5", "method": "indexp"},  # 409 budget
            {"quantiles": [0.9, 0.1], "epsilon": "0.1"},  # 422
        ):
            t0 = time.perf_counter()
            r = client.post(f"/v1/datasets/{ds['id']}/quantiles", json=body, headers=ADMIN)
            outcomes[r.status_code] = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = client.get(f"/v1/datasets/{ds['id']}/budget", headers=ADMIN)
        other = time.perf_counter() - t0
    report(
        "9 uniform quantile timing",
        setting_ms=pad_ms,
        **{f"status_{k}_ms": f"{1000 * v:.0f}" for k, v in sorted(outcomes.items())},
        budget_read_ms=f"{1000 * other:.0f}",
    )
    assert set(outcomes) == {201, 409, 422}
    assert all(v >= pad_ms / 1000 for v in outcomes.values()), outcomes
    assert other < pad_ms / 1000  # other endpoints are not slowed down
