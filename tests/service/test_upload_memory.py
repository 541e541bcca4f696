"""Issue 9 acceptance: a 3·10⁷-value octet-stream body (240 MB) in one request to a real
``dpquant serve`` (2 workers) raises no server process above 700 MB of peak RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.servers import free_port, wait_until_ready

from .conftest import ADMIN, ADMIN_KEY

N_VALUES = 30_000_000
RSS_LIMIT_MB = 700


def process_tree(pid: int) -> list[int]:
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            out.extend(process_tree(int(child)))
    return out


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def body(n: int) -> Iterator[bytes]:
    rng = np.random.default_rng(0)
    for start in range(0, n, 1 << 17):
        yield rng.uniform(-10, 110, min(1 << 17, n - start)).astype("<f8").tobytes()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_240_mb_streamed_upload_keeps_every_server_process_under_700_mb(
    database_url: str,
) -> None:
    port = free_port()
    env = dict(
        os.environ,
        DPQUANT_DATABASE_URL=database_url,
        DPQUANT_BOOTSTRAP_ADMIN_KEY=ADMIN_KEY,
        DPQUANT_LOG_LEVEL="WARNING",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, alive=lambda: proc.poll() is None, timeout=60)
        with httpx.Client(base_url=base, headers=ADMIN, timeout=300) as client:
            ds = client.post(
                "/v1/datasets", json={"name": f"mem-{port}", "lower": 0, "upper": 100}
            ).json()
            started = time.perf_counter()
            r = client.put(
                f"/v1/datasets/{ds['id']}/values",
                content=body(N_VALUES),
                headers={"content-type": "application/octet-stream"},
            )
            seconds = time.perf_counter() - started
            assert r.status_code == 200, r.text
            assert r.json()["n"] == N_VALUES
            assert r.json()["n_outside_bounds"] > 0
        peaks = {pid: peak_rss_mb(pid) for pid in process_tree(proc.pid)}
        assert len(peaks) >= 3  # supervisor + 2 workers
        assert max(peaks.values()) < RSS_LIMIT_MB, peaks
        print(f"\n[upload] 3e7 values in {seconds:.1f} s; peak RSS per process (MB): {peaks}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
