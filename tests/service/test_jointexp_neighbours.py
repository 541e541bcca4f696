"""JointExp on two neighbouring grid datasets: the service releases the exact law on both.

Issue 27: JointExp's linear draw (``_draw_block``) dropped every kernel factor deeper than
its decay table, however large the draw's scale made it, and the interval it dropped could
be the dominant one. On the pair below the release then never (or always) returned 1, on
both datasets, where the exact law gives it probability 0.3775 on one and 0.2689 on the
other; on related inputs such an event happens on one dataset and never on its neighbour,
which is not epsilon-DP for any delta below its probability.

The datasets: bounds [0, 2], granularity 1 (grid points 0, 1, 2), swap neighbours, counts
``X = (a, b, a - 1)`` with b odd and ``X' = (a, b + 1, a - 2)`` (one record moved from 2 to
1; both have ``n = 2a + b - 1``). The query: jointexp, quantile 0.5, epsilon 1. With one
quantile q = 1/2 the utility of a grid point y is ``-2 |pos(y) - n/2|`` (``pos(y)`` =
number of records <= y), the sensitivity is 2, ``c = epsilon / (2 * 2) = 1/4``, and every
grid point is a block of width one, so

    P(y) ∝ exp(-|pos(y) - n/2| / 2):

``P(1) = e^-1/2 / (1 + e^-1/2) = 0.3775`` on X, ``e^-1 / (1 + e^-1) = 0.2689`` on X',
``P(2) < e^-400`` on both. :func:`exact_law` computes it from this formula alone,
independently of the implementation.

Two tests per pair: many in-process draws on the histogram loaded from PostgreSQL exactly as
a release worker loads it (:func:`app.releases.runner.load_job`), tested against the exact
law; and real releases through the HTTP API (workers in their own processes).
"""

from __future__ import annotations

import collections
import functools
import math
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.codec.grid import grid_values
from app.core.pg import Link
from app.datasets import service as dataset_service
from app.ledger.service import mechanism_float
from app.mechanisms import MECHANISMS
from app.releases import runner
from app.releases.runner import Claim, Job, load_job
from tests.mechanisms.exact import chi_square_p
from tests.support import client_of, wait_for

from .conftest import ADMIN, Api, make_settings

EPSILON = 1.0
QUANTILES = [0.5]
#: (a, b): on both pairs the old code released 1 with probability 0 (first) or 1 (second).
PAIRS = [(853, 7273), (1673, 21051)]
#: In-process draws per dataset: ~0.5 ms each (2.5 s per dataset).
DRAWS = 10_000
#: Releases per dataset through the HTTP API. Under the exact law, no 1 among them has
#: probability 0.7311^200 < 1e-27 on X', and all of them 1 has 0.3775^200 < 1e-84 on X.
RELEASES = 200
#: Allowed distance of a count from its expectation, in binomial standard deviations.
SIGMAS = 5.0

OCTET = {"content-type": "application/octet-stream"}


def neighbour_counts(a: int, b: int) -> dict[str, tuple[int, int, int]]:
    """The counts on grid points 0, 1, 2 of X and of its neighbour X' (2 -> 1 moved)."""
    assert b % 2 == 1 and a >= 2
    return {"X": (a, b, a - 1), "X'": (a, b + 1, a - 2)}


def log_law(counts: tuple[int, ...], epsilon: float = EPSILON) -> dict[int, float]:
    """log P(estimate = grid point y) for one median by JointExp on a grid of unit blocks.

    ``P(y) ∝ exp(c * u(y))`` with ``u(y) = -2 |pos(y) - n/2|`` (one quantile: both gaps
    are ``|pos(y) - n/2|``), ``c = epsilon / (2 Δ)``, ``Δ = 2`` (swap); normalised in log
    space, so it stays finite where P(y) underflows.
    """
    n = sum(counts)
    c = epsilon / (2.0 * 2.0)
    logw = [-2.0 * c * abs(float(p) - n / 2.0) for p in np.cumsum(counts)]
    top = max(logw)
    log_z = top + math.log(sum(math.exp(v - top) for v in logw))
    return {y: v - log_z for y, v in enumerate(logw)}


def exact_law(counts: tuple[int, ...], epsilon: float = EPSILON) -> dict[int, float]:
    """P(estimate = grid point y): :func:`log_law` exponentiated (0.0 where it underflows)."""
    return {y: math.exp(v) for y, v in log_law(counts, epsilon).items()}


def within_binomial(count: int, draws: int, p: float) -> bool:
    """``count`` within SIGMAS standard deviations of Binomial(draws, p)'s mean."""
    return abs(count - draws * p) <= SIGMAS * math.sqrt(draws * p * (1.0 - p))


