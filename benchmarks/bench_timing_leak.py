"""Timing and shape leak of releases (issue 28): can what a viewer or analyst receives tell n?

Two datasets with the same public figures (``add_remove`` neighbours, bounds [0, 100],
granularity 1, the same budget, no size hint) hold one grid cell each: ``--n-small`` (10)
records in cell 50 on one, ``--n-big`` (5·10^7) in the same cell on the other. For every
method of ``GET /v1/methods`` (``--delta`` for those that need one; a method the service
refuses for ``add_remove`` neighbours is skipped and reported), ``--rounds`` rounds each make
one release on each dataset, in random order, at the service's minimum epsilon, m = 9
deciles; half the rounds (at random, the same for both datasets of a round) send
``Prefer: wait=0.2``, the others no ``Prefer``. Recorded per release: what the analyst gets
from the POST (status, wall time, headers, body), what a viewer gets by polling
``GET /v1/releases/{id}`` every ``--poll-ms`` ms until it is no longer pending, what a viewer
watching ``GET /v1/datasets/{id}/releases?limit=1`` sees *during* the POST (when the release
appears, when it shows done), and its entry in the release list read at the end.

Classifiers (numpy only), label = which dataset; 10-fold stratified cross-validation (the
split shuffled by a seeded RNG): the best threshold on each single feature (threshold and
direction chosen on the training folds), the same with the feature also chosen on the
training folds ("nested"), nearest centroid and 5-nearest neighbours on all standardised
features. Pooled over all methods twice: one classifier for everything ("global"), and one
per method inside every fold (the method is known to whoever asked: "per method").

Two feature sets are reported. *Side channels* (the acceptance figure): timings, statuses,
header counts, poll counts, ETag changes, timestamps, body sizes without the estimates.
*With the answer*: the same plus features of the estimates themselves (their spread, number
of distinct values, a hash bucket, the body size with them). The estimates are the DP output:
at epsilon 0.001 under add/remove neighbours a single record is protected, 5·10^7 - 10 records
are not (group privacy), so the answer itself is expected to tell the datasets apart (n = 10
answers noise, n = 5·10^7 answers the cell); that is not a side channel.

The server is ``dpquant serve --workers 2`` (two web processes and the default two release
workers) with default settings: only ``DPQUANT_DATABASE_URL``, ``DPQUANT_BOOTSTRAP_ADMIN_KEY``
and ``DPQUANT_LOG_LEVEL=WARNING`` are set, every other inherited ``DPQUANT_*`` variable is
removed (``bench_service.start_server(..., defaults=True)``; without it that benchmark's
``DPQUANT_MAX_VALUES=10^7`` would refuse the 5·10^7-value dataset). The database is a fresh one
(``CREATE DATABASE bench_timing_<random>``) on ``DPQUANT_BENCH_DATABASE_URL``'s server or on
an embedded pgserver, dropped at the end. ``--code DIR`` serves another checkout.

Usage::

    python -m benchmarks.bench_timing_leak [--rounds 20] [--methods a,b] [--code DIR]
        [--json PATH]

Target (issue 28): the pooled side-channel accuracy over >= 200 releases is <= 60 %.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.bench_service import free_port, migrate, start_server

DECILES = [round(0.1 * k, 1) for k in range(1, 10)]
LOWER, UPPER, GRANULARITY, CELL = 0.0, 100.0, 1.0, 50

#: Side-channel features: everything received except the estimates' values.
SIDE_FEATURES = (
    "post_seconds",
    "status_201",
    "preference_applied",
    "post_header_count",
    "post_body_bytes_wo_est",
    "post_finished_minus_created",
    "created_after_post_start",
    "finished_after_post_start",
    "finished_minus_created",
    "seen_done_seconds",
    "polls",
    "etag_changes",
    "get_body_bytes_wo_est",
    "get_header_count",
    "list_seen_seconds",
    "list_done_seconds",
    "list_polls",
    "list_item_bytes_wo_est",
    "list_item_equals_get",
    "failed",
    "warnings_count",
    "expected_error_null",
)
#: Features of the answer itself (the DP output).
ANSWER_FEATURES = ("est_range", "est_distinct", "est_hash_bucket", "get_body_bytes")

_ESTIMATES = re.compile(rb'"estimates":(null|\[[^\]]*\])')


# --------------------------------------------------------------------------- server and DB


def _fresh_database(server_url: str) -> tuple[str, Callable[[], None]]:
    """A new, empty database on ``server_url``'s server; returns its URL and a dropper."""
    import psycopg
    from sqlalchemy.engine import make_url

    from app.core.db import normalize_url

    url = make_url(normalize_url(server_url))
    name = "bench_timing_" + secrets.token_hex(6)
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url.set(database=name).render_as_string(hide_password=False), drop


