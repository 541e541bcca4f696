"""The dashboard's quote and asynchronous release flow.

The release is real: the dashboard sends ``Prefer: respond-async``, the server answers 202
with a pending release (issue 8) and the dashboard polls it to done. The quote endpoint
(issue 10) does not exist yet, so only it is simulated at the network layer (Playwright
routes): the OpenAPI document gains the quote path and the quote answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.ui.conftest import Seed, Watched
from tests.ui.test_dashboard import TIMEOUT, sample, sign_in


def test_quote_before_spending_and_async_release_polled_to_done(
    watched: Watched, seed: Seed
) -> None:
    ds = seed.dataset(values=sample(seed=5), epsilon="1", description="Async scenario")
    analyst = seed.key("analyst", ds["id"])
    page = watched.page
    quotes: list[dict[str, Any]] = []
    polls: list[str] = []

    def openapi(route: Any) -> None:
        doc = route.fetch().json()
        doc["paths"]["/v1/datasets/{dataset_id}/quote"] = {"post": {"responses": {}}}
        route.fulfill(json=doc)

    def quote(route: Any) -> None:
        body = json.loads(route.request.post_data)
        quotes.append(body)
        route.fulfill(
            json={
                "method": body["method"],
                "cost": {"epsilon": body["epsilon"], "delta": "0"},
                "remaining_after": {"epsilon": "0.7", "delta": "0"},
                "affordable": True,
                "expected_error": 1.25,
            }
        )

    accepted: list[dict[str, Any]] = []

    def on_response(response: Any) -> None:
        if re.search(r"/v1/datasets/[^/]+/quantiles$", response.url):
            accepted.append(
                {"status": response.status, "location": response.headers.get("location")}
            )
        elif re.search(r"/v1/releases/[^/?]+$", response.url):
            polls.append(response.request.headers.get("if-none-match", ""))

    page.route("**/openapi.json", openapi)
    page.route(re.compile(r".*/v1/datasets/[^/]+/quote$"), quote)
    page.on("response", on_response)

    sign_in(watched, analyst)
    page.get_by_test_id("query-epsilon").fill("0.3")
    page.wait_for_selector("#quote:not([hidden])", timeout=TIMEOUT)
    page.wait_for_selector("#quote dd:text-is('ε 0.3, δ 0')", timeout=TIMEOUT)
    assert "Quote (nothing spent yet)" in page.locator("#quote").inner_text()
    assert quotes and quotes[-1]["epsilon"] == "0.3"
    assert seed.budget(ds["id"])["spent"]["epsilon"] == "0"  # quoting spent nothing
    page.get_by_test_id("query-submit").click()
    page.wait_for_selector("[data-testid=release-row][data-status=done]", timeout=TIMEOUT)
    assert accepted and accepted[0]["status"] == 202  # paid, then run by a worker
    assert accepted[0]["location"].startswith("/v1/releases/")
    assert polls  # the dashboard polled the release until it was done
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('0.7')", timeout=TIMEOUT)
    assert "Released:" in page.locator("#query-result").inner_text()
    watched.assert_clean()
