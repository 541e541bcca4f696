"""The committed OpenAPI document is current, and every route documents itself."""

from __future__ import annotations

import json
from pathlib import Path

from app.api.factory import create_app
from app.core.config import Settings
from app.runtime.cli import render_openapi

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "openapi" / "openapi.json"


def current() -> dict[str, object]:
    return create_app(Settings(database_url="postgresql://unused/unused")).openapi()


def test_committed_openapi_is_not_stale() -> None:
    assert COMMITTED.read_text() == render_openapi(current()), (
        "openapi/openapi.json is stale: run `dpquant openapi` (or `make openapi`)"
    )


def test_operation_ids_are_readable_and_unique() -> None:
    ids = [
        op["operationId"]
        for item in json.loads(COMMITTED.read_text())["paths"].values()
        for op in item.values()
    ]
    assert len(ids) == len(set(ids))
    assert "create_release" in ids and "get_budget" in ids
    for op_id in ids:
        assert op_id.replace("_", "").isalpha() and op_id.islower(), op_id


def test_every_v1_route_declares_its_response_and_error_models() -> None:
    doc = json.loads(COMMITTED.read_text())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            responses = op["responses"]
            ok = [s for s in responses if s.startswith("2")]
            assert ok, (method, path)
            if not path.startswith("/v1"):
                continue
            # keyed routes can refuse the key; public ones (GET /v1/methods) cannot
            required = ["401", "403", "503"] if op.get("security") else ["503"]
            if op.get("parameters") or op.get("requestBody"):
                required.append("422")
            for status in required:
                assert status in responses, (method, path, status)
                assert "ErrorBody" in json.dumps(responses[status]), (method, path, status)
            if "{" in path:
                assert "404" in responses, (method, path)
            if ok[0] != "204":
                assert "content" in responses[ok[0]], (method, path)
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