# --------------------------------------------------------------------------- collection


@dataclass
class Collection:
    """What :func:`collect` gathered."""

    records: list[dict[str, Any]]
    refused: dict[str, str] = field(default_factory=dict)
    datasets: dict[int, str] = field(default_factory=dict)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _dataset(client: httpx.Client, admin: str, name: str, n: int, budget: str) -> str:
    r = client.post(
        "/v1/datasets",
        json={
            "name": name,
            "lower": LOWER,
            "upper": UPPER,
            "granularity": GRANULARITY,
            "neighbors": "add_remove",
            "epsilon": budget,
            "delta": "1",
        },
        headers=_auth(admin),
    )
    r.raise_for_status()
    ds = str(r.json()["id"])
    r = client.put(
        f"/v1/datasets/{ds}/histogram",
        json={"cells": [CELL], "counts": [n]},
        headers=_auth(admin),
    )
    if r.status_code != 200:
        raise RuntimeError(f"histogram upload refused: {r.status_code} {r.text[:300]}")
    return ds


def _key(client: httpx.Client, admin: str, role: str) -> str:
    # Unscoped: a key's scope is one dataset or all of them; on this fresh database "all" is
    # exactly the benchmark's datasets, and both datasets are read with the same key.
    r = client.post("/v1/keys", json={"role": role, "name": "bench-timing"}, headers=_auth(admin))
    r.raise_for_status()
    return str(r.json()["key"])


def _ts(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


def _body_wo_estimates(raw: bytes) -> int:
    m = _ESTIMATES.search(raw)
    return len(raw) - (len(m.group(1)) if m else 0)


class _ListWatcher(threading.Thread):
    """A viewer watching a dataset's newest release while the analyst's POST is in flight."""

    def __init__(self, base_url: str, viewer: str, ds: str, known: set[str], poll_s: float):
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base_url, headers=_auth(viewer), timeout=60)
        self.ds, self.known, self.poll_s = ds, known, poll_s
        self.t0 = 0.0
        self.stop = threading.Event()
        self.seen: float | None = None
        self.done: float | None = None
        self.polls = 0

    def run(self) -> None:
        try:
            while True:
                r = self.client.get(f"/v1/datasets/{self.ds}/releases", params={"limit": 1})
                now = time.perf_counter() - self.t0
                self.polls += 1
                items = r.json().get("items", []) if r.status_code == 200 else []
                if items and str(items[0]["id"]) not in self.known:
                    if self.seen is None:
                        self.seen = now
                    if items[0]["status"] != "pending":
                        self.done = now
                        return
                if self.stop.wait(self.poll_s):
                    return
        finally:
            self.client.close()


