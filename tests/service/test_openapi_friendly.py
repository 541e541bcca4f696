"""The OpenAPI document is friendly to client generators (issue 11, item 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.core.errors import ERROR_TYPES
from app.mechanisms import MECHANISMS
from tests.service.conftest import Api

ROOT = Path(__file__).resolve().parents[2]
DOC: dict[str, Any] = json.loads((ROOT / "openapi" / "openapi.json").read_text())


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(p, m, op) for p, item in DOC["paths"].items() for m, op in item.items()]


def test_every_request_body_has_one_content_type() -> None:
    for path, method, op in operations():
        if "requestBody" in op:
            assert len(op["requestBody"]["content"]) == 1, (method, path)
    for method in ("put", "post"):  # replace and append
        upload = DOC["paths"]["/v1/datasets/{dataset_id}/values"][method]["requestBody"]
        assert list(upload["content"]) == ["application/json"]
        assert upload["x-also-accepts"] == [
            "text/csv",
            "application/octet-stream",
            "application/vnd.apache.parquet",
        ]
    histogram = DOC["paths"]["/v1/datasets/{dataset_id}/histogram"]["put"]["requestBody"]
    assert list(histogram["content"]) == ["application/json"]
    assert histogram["x-also-accepts"] == ["application/octet-stream"]


def test_method_and_error_type_are_enums() -> None:
    schemas = DOC["components"]["schemas"]
    assert schemas["QuantileQuery"]["properties"]["method"]["enum"] == [*MECHANISMS, "auto"]
    assert schemas["ErrorBody"]["properties"]["type"]["enum"] == list(ERROR_TYPES)
    assert schemas["BudgetExhausted"]["properties"]["type"]["const"] == "budget_exhausted"


def test_every_error_type_the_code_raises_is_in_the_enum() -> None:
    """A new ``type`` in app/ must be added to ERROR_TYPES (generated clients parse it)."""
    found: set[str] = set()
    for file in (ROOT / "app").rglob("*.py"):
        if "mechanisms" in file.parts or "experiments" in file.parts:
            continue
        text = file.read_text()
        found |= set(re.findall(r"DpquantError\(\s*\d{3},\s*\"([a-z_]+)\"", text))
        found |= set(re.findall(r"\"type\": \"([a-z_]+)\"", text))
        found |= set(re.findall(r"_body\(\s*\"([a-z_]+)\"", text))
        found |= set(re.findall(r"\d{3}: \"([a-z_]+)\"", text))
    found -= {"string", "number", "integer", "array", "object", "boolean"}
    assert found, "the scan found nothing: update the patterns"
    assert found <= set(ERROR_TYPES), found - set(ERROR_TYPES)


def test_middleware_answers_are_declared() -> None:
    for path, method, op in operations():
        responses = op["responses"]
        if path.startswith("/v1"):
            assert "429" in responses, (method, path)
            assert "Retry-After" in responses["429"]["headers"]
        if "requestBody" in op:
            assert "413" in responses, (method, path)


def test_conditional_reads_declare_etag_and_if_none_match() -> None:
    conditional = {
        ("/v1/datasets/{dataset_id}/budget", "get"),
        ("/v1/releases/{release_id}", "get"),
        ("/v1/datasets/{dataset_id}/releases", "get"),
    }
    for path, method, op in operations():
        if "304" not in op["responses"]:
            continue
        conditional.discard((path, method))
        names = [p["name"] for p in op.get("parameters", [])]
        assert "If-None-Match" in names, (method, path)
        for status in ("200", "304"):
            assert "ETag" in op["responses"][status]["headers"], (method, path, status)
        assert "content" not in op["responses"]["304"]
    assert not conditional, conditional


def test_budget_figures_declare_their_plain_form() -> None:
    amount = DOC["components"]["schemas"]["AmountPublic"]["properties"]
    pattern = re.compile(amount["epsilon"]["pattern"])
    for ok in ("0", "5", "0.1", "0.0000001", "123.45"):
        assert pattern.match(ok), ok
    for bad in ("0E-12", "5.0", "5.000000000000", "1e-7", "-1", "00.1"):
        assert not pattern.match(bad), bad


def test_keys_me_says_who_is_calling(api: Api, client: TestClient) -> None:
    ds = api.dataset()
    for role in ("viewer", "analyst"):
        key_id, headers = api.new_key(role, ds["id"])
        r = client.get("/v1/keys/me", headers=headers)
        assert r.status_code == 200, r.text
        assert r.json() == {"id": key_id, "role": role, "dataset_id": ds["id"],
                            "datasets": None, "subject": None}  # fmt: skip
    me = client.get("/v1/keys/me", headers=api.admin).json()
    assert me["role"] == "admin" and me["dataset_id"] is None
    assert client.get("/v1/keys/me").status_code == 401
    # never a secret, hash or prefix
    assert set(me) == {"id", "role", "dataset_id", "datasets", "subject"}
