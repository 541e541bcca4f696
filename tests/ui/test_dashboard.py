"""The dashboard at /ui/ in a real browser, for each role (issue 11, item 1)."""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live import LiveServer
from tests.ui.conftest import Seed, Watched

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TIMEOUT = 15_000  # ms


def sample(n: int = 400, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [min(100.0, max(0.0, round(rng.gauss(48, 14), 1))) for _ in range(n)]


def sign_in(w: Watched, key: str) -> None:
    page = w.page
    page.goto("/ui/")
    page.wait_for_selector("body[data-ready=true]", timeout=TIMEOUT)
    page.get_by_test_id("api-key").fill(key)
    page.get_by_test_id("sign-in").click()
    try:
        page.wait_for_selector("body[data-role]", state="attached", timeout=TIMEOUT)
    except Exception:
        raise AssertionError(
            f"sign-in failed: {page.locator('#error').inner_text()!r} {w.console_errors}"
        ) from None
    page.get_by_test_id("budget-remaining").filter(has_text=re.compile(r"\d")).wait_for(
        timeout=TIMEOUT
    )


def select(w: Watched, name: str) -> None:
    w.page.get_by_test_id("dataset-row").filter(has_text=name).get_by_role("button").click()
    w.page.wait_for_selector(f"#ds-title:text-is('{name}')", timeout=TIMEOUT)
    w.page.get_by_test_id("budget-remaining").filter(has_text=re.compile(r"\d")).wait_for(
        timeout=TIMEOUT
    )


def key_never_leaves_the_header(w: Watched, key: str) -> None:
    assert key not in w.page.url
    for request in w.requests:
        assert key not in request.url, request.url
    assert w.page.evaluate("sessionStorage.getItem('dpquant.apiKey')") == key
    assert w.page.evaluate("localStorage.length") == 0
    assert key not in w.page.content()  # the input is cleared after sign-in


def screenshot(w: Watched, role: str) -> None:
    """Always taken (proves it works); copied to docs/ when DPQUANT_UPDATE_SCREENSHOTS=1."""
    w.page.wait_for_timeout(300)
    out = Path(os.environ.get("PYTEST_TMPDIR", "/tmp")) / f"dashboard-{role}.png"
    w.page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 10_000
    if os.environ.get("DPQUANT_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(out, DOCS / f"dashboard-{role}.png")


def test_viewer_sees_budget_chart_and_releases_but_cannot_query(
    watched: Watched, seed: Seed
) -> None:
    ds = seed.dataset(values=sample(), epsilon="2", description="Viewer scenario")
    for eps in ("0.1", "0.25", "0.5"):
        seed.release(ds["id"], epsilon=eps, method="indexp")
    viewer = seed.key("viewer", ds["id"])
    sign_in(watched, viewer)
    page = watched.page
    assert page.get_by_test_id("dataset-row").count() == 1  # scoped: sees only its dataset
    assert (
        page.get_by_test_id("budget-remaining").inner_text()
        == seed.budget(ds["id"])["remaining"]["epsilon"]
        == "1.15"
    )
    assert page.get_by_test_id("release-row").count() == 3
    assert page.get_by_test_id("budget-chart").locator("path.spent").count() == 1
    assert page.locator("#cdf-chart path.cdf").count() == 1
    assert page.locator("#cdf-chart .points circle").count() == 5
    assert "releases" in page.locator("#budget-source").inner_text()
    assert not page.get_by_test_id("query-submit").is_visible()
    assert not page.locator("#admin-section").is_visible()
    assert not page.locator("#ledger-section").is_visible()
    screenshot(watched, "viewer")
    # Polling is conditional: after the poll interval the budget is asked with If-None-Match
    # and answered 304 while nothing changed.
    with page.expect_response(
        lambda r: r.url.endswith(f"/v1/datasets/{ds['id']}/budget") and r.status == 304,
        timeout=TIMEOUT,
    ) as info:
        pass
    assert info.value.request.headers.get("if-none-match", "").startswith('"')
    # A release made elsewhere shows up through the poll, with the new remaining figure.
    seed.release(ds["id"], epsilon="0.15", method="indexp")
    page.get_by_test_id("release-row").nth(3).wait_for(timeout=TIMEOUT)
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('1')", timeout=TIMEOUT)
    key_never_leaves_the_header(watched, viewer)
    watched.assert_clean()


def test_analyst_asks_for_quantiles_and_sees_the_release(watched: Watched, seed: Seed) -> None:
    ds = seed.dataset(values=sample(seed=11), epsilon="1", description="Analyst scenario")
    seed.release(ds["id"], epsilon="0.2", method="jointexp")
    analyst = seed.key("analyst", ds["id"])
    sign_in(watched, analyst)
    page = watched.page
    assert page.get_by_test_id("budget-remaining").inner_text() == "0.8"
    assert page.get_by_test_id("release-row").count() == 1
    assert not page.locator("#admin-section").is_visible()
    page.get_by_test_id("query-quantiles").fill("0.1, 0.5, 0.9")
    page.get_by_test_id("query-epsilon").fill("0.3")
    page.get_by_label("Method", exact=True).select_option("jointexp")
    with page.expect_response(
        lambda r: r.url.endswith(f"/v1/datasets/{ds['id']}/quantiles")
    ) as created:
        page.get_by_test_id("query-submit").click()
    response = created.value
    assert response.status in (201, 202)
    sent = response.request.headers
    assert sent.get("idempotency-key") and sent.get("prefer") == "respond-async"
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('0.5')", timeout=TIMEOUT)
    rows = page.get_by_test_id("release-row")
    rows.nth(1).wait_for(timeout=TIMEOUT)
    newest = rows.first
    assert newest.get_attribute("data-status") == "done"
    assert "0.1, 0.5, 0.9" in newest.inner_text()
    assert page.locator("#cdf-chart .points circle").count() == 3
    assert "Released:" in page.locator("#query-result").inner_text()
    # the stored release is what the page shows
    release_id = newest.get_attribute("data-id")
    stored = httpx.get(
        f"{seed.http.base_url}/v1/releases/{release_id}",
        headers={"Authorization": f"Bearer {analyst}"},
    ).json()
    assert ", ".join(str(e) for e in stored["estimates"]) in newest.inner_text()
    # the error bars: one per estimate on the chart, and in the data's units under them
    assert page.locator("#cdf-chart [data-testid=error-bar]").count() == 3
    bars = ", ".join(f"[{b['low']}, {b['high']}]" for b in stored["intervals"])
    assert newest.get_by_test_id("release-bars").inner_text() == f"90 % bars: {bars}"
    screenshot(watched, "analyst")
    key_never_leaves_the_header(watched, analyst)
    watched.assert_clean()


def test_admin_sees_ledger_and_keys_and_creates_dataset_key_and_grant(
    watched: Watched, seed: Seed, live_server: LiveServer
) -> None:
    admin_key = live_server.admin_key
    ds = seed.dataset(values=sample(seed=3), epsilon="1.5", description="Admin scenario")
    for eps in ("0.1", "0.2", "0.3"):
        seed.release(ds["id"], epsilon=eps, method="indexp")
    sign_in(watched, admin_key)
    page = watched.page
    select(watched, ds["name"])
    assert page.get_by_test_id("budget-remaining").inner_text() == "0.9"
    assert page.locator("#ledger-body tr").count() == 4  # one grant, three debits
    assert "ledger" in page.locator("#budget-source").inner_text()
    assert page.get_by_test_id("budget-chart").locator("path.granted").count() == 1
    assert page.locator("#keys-body tr").count() >= 1
    # grant
    page.get_by_label("Reason").fill("quarterly top-up")
    page.locator("#grant-epsilon").fill("0.5")
    page.get_by_role("button", name="Grant").click()
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('1.4')", timeout=TIMEOUT)
    assert page.locator("#ledger-body tr").count() == 5
    # create a dataset
    name = "ui-created-" + ds["id"][:6]
    page.locator("#ds-name").fill(name)
    page.locator("#ds-epsilon").fill("3")
    page.get_by_role("button", name="Create dataset").click()
    page.wait_for_selector(f"#ds-title:text-is('{name}')", timeout=TIMEOUT)
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('3')", timeout=TIMEOUT)
    # create a key scoped to it: the secret is shown once and works
    page.locator("#key-role").select_option("viewer")
    page.locator("#key-scope").select_option(label=name)
    page.locator("#key-name").fill("ui-made viewer")
    page.get_by_role("button", name="Create key").click()
    page.wait_for_selector("#new-key:not([hidden])", timeout=TIMEOUT)
    secret = page.locator("#new-key-value").input_value()
    assert secret.startswith("dpq_")
    me = httpx.get(
        f"{seed.http.base_url}/v1/keys/me", headers={"Authorization": f"Bearer {secret}"}
    )
    assert me.status_code == 200 and me.json()["role"] == "viewer"
    page.get_by_role("button", name="Hide").click()
    assert page.locator("#new-key-value").input_value() == ""
    # upload a CSV into the new dataset through the file input
    page.locator("#upload-file").set_input_files(
        files=[{"name": "v.csv", "mimeType": "text/csv", "buffer": b"x,y\n1,5\n2,150\n3,7\n"}]
    )
    page.locator("#upload-column").fill("y")
    page.get_by_role("button", name="Upload").click()
    page.wait_for_selector("#ds-facts dd:text-is('3 (1 outside bounds)')", timeout=TIMEOUT)
    # revoke the key made above (confirmed in the dialog); it stops working
    page.once("dialog", lambda dialog: dialog.accept())
    prefix = secret[:12]
    page.get_by_role("button", name=f"Revoke key {prefix}").click()
    page.wait_for_selector(
        f"#keys-body tr:has-text('{prefix}') td:nth-child(7):not(:empty)", timeout=TIMEOUT
    )
    gone = httpx.get(
        f"{seed.http.base_url}/v1/keys/me", headers={"Authorization": f"Bearer {secret}"}
    )
    assert gone.status_code == 401
    select(watched, ds["name"])
    screenshot(watched, "admin")
    key_never_leaves_the_header(watched, admin_key)
    watched.assert_clean()


def test_unknown_key_is_refused_and_nothing_is_kept(watched: Watched) -> None:
    page = watched.page
    page.goto("/ui/")
    page.wait_for_selector("body[data-ready=true]", timeout=TIMEOUT)
    page.get_by_test_id("api-key").fill("dpq_not-a-key-" + "x" * 30)
    page.get_by_test_id("api-key").press("Enter")  # keyboard submit
    page.wait_for_selector("#error:not([hidden])", timeout=TIMEOUT)
    assert "unknown, revoked or expired key or token" in page.locator("#error").inner_text()
    assert page.evaluate("sessionStorage.length") == 0
    assert "dpq_" not in page.url
    # the 401 itself is the only console message (Chromium reports failed loads)
    assert all("401" in m for m in watched.console_errors), watched.console_errors
    assert watched.page_errors == [] and watched.blocked == []


def test_dashboard_headers_forbid_external_origins(live_server: LiveServer) -> None:
    for path in ("/ui/", "/ui/js/app.js", "/ui/style.css"):
        r = httpx.get(live_server.base_url + path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "http" not in csp and "*" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(live_server.base_url + "/ui").status_code == 308
    html = httpx.get(live_server.base_url + "/ui/").text
    assert "//" not in re.sub(r"<!--.*?-->", "", html, flags=re.S).replace("http://www.w3", "")


def _testids(html: str) -> set[str]:
    return set(re.findall(r'data-testid="([a-z-]+)"', html))


def test_contract_hooks_are_present(live_server: LiveServer) -> None:
    html = httpx.get(live_server.base_url + "/ui/").text
    script = httpx.get(live_server.base_url + "/ui/js/app.js").text
    static = _testids(html)
    dynamic: set[str] = set(re.findall(r'"data-testid", "([a-z-]+)"', script))
    hooks: set[Any] = static | dynamic
    for hook in (
        "api-key",
        "sign-in",
        "dataset-row",
        "budget-remaining",
        "budget-chart",
        "release-row",
        "query-quantiles",
        "query-epsilon",
        "query-submit",
    ):
        assert hook in hooks, hook


def test_a_zcdp_table_shows_its_guarantee_curve_and_releases_left(
    watched: Watched, seed: Seed
) -> None:
    ds = seed.dataset(values=sample(seed=5), epsilon="1", delta="0.000001", accounting="zcdp")
    for _ in range(4):
        seed.release(ds["id"], epsilon="0.1", method="jointexp")
    viewer = seed.key("viewer", ds["id"])
    sign_in(watched, viewer)
    page = watched.page
    budget = seed.budget(ds["id"])
    assert budget["accounting"] == "zcdp"
    page.get_by_test_id("guarantee-epsilon").filter(has_text=re.compile(r"\d")).wait_for(
        timeout=TIMEOUT
    )
    assert page.get_by_test_id("guarantee-epsilon").inner_text() == budget["guarantee"]["epsilon"]
    assert "ρ granted" in page.get_by_test_id("rho-figures").inner_text()
    left = budget["releases_left"]["count"]
    assert left == 15  # 19 releases of JointExp at 0.1 in (1, 1e-6), 4 spent
    assert page.get_by_test_id("releases-left").inner_text().endswith(f": {left}")
    chart = page.get_by_test_id("budget-chart")
    assert chart.locator("path.spent").count() == 1
    assert "guarantee" in chart.locator("desc").text_content()
    # the browser's conversion of the rho spent (the curve's last point) is the server's
    last = page.evaluate("async () => (await import('/ui/js/charts.js')).zcdpEpsilon(0.005, 1e-6)")
    assert abs(last - float(budget["guarantee"]["epsilon"])) <= 1e-9
    assert "zCDP" in page.locator("#ds-facts").inner_text()
    watched.assert_clean()


def test_an_analyst_signs_in_with_an_openid_connect_token(
    watched: Watched, seed: Seed, oidc_issuer: Any
) -> None:
    ds = seed.dataset(values=sample(seed=9), epsilon="1", description="Token scenario")
    token = oidc_issuer.token(
        sub="dana@example.org", dpquant_role="analyst", dpquant_datasets=[ds["id"]]
    )
    sign_in(watched, token)
    page = watched.page
    assert "dana@example.org" in page.locator("#whoami").inner_text()
    assert page.get_by_test_id("dataset-row").count() == 1
    page.get_by_test_id("query-quantiles").fill("0.5")
    page.get_by_test_id("query-epsilon").fill("0.2")
    with page.expect_response(lambda r: r.url.endswith(f"/v1/datasets/{ds['id']}/quantiles")):
        page.get_by_test_id("query-submit").click()
    page.wait_for_selector("[data-testid=budget-remaining]:text-is('0.8')", timeout=TIMEOUT)
    key_never_leaves_the_header(watched, token)
    watched.assert_clean()


def test_the_query_form_explains_itself(watched: Watched, seed: Seed) -> None:
    """Percentages work; bad quantiles and unaffordable queries say why; the scope shows the
    dataset's name; "Signed in as" appears once."""
    ds = seed.dataset(values=sample(seed=13), epsilon="0.5", description="Form scenario")
    analyst = seed.key("analyst", ds["id"])
    sign_in(watched, analyst)
    page = watched.page
    assert ds["name"] in page.locator("#who-scope").inner_text()
    assert page.get_by_text("Signed in as").count() == 1
    quantiles, epsilon = (
        page.get_by_test_id("query-quantiles"),
        page.get_by_test_id("query-epsilon"),
    )
    quantiles.fill("90%, 50%")
    page.wait_for_selector("#quote[data-invalid=true]", timeout=TIMEOUT)
    assert "strictly increasing" in page.locator("#quote").inner_text()
    assert page.get_by_test_id("query-submit").is_disabled()
    epsilon.fill("2")
    quantiles.fill("50%, 90%")
    reason = page.get_by_test_id("unaffordable-reason")
    reason.wait_for(timeout=TIMEOUT)
    assert "ε 0.5" in reason.inner_text() and "about 0.5" in reason.inner_text()
    assert page.get_by_test_id("query-submit").is_disabled()
    screenshot(watched, "unaffordable")
    epsilon.fill("0.2")
    page.wait_for_selector("[data-testid=query-submit]:not([disabled])", timeout=TIMEOUT)
    # the quote tells the bound on the average from the bound on one estimate (the bars')
    page.wait_for_selector("#quote:has-text('any one estimate ≤')", timeout=TIMEOUT)
    method = page.locator("#query-method").input_value()
    body = {"quantiles": [0.5, 0.9], "epsilon": "0.2", "method": method}
    quoted = seed.http.post(f"/v1/datasets/{ds['id']}/quote", json=body).json()["expected_error"]
    shown = re.search(r"any one estimate ≤ ([0-9.e+]+)", page.locator("#quote").inner_text())
    assert shown is not None
    assert float(shown[1]) == pytest.approx(max(r["bound90_each"] for r in quoted), rel=5e-3)
    with page.expect_response(lambda r: r.url.endswith(f"/v1/datasets/{ds['id']}/quantiles")):
        page.get_by_test_id("query-submit").click()
    page.wait_for_selector("#query-result:has-text('Released:')", timeout=TIMEOUT)
    stored = seed.http.get(f"/v1/datasets/{ds['id']}/releases").json()["items"][0]
    assert stored["quantiles"] == [0.5, 0.9]
    watched.assert_clean()


def test_admin_forms_take_size_hint_accounting_caps_expiry_and_parquet(
    watched: Watched, seed: Seed, live_server: LiveServer, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    seed.dataset(values=sample(seed=31), epsilon="1")  # something to show after sign-in
    sign_in(watched, live_server.admin_key)
    page = watched.page
    name = "ui-forms-" + os.urandom(3).hex()
    page.locator("#ds-name").fill(name)
    page.locator("#ds-epsilon").fill("2")
    page.locator("#ds-delta").fill("0.000001")
    page.locator("#ds-size-hint").fill("1000")
    page.locator("#ds-neighbors").select_option("add_remove")
    page.locator("#ds-accounting").select_option("zcdp")
    page.get_by_role("button", name="Create dataset").click()
    page.wait_for_selector(f"#ds-title:text-is('{name}')", timeout=TIMEOUT)
    made = next(d for d in seed.http.get("/v1/datasets").json()["items"] if d["name"] == name)
    assert (made["size_hint"], made["accounting"], made["neighbors"]) == (
        1000,
        "zcdp",
        "add_remove",
    )
    assert "zCDP" in page.locator("#ds-facts").inner_text()
    # a Parquet upload through the form
    file = tmp_path / "values.parquet"
    pq.write_table(pa.table({"v": [float(x) for x in range(1, 60)]}), file)
    page.locator("#upload-file").set_input_files(str(file))
    page.locator("#upload-column").fill("v")
    with page.expect_response(
        lambda r: r.url.endswith(f"/v1/datasets/{made['id']}/values?column=v")
    ) as up:
        page.get_by_role("button", name="Upload").click()
    assert up.value.status == 200
    assert seed.http.get(f"/v1/datasets/{made['id']}").json()["n"] == 59
    # a key with caps and an expiry
    page.locator("#key-role").select_option("analyst")
    page.locator("#key-scope").select_option(made["id"])
    page.locator("#key-max-epsilon").fill("0.3")
    page.locator("#key-expires").fill("2031-01-31")
    with page.expect_response(
        lambda r: r.url.endswith("/v1/keys") and r.request.method == "POST"
    ) as created:
        page.get_by_role("button", name="Create key").click()
    key = created.value.json()
    assert (key["max_epsilon"], key["expires_at"][:10]) == ("0.3", "2031-01-31")
    page.wait_for_selector(
        f"#keys-body tr:has-text('{key['prefix']}'):has-text('of 0.3')", timeout=TIMEOUT
    )
    watched.assert_clean()


def test_releases_show_expected_error_and_fit_a_phone(browser: Any, live_server: LiveServer,
                                                       seed: Seed) -> None:  # fmt: skip
    ds = seed.dataset(values=sample(seed=17), epsilon="1", description="Phone scenario")
    seed.release(ds["id"], epsilon="0.3", method="jointexp",
                 quantiles=[0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95])  # fmt: skip
    viewer = seed.key("viewer", ds["id"])
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  base_url=live_server.base_url)  # fmt: skip
    try:
        page = context.new_page()
        w = Watched(page)
        sign_in(w, viewer)
        row = page.get_by_test_id("release-row").first
        row.wait_for(timeout=TIMEOUT)
        assert "pts" in row.locator("td").last.inner_text()
        box = row.locator("td.estimates").bounding_box()
        assert box is not None and box["x"] + box["width"] <= 390 + 1
        screenshot(w, "phone")
    finally:
        context.close()


def test_a_release_can_be_explained_in_the_dashboard(watched: Watched, seed: Seed) -> None:
    ds = seed.dataset(values=sample(seed=21), epsilon="1", description="Explain scenario")
    seed.release(ds["id"], epsilon="0.2", method="jointexp")
    viewer = seed.key("viewer", ds["id"])
    sign_in(watched, viewer)
    page = watched.page
    page.get_by_test_id("explain").first.click()
    box = page.get_by_test_id("explanation")
    box.wait_for(timeout=TIMEOUT)
    text = box.inner_text()
    assert "jointexp" in text and "pure dp under swap" in text
    assert "[0, 100]" in text and "missed points" in text
    box.scroll_into_view_if_needed()
    screenshot(watched, "explain")
    watched.assert_clean()


def test_whole_numbers_get_a_grid_step_of_one(
    watched: Watched, seed: Seed, live_server: LiveServer
) -> None:
    seed.dataset(values=sample(seed=31), epsilon="1")  # something to show after sign-in
    sign_in(watched, live_server.admin_key)
    page = watched.page
    name = "ui-int-" + os.urandom(3).hex()
    page.locator("#ds-name").fill(name)
    page.locator("#ds-lower").fill("0")
    page.locator("#ds-upper").fill("2000")
    page.locator("#ds-integer").check()
    page.get_by_role("button", name="Create dataset").click()
    page.wait_for_selector(f"#ds-title:text-is('{name}')", timeout=TIMEOUT)
    made = next(d for d in seed.http.get("/v1/datasets").json()["items"] if d["name"] == name)
    assert made["granularity"] == 1.0 and made["columns"][0]["type"] == "integer"
    watched.assert_clean()


def test_an_analyst_asks_for_medians_by_group_and_sees_a_table_and_small_multiples(
    watched: Watched, seed: Seed
) -> None:
    columns = [
        {"name": "income", "type": "numeric", "lower": 0, "upper": 100, "granularity": 0.1},
        {"name": "region", "type": "categorical", "keys": ["north", "south", "east"]},
    ]
    made = seed.http.post(
        "/v1/datasets", json={"name": "ui-g-" + str(random.random())[2:10], "columns": columns,
                              "epsilon": "3"}
    )  # fmt: skip
    assert made.status_code == 201, made.text
    ds = made.json()
    rng = random.Random(4)
    rows = [
        {
            "income": round(rng.gauss(25 if i % 2 else 75, 5), 1),
            "region": "north" if i % 2 else "south",
        }
        for i in range(800)
    ]
    r = seed.http.put(f"/v1/datasets/{ds['id']}/values", json=rows)
    assert r.status_code == 200, r.text
    analyst = seed.key("analyst", ds["id"])
    sign_in(watched, analyst)
    page = watched.page
    page.get_by_test_id("query-quantiles").fill("0.25, 0.5, 0.75")
    page.get_by_test_id("query-epsilon").fill("1")
    page.get_by_label("Method", exact=True).select_option("jointexp")
    page.get_by_test_id("query-group").select_option("region")
    assert page.get_by_test_id("query-keys").is_visible()
    assert "north" in (page.get_by_test_id("query-keys").get_attribute("placeholder") or "")
    page.wait_for_selector("#quote:has-text('by group size')", timeout=TIMEOUT)
    with page.expect_response(
        lambda r: r.url.endswith(f"/v1/datasets/{ds['id']}/quantiles")
    ) as created:
        page.get_by_test_id("query-submit").click()
    sent = created.value.request.post_data_json
    assert sent["group_by"] == "region" and "keys" not in sent  # the declared keys
    page.wait_for_selector("[data-testid=group-row] >> nth=2", timeout=TIMEOUT)
    groups = page.get_by_test_id("group-row")
    assert [groups.nth(i).locator("th").inner_text() for i in range(3)] == [
        "north",
        "south",
        "east",
    ]
    assert page.get_by_test_id("group-cdf").count() == 3
    assert page.locator("[data-testid=group-cdf] .points circle").count() == 9
    assert "3 groups by region" in page.locator("#query-result").inner_text()
    stored = seed.http.get(
        f"/v1/releases/{page.get_by_test_id('release-row').first.get_attribute('data-id')}"
    ).json()
    north = stored["groups"][0]["estimates"]
    assert groups.nth(0).locator("td").count() == 3
    assert float(groups.nth(0).locator("td").nth(1).inner_text()) == north[1]
    assert 15 < north[1] < 35
    # keys typed by the analyst: only those are answered
    page.get_by_test_id("query-keys").fill("south, atlantis")
    with page.expect_response(lambda r: r.url.endswith("/quantiles")) as again:
        page.get_by_test_id("query-submit").click()
    assert again.value.request.post_data_json["keys"] == ["south", "atlantis"]
    page.wait_for_selector("#groups-title:has-text('2 groups')", timeout=TIMEOUT)
    assert page.get_by_test_id("group-bar").count() == 0  # no size hint: no bars
    # a malformed size hint is named and nothing is sent; a good one gives south its bars
    assert page.get_by_test_id("query-hints").is_visible()
    page.get_by_test_id("query-hints").fill("south=many")
    page.wait_for_selector("#quote[data-invalid=true]", timeout=TIMEOUT)
    assert "size hints" in page.locator("#quote").inner_text()
    assert page.get_by_test_id("query-submit").is_disabled()
    page.get_by_test_id("query-hints").fill("south=400")
    page.wait_for_selector("#quote:has-text('south (hint 400 rows)')", timeout=TIMEOUT)
    with page.expect_response(lambda r: r.url.endswith("/quantiles")) as hinted:
        page.get_by_test_id("query-submit").click()
    assert hinted.value.request.post_data_json["size_hints"] == {"south": 400}
    page.wait_for_selector("[data-testid=group-bar] >> nth=2", timeout=TIMEOUT)
    made = seed.http.get(f"/v1/releases/{hinted.value.json()['id']}").json()
    south = made["groups"][0]
    assert south["key"] == "south" and len(south["intervals"]) == 3
    row = page.get_by_test_id("group-row").nth(0)
    assert row.get_by_test_id("group-bar").count() == 3
    assert page.get_by_test_id("group-row").nth(1).get_by_test_id("group-bar").count() == 0
    first = south["intervals"][0]
    assert f"{first['low']:g}" in row.locator("td").nth(0).inner_text()
    assert page.locator("[data-testid=group-cdf] >> nth=0").get_by_test_id("error-bar").count() == 3
    assert page.locator("[data-testid=group-cdf] >> nth=1").get_by_test_id("error-bar").count() == 0
    screenshot(watched, "grouped")
    watched.assert_clean()


def test_a_release_of_many_groups_shows_a_bounded_page_and_finds_a_group(
    watched: Watched, seed: Seed
) -> None:
    """300 keys: the table shows 200, the charts 24, and says so; the filter finds a key
    past the first page (and the charts follow it)."""
    columns = [
        {"name": "income", "type": "numeric", "lower": 0, "upper": 100, "granularity": 0.1},
        {"name": "region", "type": "categorical"},
    ]
    made = seed.http.post(
        "/v1/datasets", json={"name": "ui-many-" + str(random.random())[2:10],
                              "columns": columns, "epsilon": "3"}
    )  # fmt: skip
    assert made.status_code == 201, made.text
    ds = made.json()
    rows = [{"income": float(i % 100), "region": f"k-{i % 10}"} for i in range(500)]
    assert seed.http.put(f"/v1/datasets/{ds['id']}/values", json=rows).status_code == 200
    keys = [f"k-{i}" for i in range(300)]
    seed.release(ds["id"], quantiles=[0.5], epsilon="1", method="aq", group_by="region",
                 keys=keys)  # fmt: skip
    sign_in(watched, seed.key("viewer", ds["id"]))
    page = watched.page
    page.wait_for_selector("#groups-title:has-text('300 groups')", timeout=TIMEOUT)
    assert page.get_by_test_id("group-row").count() == 200
    assert page.get_by_test_id("group-cdf").count() == 24
    shown = page.get_by_test_id("groups-shown").inner_text()
    assert "300 groups" in shown and "first 200" in shown and "first 24" in shown
    page.get_by_test_id("groups-filter").fill("k-29")
    page.wait_for_selector("[data-testid=groups-shown]:has-text('11 of 300')", timeout=TIMEOUT)
    found = page.get_by_test_id("group-row")
    assert found.count() == 11  # k-29 and k-290 ... k-299
    assert {found.nth(i).locator("th").inner_text() for i in range(11)} == {
        "k-29",
        *(f"k-29{d}" for d in range(10)),
    }
    assert page.get_by_test_id("group-cdf").count() == 11
    watched.assert_clean()
