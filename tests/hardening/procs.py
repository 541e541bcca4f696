"""Real processes for the hardening tests: a throwaway PostgreSQL cluster and a dpquant server.

``ThrowawayPostgres`` runs ``initdb``/``pg_ctl`` from the binaries bundled with the
``pgserver`` package on a free TCP port on 127.0.0.1, in a temporary directory, so a test
may stop and restart it at will. It never touches the machine's own PostgreSQL.

``DpquantServer`` runs ``dpquant serve --workers N`` (uvicorn with N worker processes) in
its own process group against a given database URL, and can kill it with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

from tests.servers import free_port, wait_until_ready

PG_BIN = None


def _pg_bin() -> Path:
    import pgserver._commands as commands

    return Path(commands.POSTGRES_BIN_PATH)


class ThrowawayPostgres:
    """A private PostgreSQL cluster on 127.0.0.1:<free port>; stop/start at will."""

    def __init__(self, max_connections: int = 200) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dpquant-throwaway-pg-"))
        self.pgdata = self.root / "pgdata"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self.max_connections = max_connections
        self.user: str | None = None
        if os.geteuid() == 0:  # initdb refuses root: run as pgserver's unprivileged user
            from pgserver.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            self.user = "pgserver"
            ensure_user_exists(self.user)
            ensure_prefix_permissions(self.root)
            ensure_folder_permissions(_pg_bin(), 0o055)
            ensure_folder_permissions(_pg_bin().parent / "lib", 0o044)
            shutil.chown(self.root, self.user, self.user)
            self.root.chmod(0o755)
        self._run(
            "initdb",
            "-D",
            str(self.pgdata),
            "--auth=trust",
            "--encoding=utf8",
            "-U",
            "postgres",
        )
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, exe: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [str(_pg_bin() / exe), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
            timeout=timeout,
        )

    def start(self) -> None:
        opts = (
            f"-p {self.port} -h 127.0.0.1 -k {self.root} "
            f"-c max_connections={self.max_connections} -c fsync=off"
        )
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", opts, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "stop")

    def is_running(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def destroy(self) -> None:
        try:
            if (self.pgdata / "postmaster.pid").exists():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class DpquantServer:
    """``dpquant serve`` with N workers on 127.0.0.1 in its own process group."""

    def __init__(self, database_url: str, admin_key: str, *, workers: int = 2, **env: str) -> None:
        self.database_url = database_url
        self.admin_key = admin_key
        self.workers = workers
        self.env = env
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.logfile = Path(tempfile.mkstemp(prefix="dpquant-server-", suffix=".log")[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        env = dict(os.environ)
        env.update(
            {
                "DPQUANT_DATABASE_URL": self.database_url,
                "DPQUANT_BOOTSTRAP_ADMIN_KEY": self.admin_key,
                "DPQUANT_LOG_LEVEL": "WARNING",
                **self.env,
            }
        )
        with self.logfile.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.runtime.cli",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    str(self.workers),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc
        try:
            # every worker must be up: ask a few times, all must answer 200
            wait_until_ready(
                self.base_url,
                alive=lambda: proc.poll() is None,
                timeout=timeout,
                times=2 * self.workers,
                also=lambda: len(self.worker_pids()) >= self.workers,
            )
        except RuntimeError as e:
            raise RuntimeError(f"{e}; server log:\n{self.log_text()}") from None

    def _release_supervisor(self) -> psutil.Process | None:
        if self.proc is None:
            return None
        try:
            children = psutil.Process(self.proc.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return None
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "worker" in child.cmdline() and "app.runtime.cli" in child.cmdline():
                    return child
        return None

    def release_worker_pids(self) -> list[int]:
        """PIDs of the release worker supervisor and its worker processes."""
        supervisor = self._release_supervisor()
        if supervisor is None:
            return []
        try:
            return [supervisor.pid] + [c.pid for c in supervisor.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def worker_pids(self) -> list[int]:
        """PIDs of the uvicorn worker processes (children that hold the app)."""
        if self.proc is None:
            return []
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        release_workers = set(self.release_worker_pids())
        return [
            c.pid
            for c in children
            if c.pid not in release_workers and "multiprocessing" in " ".join(c.cmdline())
        ]

    def pid_with_local_port(self, port: int) -> int | None:
        """The server process that owns a TCP connection from local port ``port``."""
        if self.proc is None:
            return None
        procs = [psutil.Process(self.proc.pid)]
        procs += psutil.Process(self.proc.pid).children(recursive=True)
        for p in procs:
            try:
                for conn in p.net_connections(kind="tcp"):
                    if conn.laddr and conn.laddr.port == port:
                        return p.pid
            except psutil.Error:
                continue
        return None

    def kill(self) -> None:
        """SIGKILL the whole process group (master and workers)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        """Stop the server and delete its log file."""
        self.stop()
        self.logfile.unlink(missing_ok=True)

    def log_text(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def headers(self, key: str | None = None) -> dict[str, Any]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}


def migrate(url: str) -> None:
    """Apply the Alembic migrations to ``url`` (in-process)."""
    from app.core.db import upgrade_database

    upgrade_database(url)