def goodness_of_fit(observed: dict[int, int], law: dict[int, float], draws: int) -> float:
    """Chi-square p-value of ``observed`` against ``law`` (cells with expected count < 5
    pooled; an outcome outside the law's support gives 0)."""
    counts: dict[object, int] = {y: k for y, k in observed.items()}
    probs: dict[object, float] = {y: p for y, p in law.items()}
    return chi_square_p(counts, probs, draws)


def test_the_reference_law_is_epsilon_dp_and_matches_the_issue() -> None:
    """Sanity of the reference: the two laws are those of the issue, and every outcome's
    probability ratio between X and X' (both ways, 2 included in log space) is <= e^eps."""
    for a, b in PAIRS:
        laws = {k: exact_law(v) for k, v in neighbour_counts(a, b).items()}
        assert laws["X"][1] == pytest.approx(math.exp(-0.5) / (1 + math.exp(-0.5)), rel=1e-12)
        assert laws["X'"][1] == pytest.approx(math.exp(-1.0) / (1 + math.exp(-1.0)), rel=1e-12)
        assert round(laws["X"][1], 4) == 0.3775 and round(laws["X'"][1], 4) == 0.2689
        assert laws["X"][2] < math.exp(-400) and laws["X'"][2] < math.exp(-400)
        logs = {k: log_law(v) for k, v in neighbour_counts(a, b).items()}
        for y in (0, 1, 2):
            assert abs(logs["X"][y] - logs["X'"][y]) <= EPSILON + 1e-12
            assert math.isclose(math.exp(logs["X"][y]), laws["X"][y], rel_tol=1e-12)


# --------------------------------------------------------------------------- datasets


@pytest.fixture(scope="module")
def module_api(app: FastAPI) -> Api:
    """Scenario helpers on the session app, for module-scoped datasets."""
    return Api(client_of(app))


@pytest.fixture(scope="module")
def datasets(module_api: Api) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    """For each pair (a, b): X and X' as datasets with values, bounds [0, 2], granularity 1,
    swap, a budget for every release below (uploaded as float64 records, not as a
    histogram: the service bins them on its grid)."""
    out: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for a, b in PAIRS:
        out[(a, b)] = {}
        for name, counts in neighbour_counts(a, b).items():
            ds = module_api.dataset(
                lower=0.0, upper=2.0, granularity=1.0, neighbors="swap", epsilon="1000"
            )
            body = np.repeat([0.0, 1.0, 2.0], counts).astype("<f8").tobytes()
            r = module_api.client.put(
                f"/v1/datasets/{ds['id']}/values", content=body, headers=ADMIN | OCTET
            )
            assert r.status_code == 200, r.text
            out[(a, b)][name] = ds | {"counts": counts}
    return out


# --------------------------------------------------------------------------- in-process


@pytest.fixture
def worker_link(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Link]:
    """A release worker's connection, with empty process caches: a histogram is read from
    PostgreSQL and decoded, not taken from what the upload left in this process."""
    monkeypatch.setattr(runner, "_kept", collections.OrderedDict())
    monkeypatch.setattr(
        dataset_service, "VALUES_CACHE", dataset_service.ValuesCache(max_bytes=1 << 20)
    )
    link = Link(database_url, make_settings(database_url))
    try:
        yield link
    finally:
        link.close()


