"""The ``dpquant`` command: create-key, migrate, openapi, experiments forwarding, serve."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.runtime import cli
from tests.servers import first_answer, free_port, wait_until_ready

from .conftest import ADMIN_KEY, auth


def test_create_key_prints_a_working_key_once(
    client: TestClient,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DPQUANT_DATABASE_URL", database_url)
    assert cli.main(["create-key", "--role", "viewer", "--name", "cli"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert key.startswith("dpq_") and "shown only once" in err
    assert key not in err
    assert client.get("/v1/datasets", headers=auth(key)).status_code == 200


def test_create_key_with_a_cap_and_an_expiry(
    client: TestClient,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DPQUANT_DATABASE_URL", database_url)
    argv = ["create-key", "--role", "analyst", "--max-epsilon", "0.25"]
    assert cli.main([*argv, "--expires-at", "2999-01-01T00:00:00+00:00"]) == 0
    key = capsys.readouterr().out.strip()
    me = client.get("/v1/keys/me", headers=auth(key)).json()["id"]
    listed = {k["id"]: k for k in client.get("/v1/keys", headers=auth(ADMIN_KEY)).json()["items"]}
    assert listed[me]["max_epsilon"] == "0.25"
    assert listed[me]["expires_at"].startswith("2999-01-01T00:00:00")
    for bad in (["--max-epsilon", "-1"], ["--expires-at", "2999-01-01T00:00:00"]):
        with pytest.raises(SystemExit):
            cli.main(["create-key", "--role", "viewer", *bad])


def test_create_key_rejects_an_unknown_dataset(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DPQUANT_DATABASE_URL", database_url)
    code = cli.main(
        ["create-key", "--role", "analyst", "--dataset", "00000000-0000-0000-0000-000000000000"]
    )
    assert code == 2
    assert "unknown dataset" in capsys.readouterr().err


def test_migrate_is_idempotent(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPQUANT_DATABASE_URL", database_url)
    assert cli.main(["migrate"]) == 0


def test_openapi_command_writes_the_committed_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    assert cli.main(["openapi", "--output", str(out)]) == 0
    committed = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
    assert out.read_text() == committed.read_text()


def test_experiments_forwards_all_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    module = types.ModuleType("app.experiments.cli")
    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app.experiments.cli", module)
    assert cli.main(["experiments", "run", "--serve", "-x"]) == 7
    assert seen == [["run", "--serve", "-x"]]


def test_experiments_missing_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "app.experiments.cli", None)
    assert cli.main(["experiments"]) == 2
    assert "experiments module is not available" in capsys.readouterr().err


def run_server(env: dict[str, str], port: int) -> tuple[httpx.Response, str]:
    """Start ``dpquant serve`` (2 workers), wait for /readyz, stop it; returns readyz, output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = first_answer(f"http://127.0.0.1:{port}/readyz", alive=lambda: proc.poll() is None)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/datasets").status_code == 401
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    return ready, output