def _release(
    base_url: str,
    analyst: httpx.Client,
    viewer: httpx.Client,
    viewer_key: str,
    ds: str,
    known: set[str],
    body: dict[str, Any],
    prefer: str | None,
    poll_s: float,
) -> dict[str, Any] | tuple[int, str]:
    """One release as an analyst and a viewer see it; (status, text) if it was refused."""
    watcher = _ListWatcher(base_url, viewer_key, ds, known, poll_s)
    headers = {"Prefer": prefer} if prefer else {}
    wall0 = time.time()
    t0 = watcher.t0 = time.perf_counter()
    watcher.start()
    r = analyst.post(f"/v1/datasets/{ds}/quantiles", json=body, headers=headers)
    post_seconds = time.perf_counter() - t0
    if r.status_code not in (201, 202):
        watcher.stop.set()
        watcher.join()
        return r.status_code, r.text
    post = r.json()
    rid = str(post["id"])
    seen_done = post_seconds if post["status"] != "pending" else None
    etags = [r.headers.get("etag")]
    polls: list[dict[str, Any]] = []
    deadline = time.monotonic() + 900
    while True:
        g = viewer.get(f"/v1/releases/{rid}")
        now = time.perf_counter() - t0
        got = g.json()
        polls.append(
            {
                "t": now,
                "code": g.status_code,
                "etag": g.headers.get("etag"),
                "status": got["status"],
            }
        )
        if not etags or g.headers.get("etag") != etags[-1]:
            etags.append(g.headers.get("etag"))
        if got["status"] != "pending":
            if seen_done is None:
                seen_done = now
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"release {rid} still pending after 900 s")
        time.sleep(poll_s)
    # the watcher stops by itself once it sees the release done (or at once if asked)
    watcher.join(timeout=60)
    watcher.stop.set()
    watcher.join()
    known.add(rid)
    return {
        "id": rid,
        "prefer": prefer,
        "post_status": r.status_code,
        "post_seconds": post_seconds,
        "post_wall_start": wall0,
        "post_headers": dict(r.headers),
        "post_body": post,
        "post_body_bytes": len(r.content),
        "post_body_bytes_wo_est": _body_wo_estimates(r.content),
        "polls": polls,
        "etags": etags,
        "seen_done_seconds": seen_done,
        "get_status": g.status_code,
        "get_headers": dict(g.headers),
        "get_body": got,
        "get_body_bytes": len(g.content),
        "get_body_bytes_wo_est": _body_wo_estimates(g.content),
        "list_seen_seconds": watcher.seen,
        "list_done_seconds": watcher.done,
        "list_polls": watcher.polls,
    }


def collect(
    base_url: str,
    admin_key: str,
    *,
    methods: Sequence[str] | None = None,
    rounds: int = 20,
    n_small: int = 10,
    n_big: int = 5 * 10**7,
    epsilon: str = "0.001",
    delta: str = "1e-6",
    prefer_wait: float = 0.2,
    warmup: int = 2,
    seed: int = 0,
    poll_s: float = 0.02,
    log: Callable[[str], None] | None = None,
) -> Collection:
    """Create the datasets and keys on a running server, make the releases, record them."""
    say = log or (lambda _msg: None)
    rng = np.random.default_rng(seed)
    tag = secrets.token_hex(4)
    budget = "1000000"
    out = Collection(records=[])
    with (
        httpx.Client(base_url=base_url, timeout=900) as admin,
        httpx.Client(base_url=base_url, timeout=900) as analyst,
        httpx.Client(base_url=base_url, timeout=900) as viewer,
    ):
        listed = admin.get("/v1/methods")
        listed.raise_for_status()
        catalogue = {m["name"]: m for m in listed.json()}
        names = list(catalogue) if methods is None else list(methods)
        sizes = {0: n_small, 1: n_big}
        out.datasets = {
            label: _dataset(admin, admin_key, f"timing-{label}-{tag}", n, budget)
            for label, n in sizes.items()
        }
        warm = {
            label: _dataset(admin, admin_key, f"timing-warm-{label}-{tag}", n, budget)
            for label, n in sizes.items()
        }
        analyst_key, viewer_key = (
            _key(admin, admin_key, "analyst"),
            _key(admin, admin_key, "viewer"),
        )
        analyst.headers.update(_auth(analyst_key))
        viewer.headers.update(_auth(viewer_key))
        known: dict[str, set[str]] = {ds: set() for ds in [*out.datasets.values(), *warm.values()]}
        for method in names:
            body: dict[str, Any] = {"quantiles": DECILES, "epsilon": epsilon, "method": method}
            if catalogue[method]["needs_delta"]:
                body["delta"] = delta
            refused = None
            for i in range(max(1, warmup)):  # workers' JIT and caches; refusals show here
                for label in (0, 1):
                    ds = warm[label]
                    got = _release(
                        base_url, analyst, viewer, viewer_key, ds, known[ds], body, None, poll_s
                    )
                    if isinstance(got, tuple):
                        refused = f"{got[0]} {got[1][:300]}"
                        break
                    say(f"warm-up {method} n={sizes[label]} #{i}: {got['post_seconds']:.3f} s")
                if refused:
                    break
            if refused:
                out.refused[method] = refused
                say(f"{method}: refused ({refused})")
                continue
            waits = rng.permutation([i % 2 for i in range(rounds)])
            for rnd in range(rounds):
                prefer = f"wait={prefer_wait:g}" if waits[rnd] else None
                order = [int(x) for x in rng.permutation(2)]
                for position, label in enumerate(order):
                    ds = out.datasets[label]
                    got = _release(
                        base_url, analyst, viewer, viewer_key, ds, known[ds], body, prefer, poll_s
                    )
                    if isinstance(got, tuple):
                        raise RuntimeError(f"{method} refused mid-run: {got[0]} {got[1][:300]}")
                    got |= {
                        "method": method,
                        "round": rnd,
                        "position": position,
                        "label": label,
                        "n": sizes[label],
                        "dataset_id": ds,
                    }
                    out.records.append(got)
                say(
                    f"{method} round {rnd + 1}/{rounds} ({prefer or 'no Prefer'}): "
                    + ", ".join(
                        f"n={r['n']} {r['post_status']} {r['post_seconds']:.3f} s"
                        for r in out.records[-2:]
                    )
                )
        # The release lists, as a viewer reads them at the end (every page).
        by_id = {r["id"]: r for r in out.records}
        for ds in out.datasets.values():
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
                page = viewer.get(f"/v1/datasets/{ds}/releases", params=params)
                page.raise_for_status()
                data = page.json()
                for item in data["items"]:
                    rec = by_id.get(str(item["id"]))
                    if rec is not None:
                        rec["list_item"] = item
                cursor = data["next_cursor"]
                if not cursor:
                    break
    return out


