"""The release workers' values cache (issue 28): sized by DPQUANT_VALUES_CACHE_BYTES, and an
archived dataset's arrays dropped by every worker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, multiprocess

from app.api.factory import create_app
from app.core.db import upgrade_database
from app.datasets.service import ValuesCache
from tests.support import ApiBase, app_settings, auth, release_workers, wait_for

ADMIN_KEY = "dpq_cache-admin-" + uuid.uuid4().hex + uuid.uuid4().hex


def test_drop_dataset_forgets_only_that_datasets_arrays() -> None:
    cache = ValuesCache(max_bytes=10_000)
    a, b = uuid.uuid4(), uuid.uuid4()
    cache.put((a, 1, "histogram"), (np.zeros(10), np.zeros(10)))
    cache.put((a, 2, "histogram"), (np.zeros(20),))
    cache.put((b, 1, "histogram"), (np.zeros(30),))
    assert cache.nbytes == 8 * 70
    assert cache.drop_dataset(a) == 8 * 40
    assert cache.nbytes == 8 * 30
    assert cache.get((a, 1, "histogram")) is None and cache.get((b, 1, "histogram")) is not None
    cache.clear()
    assert cache.nbytes == 0 and cache.get((b, 1, "histogram")) is None


def _gauge(path: Path, name: str) -> float:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    value = registry.get_sample_value(name, {"process": "release_worker"})
    return 0.0 if value is None else value


def test_workers_take_the_cache_size_and_drop_an_archived_dataset(
    make_schema: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real workers with DPQUANT_VALUES_CACHE_BYTES = 5 MiB each (they kept 256 MiB
    whatever it said) hold a dataset's histogram after its release, and both drop it when the
    dataset is archived (they kept it until evicted)."""
    url = make_schema()
    upgrade_database(url)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    settings = app_settings(url, admin_key=ADMIN_KEY)
    with (
        release_workers(url, concurrency=2, values_cache_bytes=5 * 2**20),
        TestClient(create_app(settings), raise_server_exceptions=False) as client,
    ):
        api = ApiBase(client, auth(ADMIN_KEY), "cache")
        values = list(np.random.default_rng(3).normal(size=5000))
        ds = api.dataset(values=values, epsilon="10")["id"]
        # both workers up (livesum: one worker's 5 MiB each; 512 MiB before the fix)
        assert wait_for(
            lambda: _gauge(metrics_dir, "dpquant_values_cache_capacity_bytes") == 2 * 5 * 2**20,
            timeout=60,
        )
        for _ in range(4):  # enough runs that both workers are likely to have loaded it
            r = api.query(ds, epsilon="0.1")
            assert r.status_code == 201 and r.json()["status"] == "done", r.text
        held = wait_for(lambda: _gauge(metrics_dir, "dpquant_values_cache_bytes") or None)
        assert held > 0
        assert client.delete(f"/v1/datasets/{ds}", headers=api.admin).status_code == 204
        assert wait_for(
            lambda: _gauge(metrics_dir, "dpquant_values_cache_bytes") == 0.0, timeout=30
        )
