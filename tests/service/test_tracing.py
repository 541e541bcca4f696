"""OpenTelemetry traces: a release's web, reservation, queue, run and completion spans share
one trace id, and no span attribute carries n, a value, an estimate or a key. Run in a
subprocess (a tracer provider and the psycopg instrumentation are process-global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core import tracing

from .conftest import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[2]
SECRET = 777.125  # a data value planted 37 times: must appear in no span


def spans(make_schema: Callable[[], str]) -> list[dict[str, Any]]:
    url = make_schema()
    done = subprocess.run(
        [sys.executable, "-m", "tests.service.trace_probe", url, ADMIN_KEY, repr(SECRET)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DPQUANT_OTEL_ENDPOINT": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_release_is_one_trace_and_its_spans_carry_nothing_from_the_data(
    make_schema: Callable[[], str],
) -> None:
    found = spans(make_schema)
    release_id = found[0]["release_id"]
    mine = [s for s in found if s["attributes"].get("dpquant.release_id") == release_id]
    names = {s["name"] for s in mine}
    assert set(tracing.SPANS) <= names, names
    (trace_id,) = {s["trace_id"] for s in mine}
    # the request that paid for it: FastAPI's server span is the root of the same trace
    web = [s for s in found if s["trace_id"] == trace_id and s["parent"] is None]
    assert len(web) == 1 and "POST /v1/datasets/{dataset_id}/quantiles" in web[0]["name"]
    reserve = next(s for s in mine if s["name"] == "release.reserve")
    for name in ("release.queue", "release.run", "release.complete"):
        span = next(s for s in mine if s["name"] == name)
        assert span["parent"] == reserve["span_id"], name
    complete = next(s for s in mine if s["name"] == "release.complete")
    assert complete["attributes"]["dpquant.outcome"] == "done"
    run = next(s for s in mine if s["name"] == "release.run")
    assert run["attributes"]["dpquant.method"] == "jointexp"
    assert run["attributes"]["dpquant.quantiles"] == "2"
    # psycopg's statement spans are in the trace too (the reservation's call)
    assert any(s["trace_id"] == trace_id and "release_reserve" in s["attributes"].get(
        "db.statement", "") for s in found)  # fmt: skip
    estimates = [repr(e) for e in found[0]["estimates"]]
    for span in found:
        text = json.dumps(span["attributes"]) + span["name"]
        assert str(SECRET) not in text and "40" not in span["attributes"].values()
        assert ADMIN_KEY not in text and ADMIN_KEY[:16] not in text
        assert not any(e in text for e in estimates)
        assert not any(k.rsplit(".", 1)[-1] == "n" for k in span["attributes"])


def test_tracing_is_off_without_an_endpoint() -> None:
    assert not tracing.enabled()
    assert tracing.current_traceparent() is None
    assert tracing.context_of("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01") is None
