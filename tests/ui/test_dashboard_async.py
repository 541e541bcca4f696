"""The dashboard against the API as it will be after issue 10/async releases land.

The server under test does not have the quote endpoint or 202 answers yet, so the browser's
view of them is simulated at the network layer (Playwright routes): the OpenAPI document gains
the quote path, the quote answers, and the real (synchronous) release is presented as a 202
with a pending body that the dashboard must poll to done.
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

    def quantiles(route: Any) -> None:
        real = route.fetch()  # the server makes (and charges) the release now
        release = real.json()
        assert real.status == 201
        pending = {**release, "status": "pending", "estimates": None}
        route.fulfill(
            status=202,
            json=pending,
            headers={"Location": f"/v1/releases/{release['id']}"},
        )

    def release(route: Any) -> None:
        polls.append(route.request.headers.get("if-none-match", ""))
        if len(polls) == 1:
            real = route.fetch().json()
            route.fulfill(json={**real, "status": "pending", "estimates": None})
        else:
            route.continue_()

    page.route("**/openapi.json", openapi)
    page.route(re.compile(r".*/v1/datasets/[^/]+/quote$"), quote)
    page.route(re.compile(r".*/v1/datasets/[^/]+/quantiles$"), quantiles)
    page.route(re.compile(r".*/v1/releases/[^/?]+$"), release)

    sign_in(watched, analyst)
    page.get_by_test_id("query-epsilon").fill("0.3")
    page.wait_for_selector("#quote:not([hidden])", timeout=TIMEOUT)
    page.wait_for_selector("#quote dd:text-is('ε 0.3, δ 0')", timeout=TIMEOUT)
    assert "Quote (nothing spent yet)" in page.locator("#quote").inner_text()
    assert quotes and quotes[-1]["epsilon"] == "0.3"
    assert seed.budget(ds["id"])["spent"]["epsilon"] == "0"  # quoting spent nothing
    page.get_by_test_id("query-submit").click()
    page.wait_for_selector("[data-testid=release-row][data-status=done]", timeout=TIMEOUT)
    assert len(polls) >= 2  # pending once, then done
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('0.7')", timeout=TIMEOUT)
    assert "Released:" in page.locator("#query-result").inner_text()
    watched.assert_clean()