def test_serve_with_two_workers_answers_health_and_readiness(database_url: str) -> None:
    port = free_port()
    # The session's bootstrap key: a server started without it would revoke it (issue 8).
    env = os.environ | {
        "DPQUANT_DATABASE_URL": database_url,
        "DPQUANT_LOG_LEVEL": "WARNING",
        "DPQUANT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    }
    ready, output = run_server(env, port)
    assert ready.status_code == 200 and ready.json()["migrations"] == "current"
    assert f"listening on http://127.0.0.1:{port}" in output
    assert "DPQUANT_BOOTSTRAP_ADMIN_KEY is set" in output
    assert "release workers: 2" in output


def test_serve_with_embedded_postgres_and_two_workers(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPQUANT_")}
    env |= {"DPQUANT_DATA_DIR": str(tmp_path / "state"), "DPQUANT_LOG_LEVEL": "WARNING"}
    ready, output = run_server(env, port)
    assert ready.status_code == 200, ready.text
    assert "embedded PostgreSQL" in output
    assert (tmp_path / "state" / "pgdata" / "PG_VERSION").is_file()
    assert "DPQUANT_BOOTSTRAP_ADMIN_KEY is not set" in output and "create-key" in output


def _server_env(database_url: str) -> dict[str, str]:
    """The session's database and bootstrap key (a server started without the key would
    revoke it, issue 8)."""
    return os.environ | {
        "DPQUANT_DATABASE_URL": database_url,
        "DPQUANT_LOG_LEVEL": "WARNING",
        "DPQUANT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    }


def _two_web_processes(port: int) -> list[str]:
    """``dpquant serve`` with two web processes and no release workers."""
    return [sys.executable, "-m", "app.runtime.cli", "serve", "--port", str(port), "--workers", "2",
            "--release-workers", "0"]  # fmt: skip


def _wait_until_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    """Wait (up to 90 s) until the server started as ``proc`` answers /readyz with 200."""
    wait_until_ready(f"http://127.0.0.1:{port}", alive=lambda: proc.poll() is None)


def test_a_burst_of_connections_is_spread_over_the_web_processes(database_url: str) -> None:
    """``--workers 2`` gives each web process its own SO_REUSEPORT socket: 16 keep-alive
    connections opened at once (a client's pool) land on both processes. With one shared
    socket the first process to wake accepted the whole burst and the other idled."""
    import psutil

    port = free_port()
    proc = subprocess.Popen(
        _two_web_processes(port),
        env=_server_env(database_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    conns: list[socket.socket] = []
    try:
        _wait_until_ready(proc, port)
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        for c in conns:
            c.sendall(request)
        for c in conns:
            assert c.recv(4096).startswith(b"HTTP/1.1 200")
        owners: dict[int, int] = {}
        for child in psutil.Process(proc.pid).children(recursive=True):
            held = [
                k
                for k in child.net_connections(kind="tcp")
                if k.status == psutil.CONN_ESTABLISHED and k.laddr and k.laddr.port == port
            ]
            if held:
                owners[child.pid] = len(held)
        assert sum(owners.values()) == 16, owners
        assert len(owners) == 2, f"one process took every connection: {owners}"
    finally:
        for c in conns:
            c.close()
        proc.terminate()
        proc.wait(timeout=60)


def _dashboard_poll_s() -> float:
    """The dashboard's poll interval, read from its script."""
    script = Path(cli.__file__).parents[1] / "api" / "ui" / "static" / "js" / "app.js"
    match = re.search(r"^const POLL_MS = (\d+);", script.read_text(), re.MULTILINE)
    assert match, "POLL_MS not found in app.js"
    return int(match.group(1)) / 1000


@pytest.mark.parametrize("web_processes", [1, 2])
def test_idle_connections_outlive_the_dashboards_poll(
    database_url: str, web_processes: int
) -> None:
    """A client that reuses its keep-alive connection after one poll interval finds it open.

    uvicorn's default keep-alive (5 s) equalled the dashboard's poll interval: the server
    closed idle connections just as clients reused them, and a request on such a connection
    failed with "Server disconnected without sending a response" (seen in CI). Both ways
    ``dpquant serve`` runs uvicorn (one process; SO_REUSEPORT processes) take
    ``DPQUANT_KEEPALIVE_S``.
    """
    port = free_port()
    command = [sys.executable, "-m", "app.runtime.cli", "serve", "--port", str(port),
               "--workers", str(web_processes), "--release-workers", "0"]  # fmt: skip
    proc = subprocess.Popen(
        command, env=_server_env(database_url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    conns: list[http.client.HTTPConnection] = []
    try:
        _wait_until_ready(proc, port)
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(4)]
        for c in conns:
            c.request("GET", "/healthz")
            assert c.getresponse().read() == b'{"status":"ok"}'
        sockets = [c.sock for c in conns]
        time.sleep(_dashboard_poll_s() + 1.5)
        for c, sock in zip(conns, sockets, strict=True):
            # http.client sends on the same socket; had the server closed it, the answer
            # would be RemoteDisconnected (or a reset) instead of a response.
            c.request("GET", "/healthz")
            assert c.getresponse().read() == b'{"status":"ok"}'
            assert c.sock is sock
    finally:
        for c in conns:
            c.close()
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_with_two_workers_on_a_taken_port_says_so_and_exits(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            _two_web_processes(port),
            env=_server_env(database_url),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
