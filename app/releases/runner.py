"""Running reserved releases: claim one, run its mechanism outside any transaction, store it.

The ``release`` table is the task queue: a ``pending`` row *is* the job, inserted in the
same transaction as its debit, so a paid run can never be lost between two systems and a
job can never exist without its payment. Workers claim rows with
``SELECT ... FOR UPDATE SKIP LOCKED`` and hold a lease (``lease_token`` until
``lease_until``); a worker that dies loses its lease, and the row is claimed again once the
lease has expired. ``attempts`` counts mechanism runs started; a release whose runs keep
dying is marked ``failed`` (``worker_lost``) after ``max_runs``.

Completion is guarded by the lease token: a worker whose lease was taken over cannot store
its output, so one release gets at most one output, however many runs were started.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg.rows import dict_row

from app.codec.grid import cell_of, grid_size, grid_values
from app.core.metrics import RELEASES
from app.datasets.group_values import load_groups
from app.datasets.service import load_histogram
from app.ledger.service import mechanism_float
from app.mechanisms import GridHistogram, MechanismInputError, get_mechanism
from app.mechanisms.grouped import chain_length, run_groups
from app.mechanisms.partition import select_keys
from app.planner.intervals import interval_cells_many
from app.releases.service import PENDING_CHANNEL

Connection = psycopg.Connection[Any]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]

#: Why a release failed (public: shown on the release). Each may depend on the data, which
#: is why a failed release keeps its debit.
FAILURE_TIMEOUT = "timeout"  # the run exceeded the hard time limit
FAILURE_ERROR = "mechanism_error"  # the mechanism raised
FAILURE_LOST = "worker_lost"  # the worker running it died max_runs times
FAILURE_ARCHIVED = "dataset_archived"  # the dataset was archived before the run started


@dataclass(frozen=True)
class Claim:
    """A release this worker holds the lease of (and, from :func:`claim_batch`, the release's
    parameters and its dataset's public description, read by the claiming statement)."""

    release_id: uuid.UUID
    token: uuid.UUID
    attempts: int
    row: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Job:
    """Everything one run needs, read in one short transaction."""

    claim: Claim
    method: str
    quantiles: list[float]
    epsilon: Decimal
    delta: Decimal | None
    lower: float
    upper: float
    granularity: float
    neighbors: str
    histogram: GridHistogram | None
    #: k: the release is private for a unit of up to k rows (the dataset's bound)
    rows_per_unit: int = 1
    #: a grouped release: one histogram per key, in the release's order (None: no rows)
    groups: list[GridHistogram | None] | None = None
    #: keys discovered by partition selection: every key's histogram, the selection's
    #: parameters, and (filled by :func:`run_job`) the keys it kept
    candidates: dict[str, GridHistogram] | None = None
    selection: dict[str, Any] | None = None
    selected: list[str] = field(default_factory=list)


class RunFailed(Exception):
    """The mechanism could not produce an answer (the reason is public, the cause is not)."""

    def __init__(self, message: str, reason: str = FAILURE_ERROR) -> None:
        super().__init__(message)
        self.reason = reason


def claim_batch(
    conn: Connection, *, lease_s: float, max_runs: int, token: uuid.UUID, limit: int = 1
) -> tuple[list[Claim], int]:
    """Lease up to ``limit`` runnable releases (pending, lease free or expired) under one
    lease ``token``, taking every (key, dataset) in turn: a pair's runs in flight count as
    its first turns, then its waiting releases oldest first; the claim takes the lowest
    turns, and among equal turns the pairs with the fewest releases in the queue, then the
    oldest. So one key's backlog delays another key's release by at most the runs already
    in flight (one global FIFO would let six queued runs of one key hold a victim's
    8 ms release for seconds). Returns the claims to run, in that order,
    and how many releases the statement took in all (0: idle). The first starts its run
    now and counts an
    attempt; each later one counts its attempt, and gets its own lease, when its run starts
    (:func:`start_run`), so a batch given back unstarted costs no attempt.

    One autocommit statement on ``conn`` (a worker with several releases to run claims them
    together). The worker publishes ``token`` to its supervisor *before* claiming, so a
    worker killed right after the claim commits still has its leases given back
    (:func:`expire_lease` finds them by token). A release that already started ``max_runs``
    runs is marked failed instead (its workers kept dying) and is not returned.
    """
    # A lease lost in a crash is harmless (the release is claimed again when it expires), so
    # the claim does not wait for a WAL flush (set_config(..., true) is SET LOCAL, folded
    # into the statement). It also reads the datasets' public descriptions and data
    # versions, so loading the jobs needs no further statement.
    cursor = conn.cursor(row_factory=dict_row)
    cursor.execute(_CLAIM, {"token": token, "lease": float(lease_s), "limit": max(1, limit)})
    claims = [
        Claim(release_id=row["id"], token=token, attempts=int(row["attempts"]), row=row)
        for row in sorted(
            cursor.fetchall(), key=lambda row: (int(row["priority"]), int(row["seq"]))
        )
    ]
    runnable = []
    for claim in claims:
        if claim.attempts <= max_runs:
            runnable.append(claim)
            continue
        logger.warning(
            "release %s failed: %d runs started, none finished", claim.release_id, max_runs
        )
        fail(conn, claim=claim, reason=FAILURE_LOST)
    return runnable, len(claims)


_CLAIM = """
    WITH queue AS (
        SELECT id, seq, api_key_id, dataset_id,
               lease_until IS NOT NULL AND lease_until >= clock_timestamp() AS leased
        FROM release
        WHERE status = 'pending'
    ), ranked AS (
        -- a (key, dataset)'s runs in flight take its first turns and its waiting
        -- releases the next ones; among equal turns the pair with fewer releases in the
        -- queue goes first, so a backlog waits behind everyone else's next release
        SELECT id, seq, leased,
               row_number() OVER (PARTITION BY api_key_id, dataset_id
                                  ORDER BY leased DESC, seq) AS turn,
               count(*) OVER (PARTITION BY api_key_id, dataset_id) AS backlog
        FROM queue
    ), next AS MATERIALIZED (
        SELECT r.id, r.seq, ranked.turn * 2147483648 + least(ranked.backlog, 2147483647)
               AS priority
        FROM release AS r JOIN ranked ON ranked.id = r.id
        WHERE NOT ranked.leased
          AND r.status = 'pending'
          AND (r.lease_until IS NULL OR r.lease_until < clock_timestamp())
        ORDER BY ranked.turn, ranked.backlog, r.seq
        LIMIT %(limit)s
        FOR UPDATE OF r SKIP LOCKED
    ), head AS (SELECT id FROM next ORDER BY priority, seq LIMIT 1)
    UPDATE release AS r
    SET lease_token = %(token)s,
        lease_until = clock_timestamp() + make_interval(secs => %(lease)s),
        attempts = r.attempts + (r.id = head.id)::int,
        run_started_at = CASE WHEN r.id = head.id THEN clock_timestamp()
                              ELSE r.run_started_at END
    FROM next, head,
         dataset AS d,
         dataset_column AS c,
         (SELECT set_config('synchronous_commit', 'off', true) AS v) AS cfg
    WHERE r.id = next.id AND d.id = r.dataset_id AND cfg.v IS NOT NULL
      AND c.dataset_id = r.dataset_id AND c.name = r.column_name
    RETURNING r.id, r.seq, next.priority, r.attempts, r.dataset_id, r.method,
              r.quantiles, r.epsilon, r.delta, c.lower, c.upper,
              c.granularity, d.neighbors, d.archived_at, d.size_hint, d.max_rows_per_unit,
              r.column_name, r.trace_parent, r.created_at, r.group_by, r.group_keys,
              r.expected_error, r.group_error,
              CASE WHEN d.neighbors = 'swap' THEN d.n END AS public_n,
              CASE WHEN d.n IS NOT NULL THEN d.data_version END AS data_version
    """

_START = """
    UPDATE release AS r
    SET lease_until = clock_timestamp() + make_interval(secs => %(lease)s),
        attempts = r.attempts + 1, run_started_at = clock_timestamp()
    FROM (SELECT set_config('synchronous_commit', 'off', true) AS v) AS cfg
    WHERE r.id = %(id)s AND r.lease_token = %(token)s AND r.status = 'pending'
      AND cfg.v IS NOT NULL
    RETURNING r.attempts
    """


def start_run(conn: Connection, *, claim: Claim, lease_s: float, max_runs: int) -> Claim | None:
    """Begin the run of a claimed release that was not the first of its batch: its own
    lease from now (``run_timeout + margin``), and one more attempt (attempts count runs
    that started). None when it is no longer this worker's (its lease expired and another
    worker took it) or when it already started ``max_runs`` runs (then marked failed,
    ``worker_lost``)."""
    row = conn.execute(
        _START, {"lease": float(lease_s), "id": claim.release_id, "token": claim.token}
    ).fetchone()
    if row is None:
        return None
    started = replace(claim, attempts=int(row[0]))
    if started.attempts > max_runs:
        logger.warning(
            "release %s failed: %d runs started, none finished", claim.release_id, max_runs
        )
        fail(conn, claim=started, reason=FAILURE_LOST)
        return None
    return started


#: How many grid histograms a worker keeps between runs (see :func:`load_job`).
KEPT_HISTOGRAMS = 16
_kept: OrderedDict[tuple[uuid.UUID, int, str], GridHistogram] = OrderedDict()


def load_job(conn: Connection, *, claim: Claim) -> Job:
    """The claimed release's parameters (read by the claim) and its dataset's frozen grid
    histogram. O(distinct cells), whatever n is (the histogram usually comes from the
    process's cache; otherwise one read on ``conn``).

    A worker keeps the :data:`KEPT_HISTOGRAMS` histograms it ran on last, keyed by dataset
    and data version (immutable content), so the next release on the same data skips the
    O(d) validation and reuses what the mechanisms derived from it (``GridHistogram``: for
    small histograms). They share their arrays with the values cache.
    """
    params = claim.row
    if params is None:
        raise RunFailed("claim without parameters")
    if params["archived_at"] is not None:
        raise RunFailed("dataset archived", reason=FAILURE_ARCHIVED)
    version = params["data_version"]
    if version is None:
        raise RunFailed("values missing")  # the claim found no values uploaded
    lower, upper, granularity = params["lower"], params["upper"], params["granularity"]
    column = str(params.get("column_name") or "value")
    points = grid_size(lower, upper, granularity)
    histogram: GridHistogram | None = None
    groups: list[GridHistogram | None] | None = None
    candidates: dict[str, GridHistogram] | None = None
    selection: dict[str, Any] | None = None
    if params.get("group_by") is not None:
        loaded = load_groups(
            conn, dataset_id=params["dataset_id"], version=int(version),
            group_column=str(params["group_by"]), column=column,
        )  # fmt: skip
        if loaded is None:
            raise RunFailed("per-key values missing")
        stored = params["group_keys"]
        if isinstance(stored, dict):  # discover: the run selects among every stored key
            candidates = {k: GridHistogram(v[0], v[1], points) for k, v in loaded.items()}
            selection = dict(stored["discover"])
        else:
            groups = []
            for key in stored:
                found = loaded.get(str(key))
                groups.append(None if found is None else GridHistogram(found[0], found[1], points))
    else:
        histogram = _histogram(conn, params["dataset_id"], int(version), points, column)
    return Job(
        claim=claim,
        method=params["method"],
        quantiles=[float(q) for q in params["quantiles"]],
        epsilon=Decimal(params["epsilon"]),
        delta=None if params["delta"] is None else Decimal(params["delta"]),
        lower=lower,
        upper=upper,
        granularity=granularity,
        neighbors=params["neighbors"],
        histogram=histogram,
        rows_per_unit=int(params.get("max_rows_per_unit") or 1),
        groups=groups,
        candidates=candidates,
        selection=selection,
    )


def _histogram(
    conn: Connection, dataset_id: uuid.UUID, version: int, grid_points: int, column: str
) -> GridHistogram:
    key = (dataset_id, version, column)
    kept = _kept.get(key)
    if kept is not None and kept.grid_points == grid_points:
        _kept.move_to_end(key)
        return kept
    loaded = load_histogram(conn, dataset_id=dataset_id, version=version, column=column)
    if loaded is None:
        raise RunFailed("values missing")
    _, cells, counts = loaded
    histogram = GridHistogram(cells=cells, counts=counts, grid_points=grid_points)
    _kept[key] = histogram
    while len(_kept) > KEPT_HISTOGRAMS:
        _kept.popitem(last=False)
    return histogram


def run_job(job: Job, *, rng: np.random.Generator | None = None) -> list[float]:
    """Run the mechanism on the grid histogram (no database involved); the estimates are
    grid points.

    ``Mechanism.run_grid`` returns grid indices drawn exactly (integer weights, an integer
    uniform draw); each index k becomes ``lower + k * granularity`` evaluated in decimal and
    rounded once to a double, so the released numbers are a fixed, data-independent set.
    ``rng=None`` draws from the OS CSPRNG. Raises :class:`RunFailed` on any failure; its
    message never carries a data value.
    """
    try:
        mech = get_mechanism(job.method)
        epsilon = mechanism_float(job.epsilon)
        delta = None if job.delta is None else mechanism_float(job.delta)
        groups = job.groups
        if job.candidates is not None and job.selection is not None:
            groups = _select(job)
        if groups is not None:
            per_group = run_groups(
                mech, groups, job.quantiles,
                grid_points=grid_size(job.lower, job.upper, job.granularity),
                epsilon=epsilon, delta=delta, neighbors=job.neighbors,
                rows_per_unit=job.rows_per_unit, rng=rng,
            )  # fmt: skip
            cells = np.concatenate(per_group) if per_group else np.empty(0, np.int64)
        else:
            assert job.histogram is not None
            cells = mech.run_grid(
                job.histogram,
                job.quantiles,
                epsilon=epsilon,
                delta=delta,
                neighbors=job.neighbors,
                rng=rng,
                rows_per_unit=job.rows_per_unit,
            )
        estimates = grid_values(cells, job.lower, job.granularity)
    except MechanismInputError as exc:
        # The parameter name is public; the problem text could in principle quote a value.
        raise RunFailed(f"{type(exc).__name__} on {exc.parameter}") from None
    except Exception as exc:
        # The class only: a message could in principle quote a data value.
        raise RunFailed(type(exc).__name__) from None
    expected = len(job.quantiles) * (1 if groups is None else len(groups))
    if estimates.shape != (expected,):
        raise RunFailed("wrongly shaped result")
    return [float(e) for e in estimates]


def _select(job: Job) -> list[GridHistogram | None]:
    """Partition selection over every stored key (``"keys": "discover"``): the kept keys,
    sorted, at most ``max_keys`` of them (the first in key order: post-processing), go to
    ``job.selected``; their histograms are returned in that order."""
    assert job.candidates is not None and job.selection is not None
    spec = job.selection
    kept = select_keys(
        {key: hist.n for key, hist in job.candidates.items()},
        epsilon=Fraction(Decimal(spec["epsilon"])),
        delta=float(Decimal(spec["delta"])),
        steps=chain_length(job.neighbors, job.rows_per_unit),
        new_keys=job.rows_per_unit,
    )[: int(spec["max_keys"])]
    job.selected.extend(kept)
    return [job.candidates[key] for key in kept]


def complete_batch(
    conn: Connection,
    done: Sequence[tuple[Claim, list[float]]],
    bounds: Sequence[float] | None = None,
    selected: Sequence[list[str] | None] | None = None,
) -> int:
    """Store each release's estimates with ``done`` (durably) where the lease is still ours;
    notify the waiters. Returns how many were stored.

    ``bounds`` (seconds, one per release; default 0) are the runs' public run-time bounds
    (:mod:`app.releases.schedule`): each release is published at the later of now and its
    run's start plus its bound. ``selected`` (one per release, None where the keys were
    public): the keys a partition selection kept, stored with the estimates.

    One autocommit statement and one WAL flush for the whole batch. Its commit must reach
    the disk before any answer leaves, whatever the database's default: it also makes the
    (asynchronously committed) reservations before it durable (``set_config(..., true)`` is
    SET LOCAL for the statement's own transaction). Each state change notifies the waiters
    (trigger ``release_notify``, at commit).
    """
    if not done:
        return 0
    rows = conn.execute(
        _COMPLETE,
        {
            "ids": [claim.release_id for claim, _ in done],
            "tokens": [claim.token for claim, _ in done],
            # float8[] literals of the doubles' shortest round-trip repr: read back exactly
            "estimates": ["{" + ",".join(map(repr, estimates)) + "}" for _, estimates in done],
            "bounds": [float(b) for b in bounds] if bounds is not None else [0.0] * len(done),
            "versions": [_version(claim) for claim, _ in done],
            "selected": [
                None if keys is None else json.dumps(keys)
                for keys in (selected or [None] * len(done))
            ],
            "intervals": [
                _intervals(claim, estimates, keys)
                for (claim, estimates), keys in zip(
                    done, selected or [None] * len(done), strict=True
                )
            ],
        },
    ).fetchall()
    for (method,) in rows:
        RELEASES.labels(method, "done").inc()
    return len(rows)


def intervals_of(
    params: Mapping[str, Any], estimates: Sequence[float]
) -> list[dict[str, float]] | None:
    """A done release's error bars (:mod:`app.planner.intervals`) from its claimed
    parameters (quantiles, the column's grid, the expected error stored at the reservation
    with the public size it assumed) and its estimates, as grid values like the estimates;
    None for grouped releases (:func:`group_intervals_of`) and where the expected error or
    its size is unknown. Public figures and the output only."""
    expected = params.get("expected_error")
    if params.get("group_by") is not None or not expected:
        return None
    try:
        size = expected[0].get("size")
        if size is None:
            return None
        table = np.asarray(estimates, dtype=np.float64).reshape(1, -1)
        bounds = [max(_bar_bound(row, atom) for row in expected) for atom in (False, True)]
        bars = _grid_bars(params, table, [(bounds[0], bounds[1], int(size))])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None if bars is None else bars[0]


def group_intervals_of(
    params: Mapping[str, Any], estimates: Sequence[float], keys: Sequence[str] | None = None
) -> list[list[dict[str, float]] | None] | None:
    """A done grouped release's error bars, one entry per group answered (``keys``: the
    keys a selection kept, else the listed keys): a hinted key's bars at its size hint
    (``group_error.by_key``, stored at the reservation), None for a key without one. None
    when no key is hinted. Public figures and the output only."""
    if params.get("group_by") is None:
        return None
    try:
        hinted = {
            str(row["key"]): (_bar_bound(row, False), _bar_bound(row, True), int(row["size"]))
            for row in (params.get("group_error") or {}).get("by_key") or []
        }
        answered = list(keys) if keys is not None else [str(k) for k in params["group_keys"]]
        m = len(params["quantiles"])
        if not hinted or len(estimates) != m * len(answered):
            return None
        rows = [i for i, key in enumerate(answered) if key in hinted]
        table = np.asarray(estimates, dtype=np.float64).reshape(len(answered), m)
        bars = _grid_bars(params, table[rows], [hinted[answered[i]] for i in rows])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    out: list[list[dict[str, float]] | None] = [None] * len(answered)
    for i, bar in zip(rows, bars or [None] * len(rows), strict=True):
        out[i] = bar
    return out


def _bar_bound(row: Mapping[str, Any], atom: bool) -> float:
    """The bound an error bar spans: one estimate's (``bound90_each``), or with ``atom``
    (the release put an estimate at a public bound) the same with an atom there
    (``bound90_each_atom``); for releases stored before those existed, the one before them,
    down to the release mean's (``bound90``)."""
    for name in ("bound90_each_atom", "bound90_each") if atom else ("bound90_each",):
        if row.get(name) is not None:
            return float(row[name])
    return float(row["bound90"])


def _grid_bars(
    params: Mapping[str, Any],
    rows: NDArray[np.float64],
    bounds: Sequence[tuple[float, float, int]],
) -> list[list[dict[str, float]] | None] | None:
    """Error bars for rows of estimates of the release's levels on its grid, one
    ``(bound, bound with an atom at a public bound, size)`` per row, as grid values like the
    estimates (one batched pass of :func:`app.planner.intervals.interval_cells_many`); a row
    with an estimate at either end of the grid spans the second bound: values clamped to a
    bound pile up there, which the release shows, and the error model fitted on such data
    applies (post-processing). An entry is None where its bound or size does not allow bars,
    the whole None where the levels do not."""
    quantiles = [float(q) for q in params["quantiles"]]
    lower, upper = float(params["lower"]), float(params["upper"])
    step = float(params["granularity"])
    m, last = len(quantiles), grid_size(lower, upper, step) - 1
    grid = cell_of(rows.ravel(), lower, upper, step).reshape(rows.shape)
    cells = [[int(c) for c in row] for row in grid]
    hit = [bool(np.any((row == 0) | (row == last))) for row in grid]
    bound = [b[1] if h else b[0] for b, h in zip(bounds, hit, strict=True)]
    bars = interval_cells_many(
        quantiles, cells, steps=last, bound90=bound, size=[n for _, _, n in bounds]
    )
    if bars is None:
        return None
    formed = [(i, b) for i, b in enumerate(bars) if b is not None]
    ends = [end for _, b in formed for pair in b for end in pair]
    values = grid_values(ends, lower, step).tolist() if ends else []
    out: list[list[dict[str, float]] | None] = [None] * len(rows)
    for k, (i, _) in enumerate(formed):
        own = values[2 * m * k : 2 * m * (k + 1)]
        out[i] = [
            {"quantile": q, "low": own[2 * j], "high": own[2 * j + 1]}
            for j, q in enumerate(quantiles)
        ]
    return out


def _intervals(
    claim: Claim, estimates: Sequence[float], keys: Sequence[str] | None = None
) -> str | None:
    if claim.row is None:
        return None
    bars: list[Any] | None
    if claim.row.get("group_by") is not None:
        bars = group_intervals_of(claim.row, estimates, keys)
    else:
        bars = intervals_of(claim.row, estimates)
    return None if bars is None else json.dumps(bars)


def _version(claim: Claim) -> int | None:
    """The data version the claim's run loaded (recorded on the release)."""
    version = None if claim.row is None else claim.row.get("data_version")
    return None if version is None else int(version)


_COMPLETE = """
    UPDATE release AS r
    SET status = 'done', estimates = v.estimates::double precision[],
        data_version = v.version, selected_keys = v.selected::jsonb,
        intervals = v.intervals::jsonb,
        finished_at = clock_timestamp(), lease_until = NULL,
        published_at = greatest(
            clock_timestamp(),
            coalesce(r.run_started_at, clock_timestamp()) + make_interval(secs => v.bound))
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(estimates)s::text[],
                %(bounds)s::double precision[], %(versions)s::integer[], %(selected)s::text[],
                %(intervals)s::text[])
             AS v(id, token, estimates, bound, version, selected, intervals),
         (SELECT set_config('synchronous_commit', 'on', true) AS v) AS cfg
    WHERE r.id = v.id AND r.lease_token = v.token AND r.status = 'pending'
      AND cfg.v IS NOT NULL
    RETURNING r.method
    """


def fail(conn: Connection, *, claim: Claim, reason: str, bound_s: float = 0.0) -> bool:
    """Mark the release ``failed`` (it keeps its debit; failed is final) if the lease is
    still ``claim``'s; published, like a finished one, at the later of now and its run's
    start plus ``bound_s``."""
    row = conn.execute(
        "UPDATE release SET status = 'failed', failure = %(reason)s,"
        " finished_at = clock_timestamp(), lease_until = NULL,"
        " published_at = greatest(clock_timestamp(), coalesce(run_started_at,"
        " clock_timestamp()) + make_interval(secs => %(bound)s))"
        " WHERE id = %(id)s AND lease_token = %(token)s AND status = 'pending'"
        " RETURNING method",
        {"reason": reason, "id": claim.release_id, "token": claim.token, "bound": bound_s},
    ).fetchone()
    if row is None:
        return False
    RELEASES.labels(row[0], "failed").inc()
    return True


def expire_lease(conn: Connection, *, claim: Claim) -> None:
    """Give the releases claimed under ``claim``'s token that are still pending back to the
    queue at once (their runs were interrupted, or never started). The leases are found by
    the token alone, so a supervisor that knows only the token of a worker it killed can
    settle them. Still pending, so no trigger fires: the same statement wakes the workers."""
    conn.execute(
        "WITH r AS (UPDATE release SET lease_until = clock_timestamp()"
        " WHERE lease_token = %(token)s AND status = 'pending' RETURNING id)"
        " SELECT pg_notify(%(channel)s, r.id::text) FROM r",
        {"channel": PENDING_CHANNEL, "token": claim.token},
    )
