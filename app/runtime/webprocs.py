"""Several web processes on one port, each with its own ``SO_REUSEPORT`` listening socket.

uvicorn's ``--workers N`` shares one listening socket between its processes. A process that
wakes up accepts every connection waiting in the queue, so a client that opens its
keep-alive connections in a burst (a dashboard backend's pool, a load balancer, the
benchmark) lands them all on one process while the others idle: measured here, 16
connections opened at once went to one of two processes, which then bounded the
single-dataset release rate. With one socket per process and ``SO_REUSEPORT`` (Linux), the
kernel spreads new connections over the processes by their address hash instead.

:func:`run_web_processes` starts ``n`` processes (spawned, each running the FastAPI app in
uvicorn on its own socket), restarts one that dies, and on SIGTERM/SIGINT stops them all
gracefully (SIGTERM: uvicorn finishes the requests in flight). Where ``SO_REUSEPORT`` does
not exist, :func:`reuseport_available` is False and the caller uses uvicorn's own workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import sys
import time
from multiprocessing.process import BaseProcess
from types import FrameType

logger = logging.getLogger(__name__)

#: A process that dies sooner than this after its start counts as a failed start.
STARTUP_S = 10.0
#: Failed starts in a row after which the supervisor gives up (e.g. the port is taken).
MAX_FAILED_STARTS = 3


def reuseport_available() -> bool:
    """True where ``SO_REUSEPORT`` balances connections between sockets (Linux)."""
    return hasattr(socket, "SO_REUSEPORT") and sys.platform.startswith("linux")


def _bound_socket(host: str, port: int, *, reuseport: bool) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEADDR`` (and ``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEADDR`` and ``SO_REUSEPORT`` set."""
    return _bound_socket(host, port, reuseport=True)


def claim_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` *without* ``SO_REUSEPORT``: it fails with
    EADDRINUSE while any server listens there (a group of ``SO_REUSEPORT`` sockets
    included, which another one could otherwise join and take a share of the connections).
    ``SO_REUSEADDR`` lets it reuse a port whose old connections are in TIME_WAIT."""
    return _bound_socket(host, port, reuseport=False)


def web_process(host: str, port: int, log_level: str, keepalive_s: int) -> None:
    """Entry point of one web process: its own listening socket, the app in uvicorn."""
    import uvicorn

    sock = reuseport_socket(host, port)
    sock.listen(2048)
    config = uvicorn.Config(
        "app.api.factory:create_server_app",
        factory=True,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=keepalive_s,
    )
    uvicorn.Server(config).run(sockets=[sock])


class _Stop:
    requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def run_web_processes(
    host: str, port: int, processes: int, log_level: str, keepalive_s: int
) -> int:
    """Run ``processes`` web processes until SIGTERM/SIGINT; returns an exit status.

    The supervisor keeps a bound (never listening) ``SO_REUSEPORT`` socket on the port for
    its whole life: it fails at once if another program holds the port, and no other
    program can join the port's group while the service runs.
    """
    guard = reuseport_socket(host, port)  # raises OSError if the port is taken
    ctx = multiprocessing.get_context("spawn")
    stop = _Stop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

    def start(i: int) -> tuple[BaseProcess, float]:
        proc = ctx.Process(
            target=web_process,
            args=(host, port, log_level, keepalive_s),
            name=f"dpquant-web-{i}",
        )
        proc.start()
        return proc, time.monotonic()

    procs = [start(i) for i in range(processes)]
    failed_starts = 0
    status = 0
    try:
        while not stop.requested:
            for i, (proc, started) in enumerate(procs):
                if proc.is_alive():
                    continue
                quick = time.monotonic() - started < STARTUP_S
                failed_starts = failed_starts + 1 if quick else 0
                logger.warning(
                    "web process %d exited with status %s; %s",
                    i,
                    proc.exitcode,
                    "giving up" if failed_starts >= MAX_FAILED_STARTS else "restarting it",
                )
                if failed_starts >= MAX_FAILED_STARTS:
                    stop.requested = True
                    status = 1
                    break
                procs[i] = start(i)
            time.sleep(0.2)
    finally:
        for proc, _ in procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn shuts down gracefully
        deadline = time.monotonic() + 30.0
        for proc, _ in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        guard.close()
    return status