# --------------------------------------------------------------------------- features


def _num(value: float | None) -> float:
    return -1.0 if value is None else float(value)


def _row(rec: dict[str, Any]) -> dict[str, float]:
    post, got = rec["post_body"], rec["get_body"]
    item = rec.get("list_item")
    created, finished = _ts(got["created_at"]), _ts(got["finished_at"])
    post_created, post_finished = _ts(post["created_at"]), _ts(post["finished_at"])
    est = got["estimates"]
    item_wo_est = (
        -1
        if item is None
        else len(json.dumps(item | {"estimates": None}, separators=(",", ":")).encode())
    )
    headers = {k.lower() for k in rec["post_headers"]}
    return {
        "post_seconds": rec["post_seconds"],
        "status_201": float(rec["post_status"] == 201),
        "preference_applied": float("preference-applied" in headers),
        "post_header_count": float(len(rec["post_headers"])),
        "post_body_bytes_wo_est": float(rec["post_body_bytes_wo_est"]),
        "post_finished_minus_created": (
            -1.0 if post_finished is None or post_created is None else post_finished - post_created
        ),
        "created_after_post_start": _num(
            None if created is None else created - rec["post_wall_start"]
        ),
        "finished_after_post_start": (
            -1.0 if finished is None else finished - rec["post_wall_start"]
        ),
        "finished_minus_created": (
            -1.0 if finished is None or created is None else finished - created
        ),
        "seen_done_seconds": _num(rec["seen_done_seconds"]),
        "polls": float(len(rec["polls"])),
        "etag_changes": float(len(rec["etags"]) - 1),
        "get_body_bytes_wo_est": float(rec["get_body_bytes_wo_est"]),
        "get_header_count": float(len(rec["get_headers"])),
        "list_seen_seconds": _num(rec["list_seen_seconds"]),
        "list_done_seconds": _num(rec["list_done_seconds"]),
        "list_polls": float(rec["list_polls"]),
        "list_item_bytes_wo_est": float(item_wo_est),
        "list_item_equals_get": float(item == got),
        "failed": float(got["status"] == "failed"),
        "warnings_count": float(len(got.get("warnings") or [])),
        "expected_error_null": float(got.get("expected_error") is None),
        "est_range": -1.0 if not est else float(max(est) - min(est)),
        "est_distinct": -1.0 if not est else float(len(set(est))),
        "est_hash_bucket": (
            -1.0
            if est is None
            else float(int(hashlib.sha256(json.dumps(est).encode()).hexdigest(), 16) % 16)
        ),
        "get_body_bytes": float(rec["get_body_bytes"]),
    }


