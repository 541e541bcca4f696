"""dpquant_client.AsyncClient against a live server: same flows, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from dpquant_client import AsyncClient, BudgetExhausted, NotFound

from tests.client.conftest import VALUES, name
from tests.live import LiveServer


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run`` in a thread of its own: Playwright's sync API, when its tests ran
    first in this process, keeps an event loop running in the main thread."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(scenario())).result()


def test_async_client_release_budget_and_errors(server: LiveServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.base_url, server.admin_key, backoff=0.01) as admin:
            ds = await admin.create_dataset(name(), lower=0, upper=250, epsilon="0.5")
            assert (await admin.upload(ds.id, VALUES)).n == len(VALUES)
            key = await admin.create_key("analyst", dataset_id=ds.id)
        async with AsyncClient(server.base_url, key.key, backoff=0.01) as analyst:
            assert (await analyst.me()).role == "analyst"
            release = await analyst.quantiles(ds.id, [0.5], epsilon="0.2", method="indexp")
            assert release.done and release.estimates is not None
            queued = await analyst.quantiles(ds.id, [0.1, 0.9], epsilon="0.2", wait=False)
            assert analyst.last_status in (201, 202)
            final = await analyst.wait(queued, timeout=60)
            assert final.done and final.estimates is not None and len(final.estimates) == 2
            budget = await analyst.budget(ds.id)
            assert budget.remaining.epsilon == Decimal("0.1")
            assert await analyst.budget(ds.id) == budget and analyst.last_status == 304
            with pytest.raises(BudgetExhausted) as info:
                await analyst.quantiles(ds.id, [0.5], epsilon="0.2")
            assert info.value.remaining_epsilon == Decimal("0.1")
            with pytest.raises(NotFound):
                await analyst.release("00000000-0000-0000-0000-000000000000")
            assert len(await analyst.releases(ds.id)) == 2

    run(scenario)


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.keys: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/quantiles"):
            self.keys.append(request.headers["idempotency-key"])
            if len(self.keys) == 1:
                await response.aread()
                raise httpx.ReadError("answer lost", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_async_client_retries_with_the_same_idempotency_key(server: LiveServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.base_url, server.admin_key, backoff=0.01) as admin:
            ds = await admin.create_dataset(name(), lower=0, upper=250, epsilon="1")
            await admin.upload(ds.id, VALUES)
            flaky = LoseFirstAnswer()
            async with AsyncClient(
                server.base_url, server.admin_key, backoff=0.01, transport=flaky
            ) as c:
                release = await c.quantiles(ds.id, [0.5], epsilon="0.3", method="indexp")
            assert len(flaky.keys) == 2 and len(set(flaky.keys)) == 1
            assert release.replayed
            assert (await admin.budget(ds.id)).spent.epsilon == Decimal("0.3")

    run(scenario)


def test_async_get_or_create_and_typed_methods(server: LiveServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.base_url, server.admin_key, backoff=0.01) as admin:
            title = name()
            made, again = await asyncio.gather(
                admin.get_or_create_dataset(title, lower=0, upper=250, epsilon="1"),
                admin.get_or_create_dataset(title, lower=0, upper=250, epsilon="1"),
            )
            assert made.id == again.id  # two concurrent callers, one dataset
            methods = await admin.methods()
            assert {m.name for m in methods} >= {"jointexp", "indexp", "aq"}
            assert all(m.guarantee in ("pure_dp", "approx_dp", "zcdp") for m in methods)

    run(scenario)


def test_async_grouped_release_with_size_hints(server: LiveServer, tmp_path: Path) -> None:
    csv = tmp_path / "rows.csv"
    csv.write_text("v,side\n" + "".join(
        f"{x},{'left' if i % 2 else 'right'}\n" for i, x in enumerate(VALUES)))  # fmt: skip

    async def scenario() -> None:
        async with AsyncClient(server.base_url, server.admin_key, backoff=0.01) as admin:
            ds = await admin.create_dataset(
                name(),
                epsilon="2",
                columns=[
                    {"name": "v", "type": "numeric", "lower": 0, "upper": 250, "granularity": 1},
                    {"name": "side", "type": "categorical", "keys": ["left", "right"]},
                ],
            )
            assert (await admin.upload(ds.id, path=csv)).n == len(VALUES)
            quote = await admin.quote(ds.id, [0.5], epsilon="1", group_by="side",
                                      size_hints={"right": 50})  # fmt: skip
            assert quote.group_error is not None and quote.group_error.by_key is not None
            assert [(k.key, k.size) for k in quote.group_error.by_key] == [("right", 50)]
            release = await admin.quantiles(ds.id, [0.25, 0.75], epsilon="1", group_by="side",
                                            size_hints={"right": 50})  # fmt: skip
            assert release.groups is not None
            left, right = release.groups
            assert left.intervals is None and left.expected_error is None
            assert right.intervals is not None and right.estimates is not None
            assert right.expected_error is not None and right.expected_error.size == 50
            for bar, estimate in zip(right.intervals, right.estimates, strict=True):
                assert bar.low <= estimate <= bar.high

    run(scenario)
