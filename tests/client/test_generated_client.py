"""A client generated from openapi/openapi.json by openapi-python-client works (issue 11)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dpquant_generated"


def _generator() -> str:
    beside = Path(sys.executable).with_name("openapi-python-client")
    found = str(beside) if beside.exists() else shutil.which("openapi-python-client")
    if found is None:
        pytest.fail("openapi-python-client is not installed (it is in the test extra)")
    return found


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("generated")
    config = root / "config.yml"
    config.write_text(f"package_name_override: {PACKAGE}\npost_hooks: []\n")
    out = root / PACKAGE
    result = subprocess.run(
        [
            _generator(),
            "generate",
            "--path",
            str(ROOT / "openapi" / "openapi.json"),
            "--meta",
            "none",
            "--config",
            str(config),
            "--output-path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Unable to" not in result.stdout + result.stderr, result.stdout + result.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_creates_uploads_and_queries(generated: Any, server: LiveServer) -> None:
    g = generated
    create_dataset = importlib.import_module(f"{PACKAGE}.api.datasets.create_dataset")
    upload_values = importlib.import_module(f"{PACKAGE}.api.datasets.upload_values")
    get_budget = importlib.import_module(f"{PACKAGE}.api.budget.get_budget")
    create_release = importlib.import_module(f"{PACKAGE}.api.releases.create_release")
    models = importlib.import_module(f"{PACKAGE}.models")

    client = g.AuthenticatedClient(base_url=server.base_url, token=server.admin_key)
    body = models.DatasetCreate(
        name="generated-" + uuid.uuid4().hex[:8], lower=0.0, upper=100.0, epsilon="1"
    )
    created = create_dataset.sync_detailed(client=client, body=body)
    assert created.status_code == 201, created.content
    ds = created.parsed
    assert isinstance(ds, models.DatasetAdmin)

    values = [float(v) for v in range(1, 101)]
    uploaded = upload_values.sync_detailed(ds.id, client=client, body=values)
    assert uploaded.status_code == 200, uploaded.content
    assert isinstance(uploaded.parsed, models.DatasetAdmin) and uploaded.parsed.n == 100

    query = models.QuantileQuery(
        quantiles=[0.25, 0.5, 0.75], epsilon="0.25", method=models.QuantileQueryMethod.INDEXP
    )
    released = create_release.sync_detailed(ds.id, client=client, body=query)
    assert released.status_code == 201, released.content
    assert len(released.parsed.estimates) == 3

    budget = get_budget.sync_detailed(ds.id, client=client)
    assert budget.status_code == 200 and budget.parsed.remaining.epsilon == "0.75"
    assert budget.headers["etag"]
    again = get_budget.sync_detailed(ds.id, client=client, if_none_match=budget.headers["etag"])
    assert again.status_code == 304  # declared: the generated code accepts the header

    refused = create_release.sync_detailed(
        ds.id, client=client, body=models.QuantileQuery(quantiles=[0.5], epsilon="5")
    )
    assert refused.status_code == 409
