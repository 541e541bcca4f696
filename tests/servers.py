"""One way to run and wait for a server in tests: a free port, an ASGI app served by uvicorn
in a thread (ready when uvicorn says it has started), and one readiness loop for servers
started as processes (``dpquant serve``): waits on conditions, never a fixed sleep."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import httpx


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ThreadedServer:
    """``app`` served by uvicorn in a daemon thread on a free port of 127.0.0.1.

    ``config`` overrides uvicorn's settings (defaults: ``log_level="warning"``,
    ``lifespan="on"``). :meth:`start` returns once uvicorn has started (lifespan done,
    socket bound) and raises if the thread dies or the timeout passes first; use it as a
    context manager to stop it on exit.
    """

    def __init__(self, app: Any, **config: Any) -> None:
        import uvicorn

        self.port = free_port()
        options: dict[str, Any] = {"log_level": "warning", "lifespan": "on"} | config
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, **options)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server exited during startup")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def first_answer(
    url: str,
    *,
    alive: Callable[[], bool] = lambda: True,
    accept: Callable[[httpx.Response | None], bool] = lambda r: r is not None,
    timeout: float = 90.0,
    interval: float = 0.1,
) -> httpx.Response:
    """GET ``url`` until ``accept`` takes what it answered (any response, by default).

    ``accept`` sees None for a refused connection or a transport error, which are retried.
    Raises RuntimeError when ``alive()`` turns false (the server exited) or the timeout
    passes first.
    """
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise RuntimeError(f"the server exited before {url} answered")
        try:
            r: httpx.Response | None = httpx.get(url, timeout=2.0)
        except httpx.HTTPError:
            r = None
        if accept(r):
            assert r is not None
            return r
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer in {timeout:.0f} s")
        time.sleep(interval)


def wait_until_ready(
    base_url: str,
    *,
    alive: Callable[[], bool] = lambda: True,
    timeout: float = 90.0,
    times: int = 1,
    also: Callable[[], bool] = lambda: True,
) -> None:
    """Until ``/readyz`` answers 200 ``times`` times in a row (a server with several web
    processes: each must be up) and ``also()`` holds."""
    streak = 0

    def ready(r: httpx.Response | None) -> bool:
        nonlocal streak
        streak = streak + 1 if r is not None and r.status_code == 200 else 0
        return streak >= times and also()

    first_answer(base_url + "/readyz", alive=alive, accept=ready, timeout=timeout)
