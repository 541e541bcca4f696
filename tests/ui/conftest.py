"""Browser tests: a live dpquant server and Debian's Chromium driven by Playwright.

Chromium comes from the system (``apt-get install chromium``; ``.ci/run`` installs it), never
from Playwright's own download. Every page blocks requests to anything but the test server
and fails its test on a console error, a page error or an attempt to reach another origin.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from app.core.db import upgrade_database
from tests.live import LiveServer
from tests.oidc_issuer import AUDIENCE, LocalIssuer

ADMIN_KEY = "dpq_ui-admin-" + secrets.token_urlsafe(32)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def oidc_issuer() -> Iterator[LocalIssuer]:
    """A local OpenID Connect issuer the browser's server trusts (tokens beside keys)."""
    issuer = LocalIssuer()
    yield issuer
    issuer.close()


@pytest.fixture(scope="session")
def live_server(
    schema_factory: Callable[[], str], oidc_issuer: LocalIssuer
) -> Iterator[LiveServer]:
    """A dpquant server on 127.0.0.1 for the browser, on its own migrated schema."""
    url = schema_factory()
    upgrade_database(url)
    server = LiveServer(
        url, ADMIN_KEY, oidc_issuer=oidc_issuer.issuer, oidc_audience=AUDIENCE
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs it with apt-get)")
        pytest.skip("chromium not installed: apt-get install -y chromium")
    return path


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@dataclass
class Watched:
    """A page plus what it did wrong: console errors, page errors, foreign requests."""

    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.blocked == [], self.blocked


@pytest.fixture
def watched(browser: Any, live_server: LiveServer) -> Iterator[Watched]:
    """A fresh browser context whose network stops at the test server (network 'off')."""
    context = browser.new_context(
        viewport={"width": 1360, "height": 1000}, base_url=live_server.base_url
    )
    page = context.new_page()
    w = Watched(page)
    allowed = urlsplit(live_server.base_url).netloc

    def route(route: Any) -> None:
        parts = urlsplit(route.request.url)
        if parts.scheme in ("http", "https") and parts.netloc != allowed:
            w.blocked.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", route)
    page.on("console", lambda m: w.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: w.page_errors.append(str(e)))
    page.on("request", lambda r: w.requests.append(r))
    yield w
    context.close()


class Seed:
    """Scenario data made through the HTTP API with the admin key."""

    def __init__(self, server: LiveServer) -> None:
        self.http = httpx.Client(
            base_url=server.base_url,
            headers={"Authorization": f"Bearer {server.admin_key}"},
            timeout=30,
        )

    def dataset(self, *, values: list[float] | None = None, **body: Any) -> dict[str, Any]:
        payload = {
            "name": "ui-" + uuid.uuid4().hex[:8],
            "lower": 0,
            "upper": 100,
            "epsilon": "1",
            **body,
        }
        r = self.http.post("/v1/datasets", json=payload)
        assert r.status_code == 201, r.text
        ds: dict[str, Any] = r.json()
        if values is not None:
            r = self.http.put(f"/v1/datasets/{ds['id']}/values", json=values)
            assert r.status_code == 200, r.text
        return ds

    def key(self, role: str, dataset_id: str | None = None) -> str:
        body: dict[str, Any] = {"role": role, "name": f"ui {role}"}
        if dataset_id:
            body["dataset_id"] = dataset_id
        r = self.http.post("/v1/keys", json=body)
        assert r.status_code == 201, r.text
        key: str = r.json()["key"]
        return key

    def release(self, dataset_id: str, **body: Any) -> dict[str, Any]:
        payload = {"quantiles": [0.1, 0.25, 0.5, 0.75, 0.9], "epsilon": "0.1", **body}
        r = self.http.post(f"/v1/datasets/{dataset_id}/quantiles", json=payload)
        assert r.status_code in (200, 201), r.text
        out: dict[str, Any] = r.json()
        return out

    def budget(self, dataset_id: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/datasets/{dataset_id}/budget")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@pytest.fixture(scope="session")
def seed(live_server: LiveServer) -> Iterator[Seed]:
    s = Seed(live_server)
    yield s
    s.http.close()
