"""/docs and /redoc render with the network off (issue 11, item 2)."""

from __future__ import annotations

import httpx

from tests.live import LiveServer
from tests.ui.conftest import Watched


def test_swagger_ui_renders_the_operations_offline(watched: Watched) -> None:
    page = watched.page
    page.goto("/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() >= 12
    assert page.get_by_text("/v1/datasets/{dataset_id}/quantiles").first.is_visible()
    watched.assert_clean()  # nothing tried to reach another origin


def test_redoc_renders_offline(watched: Watched) -> None:
    page = watched.page
    page.goto("/redoc")
    heading = page.locator("h2", has_text="Release differentially private quantiles")
    heading.first.wait_for(timeout=20_000)
    assert page.locator("h2").count() >= 12
    watched.assert_clean()


def test_docs_pages_reference_only_this_server(live_server: LiveServer) -> None:
    for path in ("/docs", "/redoc"):
        html = httpx.get(live_server.base_url + path).text
        assert "cdn." not in html and "googleapis" not in html and "https://" not in html, path
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        r = httpx.get(f"{live_server.base_url}/docs-static/{asset}")
        assert r.status_code == 200 and len(r.content) > 100_000, asset
        assert b"cdn.redoc.ly" not in r.content, asset


def test_docs_pages_carry_the_dashboards_security_headers(live_server: LiveServer) -> None:
    """Issue 28: /docs and /redoc had none of /ui/'s headers. Now they forbid framing,
    sniffing and referrers, and their CSP allows scripts from this origin and the pages' own
    inline start-up scripts by hash only (the rendering tests above see no violation)."""
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/docs-static/swagger-ui.css"):
        r = httpx.get(live_server.base_url + path)
        assert r.status_code == 200, path
        assert r.headers["x-frame-options"] == "DENY", path
        assert r.headers["x-content-type-options"] == "nosniff", path
        assert r.headers["referrer-policy"] == "no-referrer", path
        policy = dict(
            part.strip().split(" ", 1) for part in r.headers["content-security-policy"].split(";")
        )
        assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'", path
        sources = policy["script-src"].split()
        assert sources[0] == "'self'", path
        assert all(s.startswith("'sha256-") for s in sources[1:]), path