def features(
    records: Sequence[dict[str, Any]], names: Sequence[str] = SIDE_FEATURES
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(X, y, names)``: one row of numeric features per release, y = 1 for the big dataset."""
    rows = [_row(r) for r in records]
    x = np.array([[row[name] for name in names] for row in rows], dtype=float).reshape(
        len(rows), len(names)
    )
    y = np.array([int(r["label"]) for r in records], dtype=int)
    return x, y, list(names)


# --------------------------------------------------------------------------- classifiers


def _folds(y: np.ndarray, strata: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Fold number per sample: each stratum shuffled, then dealt round-robin."""
    fold = np.empty(len(y), dtype=int)
    offset = 0
    for s in np.unique(strata):
        idx = rng.permutation(np.flatnonzero(strata == s))
        fold[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)  # keeps the folds' sizes even across strata
    return fold


def fit_threshold(v: np.ndarray, y: np.ndarray) -> tuple[float, int, float]:
    """Best ``(threshold, sign, training accuracy)``: predict 1 where ``sign * (v - t) > 0``."""
    n = len(v)
    order = np.argsort(v, kind="stable")
    vs, ys = v[order], y[order]
    ones_left = np.concatenate([[0], np.cumsum(ys)])  # ones among the first i
    i = np.arange(n + 1)
    # predict 0 for the first i (v <= t), 1 for the rest
    acc_up = ((i - ones_left) + (ones_left[-1] - ones_left)) / n
    valid = np.ones(n + 1, dtype=bool)
    valid[1:n] = vs[1:] != vs[:-1]  # split only between distinct values
    acc_up = np.where(valid, acc_up, -1.0)
    acc_down = np.where(valid, 1.0 - acc_up, -1.0)
    j_up, j_down = int(np.argmax(acc_up)), int(np.argmax(acc_down))
    if acc_up[j_up] >= acc_down[j_down]:
        j, sign, acc = j_up, 1, float(acc_up[j_up])
    else:
        j, sign, acc = j_down, -1, float(acc_down[j_down])
    if j == 0:
        t = -np.inf
    elif j == n:
        t = np.inf
    else:
        t = (vs[j - 1] + vs[j]) / 2
    return float(t), sign, acc


def _predict_threshold(v: np.ndarray, t: float, sign: int) -> np.ndarray:
    up = v > t
    return (up if sign > 0 else ~up).astype(int)


def _standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu = train.mean(axis=0)
    sd = train.std(axis=0)
    sd[sd == 0] = 1.0
    return (train - mu) / sd, (test - mu) / sd


def _centroid(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray) -> np.ndarray:
    classes = np.unique(ytr)
    if len(classes) == 1:
        return np.full(len(xte), classes[0])
    a, b = _standardise(xtr, xte)
    c = np.stack([a[ytr == k].mean(axis=0) for k in classes])
    d = ((b[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
    return np.asarray(classes[np.argmin(d, axis=1)])


def _knn(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, k: int) -> np.ndarray:
    a, b = _standardise(xtr, xte)
    d = ((b[:, None, :] - a[None, :, :]) ** 2).sum(axis=2)
    k = min(k, len(ytr))
    nearest = np.argsort(d, axis=1, kind="stable")[:, :k]
    votes = ytr[nearest].mean(axis=1)
    # ties (even k, or fewer points) go to the training majority
    majority = int(ytr.mean() > 0.5)
    return np.where(votes > 0.5, 1, np.where(votes < 0.5, 0, majority))


def _nested(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray) -> np.ndarray:
    fits = [fit_threshold(xtr[:, f], ytr) for f in range(xtr.shape[1])]
    f = int(np.argmax([acc for _, _, acc in fits]))
    t, sign, _ = fits[f]
    return _predict_threshold(xte[:, f], t, sign)


def cv_accuracy(
    x: np.ndarray,
    y: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    folds: int = 10,
    k: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Cross-validated accuracies of the threshold, nested, centroid and kNN classifiers.

    ``groups`` (e.g. the method of each release): every classifier is fitted per group inside
    each training fold and predicts the test samples of its group; the folds are stratified
    by group and label. Returns ``per_feature`` (an accuracy per column), ``best_feature``
    (its index), ``best_feature_acc``, ``nested``, ``centroid``, ``knn`` and ``max`` (of
    best_feature_acc, nested, centroid, knn).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=int)
    n, p = x.shape
    g = np.zeros(n, dtype=int) if groups is None else np.unique(groups, return_inverse=True)[1]
    fold = _folds(y, g * 2 + y, min(folds, n), np.random.default_rng(seed))
    pred = {name: np.zeros(n, dtype=int) for name in ("nested", "centroid", "knn")}
    per_feature = np.zeros((p, n), dtype=int)
    for f in np.unique(fold):
        test = fold == f
        for grp in np.unique(g):
            tr = ~test & (g == grp)
            te = test & (g == grp)
            if not te.any():
                continue
            xtr, ytr, xte = x[tr], y[tr], x[te]
            for c in range(p):
                t, sign, _ = fit_threshold(xtr[:, c], ytr)
                per_feature[c, te] = _predict_threshold(xte[:, c], t, sign)
            pred["nested"][te] = _nested(xtr, ytr, xte)
            pred["centroid"][te] = _centroid(xtr, ytr, xte)
            pred["knn"][te] = _knn(xtr, ytr, xte, k)
    acc_feature = (per_feature == y[None, :]).mean(axis=1)
    best = int(np.argmax(acc_feature))
    out: dict[str, Any] = {
        "per_feature": acc_feature,
        "best_feature": best,
        "best_feature_acc": float(acc_feature[best]),
    }
    out |= {name: float((pr == y).mean()) for name, pr in pred.items()}
    out["max"] = max(out["best_feature_acc"], out["nested"], out["centroid"], out["knn"])
    return out


# --------------------------------------------------------------------------- report


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(collection: Collection, *, n_small: int, n_big: int, seed: int = 0) -> str:
    """The markdown report: per-method table, pooled accuracies, medians per dataset."""
    records = collection.records
    lines: list[str] = []
    methods = list(dict.fromkeys(r["method"] for r in records))
    lines.append(
        "| method | releases | best side feature | its CV acc | nested | centroid | 5-NN "
        "| with answer (max) | post s median n_small / n_big | finished-created s median "
        "n_small / n_big | failed |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method in methods:
        recs = [r for r in records if r["method"] == method]
        x, y, names = features(recs)
        res = cv_accuracy(x, y, seed=seed)
        xa, ya, _ = features(recs, SIDE_FEATURES + ANSWER_FEATURES)
        with_answer = cv_accuracy(xa, ya, seed=seed)["max"]
        rows = [_row(r) for r in recs]
        med = {
            key: [
                _median([row[key] for row, r in zip(rows, recs, strict=True) if r["label"] == lab])
                for lab in (0, 1)
            ]
            for key in ("post_seconds", "finished_minus_created")
        }
        failed = sum(int(row["failed"]) for row in rows)
        lines.append(
            f"| {method} | {len(recs)} | {names[res['best_feature']]} | "
            f"{res['best_feature_acc']:.3f} | {res['nested']:.3f} | {res['centroid']:.3f} | "
            f"{res['knn']:.3f} | {with_answer:.3f} | "
            f"{med['post_seconds'][0]:.3f} / {med['post_seconds'][1]:.3f} | "
            f"{med['finished_minus_created'][0]:.3f} / {med['finished_minus_created'][1]:.3f} | "
            f"{failed} |"
        )
    x, y, names = features(records)
    groups = np.array([r["method"] for r in records])
    pooled = {
        "global": cv_accuracy(x, y, seed=seed),
        "per method": cv_accuracy(x, y, groups=groups, seed=seed),
    }
    xa, ya, names_a = features(records, SIDE_FEATURES + ANSWER_FEATURES)
    pooled_answer = {
        "global": cv_accuracy(xa, ya, seed=seed),
        "per method": cv_accuracy(xa, ya, groups=groups, seed=seed),
    }
    lines.append("")
    lines.append(
        f"Pooled over {len(records)} releases ({int((y == 0).sum())} on n = {n_small}, "
        f"{int((y == 1).sum())} on n = {n_big}), 10-fold stratified CV:"
    )
    lines.append("")
    lines.append(
        "| features | pooling | best single feature | its acc | nested | centroid | 5-NN | max |"
    )
    lines.append("|---|---|---|---:|---:|---:|---:|---:|")
    for label, results, nm in (
        ("side channels", pooled, names),
        ("with the answer", pooled_answer, names_a),
    ):
        for how, res in results.items():
            lines.append(
                f"| {label} | {how} | {nm[res['best_feature']]} | {res['best_feature_acc']:.3f} "
                f"| {res['nested']:.3f} | {res['centroid']:.3f} | {res['knn']:.3f} "
                f"| {res['max']:.3f} |"
            )
    side = max(res["max"] for res in pooled.values())
    lines.append("")
    lines.append(
        f"**Classifier accuracy (side channels, pooled, max over classifiers): {side:.3f}** "
        f"(target <= 0.600)"
    )
    lines.append("")
    lines.append("Per-feature CV accuracy, pooled (global / per method):")
    lines.append("")
    lines.append("| feature | global | per method |")
    lines.append("|---|---:|---:|")
    for i, name in enumerate(names):
        lines.append(
            f"| {name} | {pooled['global']['per_feature'][i]:.3f} "
            f"| {pooled['per method']['per_feature'][i]:.3f} |"
        )
    rows = [_row(r) for r in records]
    lines.append("")
    for key in ("post_seconds", "finished_minus_created", "seen_done_seconds"):
        meds = [
            _median([row[key] for row, r in zip(rows, records, strict=True) if r["label"] == lab])
            for lab in (0, 1)
        ]
        lines.append(
            f"- median {key}: n = {n_small}: {meds[0]:.4f} s, n = {n_big}: {meds[1]:.4f} s"
        )
    statuses: dict[str, int] = {}
    for r in records:
        key = f"{r['post_status']}/{r['get_body']['status']}"
        statuses[key] = statuses.get(key, 0) + 1
    lines.append(f"- POST status / final status: {statuses}")
    if collection.refused:
        for method, why in collection.refused.items():
            lines.append(f"- refused: {method}: {why}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--methods", default=None, help="comma-separated (default: all listed)")
    parser.add_argument("--n-small", type=int, default=10)
    parser.add_argument("--n-big", type=int, default=5 * 10**7)
    parser.add_argument("--epsilon", default="0.001", help="per release (the default minimum)")
    parser.add_argument("--delta", default="1e-6", help="for methods that need one")
    parser.add_argument("--wait", type=float, default=0.2, help="Prefer: wait=N in half the rounds")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up releases per dataset")
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--code", type=Path, default=None, help="serve this checkout instead")
    parser.add_argument("--json", type=Path, default=None, help="write the raw records here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    code = args.code.resolve() if args.code else None
    tmp = tempfile.mkdtemp(prefix="dpquant-bench-timing-")
    pg = None
    drop: Callable[[], None] | None = None
    proc = None
    try:
        server_url = os.environ.get("DPQUANT_BENCH_DATABASE_URL")
        if server_url is None:
            import pgserver

            from app.core.db import normalize_url

            pg = pgserver.get_server(  # type: ignore[attr-defined]
                Path(tmp) / "pgdata", cleanup_mode="stop"
            )
            server_url = normalize_url(pg.get_uri())
        url, drop = _fresh_database(server_url)
        migrate(url, code)
        admin = "dpq_bench-" + secrets.token_urlsafe(32)
        port = free_port()
        proc = start_server(url, admin, port, code, defaults=True)
        t0 = time.monotonic()
        collection = collect(
            f"http://127.0.0.1:{port}",
            admin,
            methods=args.methods.split(",") if args.methods else None,
            rounds=args.rounds,
            n_small=args.n_small,
            n_big=args.n_big,
            epsilon=args.epsilon,
            delta=args.delta,
            prefer_wait=args.wait,
            warmup=args.warmup,
            seed=args.seed,
            poll_s=args.poll_ms / 1000,
            log=None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True)),
        )
        elapsed = time.monotonic() - t0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
        if drop is not None:
            drop()
        if pg is not None:
            pg.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "code": str(code or "this checkout"),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "refused": collection.refused,
                    "records": collection.records,
                },
                indent=1,
                default=str,
            )
        )
    print(f"\nserver code: {code or 'this checkout'}; collection took {elapsed:.0f} s\n")
    print(report(collection, n_small=args.n_small, n_big=args.n_big, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
