"""Release workers keep the memory a run frees (glibc ``mallopt``), so a run does not fault
its DP rows in again: measured in page faults, not time (no timed unit tests)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import app.runtime.worker as w
    from app.mechanisms import GridHistogram, get_mechanism

    kept = w.keep_freed_memory() if sys.argv[1] == "keep" else None
    w.warm_up()  # what a worker does before its first claim
    rng = np.random.default_rng(5)
    cells = np.unique(rng.integers(0, 2**22, 400_000))
    hist = GridHistogram(
        cells=cells.astype(np.int64), counts=np.ones(cells.size, np.int64), grid_points=2**22
    )
    mech = get_mechanism("jointexp")
    quantiles = [k / 100 for k in range(1, 100)]
    mech.run_grid(hist, quantiles, epsilon=1.0, delta=None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        mech.run_grid(hist, quantiles, epsilon=1.0, delta=None)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4
    print(kept, faults)
    """
)


def _faults(mode: str) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_a_worker_reuses_the_memory_its_runs_free() -> None:
    kept, faults = _faults("keep")
    assert kept == "True"
    # Each run allocates ~40 MB of rows (~10^4 pages); kept memory is reused without faults.
    assert faults < 300, faults


def test_a_server_app_freezes_its_startup_objects_and_a_test_app_does_not(
    database_url: str,
) -> None:
    """``dpquant serve`` builds its apps with ``create_server_app``: after startup the
    long-lived objects are frozen out of the collector's full passes (``gc.freeze``), which
    took ~100 ms each in a server process. Apps built for tests leave the collector alone."""
    import gc

    from fastapi.testclient import TestClient

    from app.api.factory import create_app

    from .conftest import make_settings

    gc.unfreeze()
    with TestClient(create_app(make_settings(database_url))):
        assert gc.get_freeze_count() == 0
    server_app = create_app(make_settings(database_url))
    server_app.state.freeze_gc = True  # what create_server_app sets
    try:
        with TestClient(server_app):
            assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
