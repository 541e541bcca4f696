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