def worker_job(link: Link, dataset_id: str) -> Job:
    """The job a worker would run for a jointexp median at EPSILON on the dataset: a claim
    carrying the columns the claiming statement reads (runner._CLAIM), then ``load_job``
    on the worker's connection, as app/runtime/worker.py calls it."""
    row = link.run(
        lambda conn: conn.execute(
            "SELECT id AS dataset_id, lower, upper, granularity, neighbors, archived_at,"
            " CASE WHEN n IS NOT NULL THEN data_version END AS data_version"
            " FROM dataset WHERE id = %s",
            (uuid.UUID(dataset_id),),
        ).fetchone()
    )
    assert row is not None
    columns = ("dataset_id", "lower", "upper", "granularity", "neighbors", "archived_at")
    params: dict[str, Any] = dict(zip((*columns, "data_version"), row, strict=True))
    params |= {"method": "jointexp", "quantiles": QUANTILES, "epsilon": Decimal(EPSILON)}
    params["delta"] = None
    claim = Claim(release_id=uuid.uuid4(), token=uuid.uuid4(), attempts=1, row=params)
    return link.run(functools.partial(load_job, claim=claim))


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_worker_grid_path_draws_the_exact_law_on_both_neighbours(
    a: int, b: int, datasets: dict[tuple[int, int], dict[str, dict[str, Any]]], worker_link: Link
) -> None:
    """DRAWS in-process runs of ``run_grid`` on each stored histogram (loaded as a worker
    loads it) fit the exact law (chi-square p >= 0.01, each frequency within 5 sigma, never
    2), and the frequencies' ratios between X and X' stay within e^eps.

    The old draw gave P(1) = 0 (a = 853) or 1 (a = 1673) on both datasets.
    """
    mech = MECHANISMS["jointexp"]
    freqs: dict[str, collections.Counter[int]] = {}
    for seed, (name, ds) in enumerate(datasets[(a, b)].items()):
        job = worker_job(worker_link, ds["id"])
        hist = job.histogram
        assert (job.lower, job.upper, job.granularity, job.neighbors) == (0.0, 2.0, 1.0, "swap")
        assert hist.grid_points == 3
        assert hist.cells.tolist() == [0, 1, 2] and hist.counts.tolist() == list(ds["counts"])
        rng = np.random.default_rng([a, b, seed])
        cells = [
            int(
                mech.run_grid(
                    hist,
                    job.quantiles,
                    epsilon=mechanism_float(job.epsilon),
                    delta=None,
                    neighbors=job.neighbors,
                    rng=rng,
                )[0]
            )
            for _ in range(DRAWS)
        ]
        # the released values are the grid points 0.0, 1.0, 2.0 (run_job's mapping)
        values = grid_values(np.asarray(cells), job.lower, job.granularity)
        freqs[name] = collections.Counter(int(v) for v in values)
    # every dataset's draws first, then the checks: a failure shows both laws
    summary, p_values = {}, {}
    for name, ds in datasets[(a, b)].items():
        law, observed = exact_law(ds["counts"]), freqs[name]
        p_value = p_values[name] = goodness_of_fit(observed, law, DRAWS)
        summary[name] = (dict(observed), f"P(1) exact {law[1]:.4f}", f"chi-square p {p_value:.3g}")
        print(f"a={a} b={b} {name}: {summary[name]}")
    for name, ds in datasets[(a, b)].items():
        law, observed = exact_law(ds["counts"]), freqs[name]
        assert set(observed) <= {0, 1}, (name, summary)
        assert p_values[name] >= 0.01, (name, summary)
        for y in (0, 1):
            assert within_binomial(observed[y], DRAWS, law[y]), (name, y, summary)
    for y in (0, 1):
        x, x_prime = freqs["X"][y] / DRAWS, freqs["X'"][y] / DRAWS
        assert x > 0 and x_prime > 0, (y, summary)
        assert max(x / x_prime, x_prime / x) <= math.exp(EPSILON), (y, summary)


# --------------------------------------------------------------------------- HTTP


def release_estimate(client: TestClient, dataset_id: str, headers: dict[str, str]) -> float:
    """One median release through the API: the synchronous answer, or polled until done."""
    r = client.post(
        f"/v1/datasets/{dataset_id}/quantiles",
        json={"quantiles": QUANTILES, "epsilon": str(EPSILON), "method": "jointexp"},
        headers=headers,
    )
    assert r.status_code in (201, 202), r.text
    release = r.json()
    if release["status"] != "done":

        def finished() -> dict[str, Any] | None:
            got = client.get(f"/v1/releases/{release['id']}", headers=headers)
            assert got.status_code == 200, got.text
            body: dict[str, Any] = got.json()
            assert body["status"] in ("pending", "done"), body
            return body if body["status"] == "done" else None

        release = wait_for(finished, timeout=60)
    (estimate,) = release["estimates"]
    return float(estimate)


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_http_releases_on_both_neighbours_release_one_as_often_as_the_exact_law_says(
    a: int,
    b: int,
    datasets: dict[tuple[int, int], dict[str, dict[str, Any]]],
    api: Api,
    client: TestClient,
) -> None:
    """RELEASES real releases per dataset (analyst key, release workers in their own
    processes): the estimate is always a grid point 0 or 1, and 1 occurs on X and on X'
    within 5 sigma of the exact law's expectation. Under the old draw one count was 0 or
    RELEASES on both datasets (a < 1e-27 event under the exact law).

    Measured with an external PostgreSQL: 10-20 ms per release, 200 in 2-4 s per dataset
    (9-14 s for the four), well under a minute, so RELEASES is not reduced.
    """
    counts: dict[str, collections.Counter[float]] = {}
    for name, ds in datasets[(a, b)].items():
        analyst = api.key("analyst", ds["id"])
        started = time.perf_counter()
        counts[name] = collections.Counter(
            release_estimate(client, ds["id"], analyst) for _ in range(RELEASES)
        )
        elapsed = time.perf_counter() - started
        p1 = exact_law(ds["counts"])[1]
        print(
            f"a={a} b={b} {name}: {RELEASES} releases in {elapsed:.1f} s, estimate 1"
            f" {counts[name][1.0]} times (expected {RELEASES * p1:.1f}), {dict(counts[name])}"
        )
    summary = {name: dict(c) for name, c in counts.items()}
    for name, ds in datasets[(a, b)].items():
        p1 = exact_law(ds["counts"])[1]
        assert set(counts[name]) <= {0.0, 1.0}, (name, summary)
        assert within_binomial(counts[name][1.0], RELEASES, p1), (name, p1, summary)
