"""The application factory.

``create_app()`` builds the FastAPI app; its lifespan connects to PostgreSQL (starting the
embedded server and applying migrations when ``DPQUANT_DATABASE_URL`` is unset), creates
the engine and session factory, and registers the bootstrap admin key if one is configured.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from app import __version__
from app.api.errors import install_error_handlers
from app.api.middleware.bodylimit import BodyLimitMiddleware
from app.api.middleware.concurrency import AdmissionMiddleware
from app.api.middleware.guard import GuardMiddleware
from app.api.middleware.ratelimit import AuthFailureGuard, RateLimitMiddleware
from app.api.middleware.timing import ReleaseTimingMiddleware
from app.api.openapi import install_openapi
from app.api.routes.audit import router as audit_router
from app.api.routes.datasets import router as datasets_router
from app.api.routes.explain import router as explain_router
from app.api.routes.group_uploads import router as group_uploads_router
from app.api.routes.keys import router as keys_router
from app.api.routes.ledger import router as ledger_router
from app.api.routes.ops import router as ops_router
from app.api.routes.releases import router as releases_router
from app.api.routes.uploads import router as uploads_router
from app.api.ui.docs import install_docs
from app.api.ui.router import install_dashboard
from app.auth.oidc import oidc_verifier
from app.auth.service import ensure_bootstrap_key, retire_bootstrap_keys
from app.core import tracing
from app.core.config import Settings
from app.core.db import (
    current_revisions,
    head_revisions,
    make_engine,
    redact_url,
    resolve_database_url,
    upgrade_database,
)
from app.core.metrics import RequestMetricsMiddleware
from app.core.pg import HotPool
from app.datasets.service import VALUES_CACHE
from app.releases.planning import FiguresCache
from app.releases.waiter import CompletionHub

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Differentially private quantiles over datasets that never leave the server.

Every release is priced in (epsilon, delta), debited atomically from the dataset's
append-only ledger and stored; reading releases and budgets is free. Authenticate with
`Authorization: Bearer <key>`. Errors are `{"type": ..., "detail": ...}`.
Budget figures are exact decimals, written as JSON strings in responses.

Releases are reserved, then sampled: a query is first stored as `pending` together with the
debit of its full cost (refusals read no data and run nothing), then a worker runs the
mechanism and the release becomes `done` (with `estimates`) or `failed` (with `failure`).
A failed release keeps its debit, because whether and when a run fails may depend on the
data; it is final (a retry with the same `Idempotency-Key` returns it). Analysts and
viewers see a release finished only from its publication time on: its run's start plus a
bound computed from public figures (`finished_at`), never the run's own finish time. Send
`Prefer: respond-async` to get `202 Accepted` with `Location: /v1/releases/{id}` at once and
poll it (ETag / If-None-Match); without it the call waits and answers `201` with the
finished release (or `202` if the wait runs out).
"""


def operation_id(route: APIRoute) -> str:
    """Stable, readable operation ids: the endpoint function's name (``create_release``)."""
    return route.name


def _start(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    VALUES_CACHE.max_bytes = settings.values_cache_bytes
    url, embedded = resolve_database_url(settings)
    if embedded:
        upgrade_database(url)
    engine = make_engine(url, settings)
    app.state.database_url = url
    app.state.engine = engine
    app.state.session_factory = sessionmaker(engine, expire_on_commit=False)
    app.state.migration_heads = head_revisions()
    logger.info("database: %s", "embedded PostgreSQL" if embedded else redact_url(url))
    if current_revisions(engine) != app.state.migration_heads:
        logger.error("the database is not migrated (run `dpquant migrate`); /readyz says so")
        return
    if app.state.reconcile_bootstrap:
        reconcile_bootstrap_key(app.state.session_factory, settings)


def reconcile_bootstrap_key(session_factory: sessionmaker[Session], settings: Settings) -> None:
    """Register (or restore) the key ``DPQUANT_BOOTSTRAP_ADMIN_KEY`` names and retire the
    others; with the variable unset, retire every bootstrap key. Logs what it did.

    ``dpquant serve`` calls it once, after its port is bound (a server that cannot listen
    changes no key); an app built by :func:`create_app` calls it at startup.
    """
    with session_factory.begin() as session:
        if settings.bootstrap_admin_key is not None:
            outcome = ensure_bootstrap_key(
                session, raw=settings.bootstrap_admin_key.get_secret_value()
            )
            if not outcome.live:
                logger.error(
                    "the key DPQUANT_BOOTSTRAP_ADMIN_KEY names was revoked by an admin and"
                    " stays revoked: set a new value to get a bootstrap admin key"
                )
            else:
                logger.info(
                    "bootstrap admin key %s from DPQUANT_BOOTSTRAP_ADMIN_KEY (stored hashed)%s",
                    "registered"
                    if outcome.registered
                    else "restored"
                    if outcome.restored
                    else "in place",
                    f"; {outcome.retired} earlier bootstrap key(s) retired"
                    if outcome.retired
                    else "",
                )
        else:
            retired = retire_bootstrap_keys(session)
            if retired:
                logger.warning(
                    "DPQUANT_BOOTSTRAP_ADMIN_KEY is unset: %d bootstrap key(s) retired"
                    " (a start with the same value restores them)",
                    retired,
                )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Connect at startup (and listen for finished releases); dispose of the pool at shutdown."""
    await run_in_threadpool(_start, app)
    # The hot paths' connections (authentication, reservations, release reads; app/core/pg.py).
    pool = HotPool(app.state.database_url, app.state.settings)
    await pool.open()
    app.state.pg_pool = pool
    hub = CompletionHub(app.state.database_url)
    app.state.completion_hub = hub
    hub.start()
    if getattr(app.state, "freeze_gc", False):
        # A server process: what exists now (modules, compiled kernels, the app) lives as
        # long as the process; keep it out of the collector's full passes (~100 ms each).
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        await hub.stop()
        await pool.close()
        app.state.engine.dispose()


def create_server_app() -> FastAPI:
    """The app as ``dpquant serve`` runs it: one per server process, its long-lived objects
    frozen out of the garbage collector after startup (tests build apps with
    :func:`create_app`, which leaves the collector alone)."""
    app = create_app()
    app.state.freeze_gc = True
    # `dpquant serve` reconciles the bootstrap key once, after binding its port
    app.state.reconcile_bootstrap = False
    return app


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the application (no I/O happens until the lifespan starts)."""
    app = FastAPI(
        title="dpquant",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        # /docs and /redoc are served from packaged assets below (FastAPI's load a CDN)
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings or Settings()
    app.state.plan_figures = FiguresCache()
    app.state.reconcile_bootstrap = True
    failures = app.state.settings.auth_failures_per_minute
    app.state.auth_guard = (
        AuthFailureGuard(per_minute=failures, burst=failures) if failures > 0 else None
    )
    app.state.oidc = oidc_verifier(app.state.settings)
    if app.state.settings.otel_endpoint:
        tracing.configure(app.state.settings.otel_endpoint, service="dpquant-api")
    if tracing.enabled():
        tracing.instrument_app(app)
    install_error_handlers(app)
    app.include_router(ops_router)
    app.include_router(datasets_router)
    app.include_router(uploads_router)
    app.include_router(group_uploads_router)
    app.include_router(ledger_router)
    app.include_router(releases_router)
    app.include_router(explain_router)
    app.include_router(keys_router)
    app.include_router(audit_router)
    install_docs(app)
    install_dashboard(app)
    install_openapi(app)
    # Hardening: admission control against thread/connection-pool starvation,
    # uniform timing of quantile queries, the request body limit, then the per-key rate
    # limit (app/api/middleware/: concurrency.py, timing.py, bodylimit.py, ratelimit.py).
    settings = app.state.settings
    app.add_middleware(
        AdmissionMiddleware,
        connections=settings.pool_size + settings.max_overflow,
        queue_timeout_s=settings.pool_timeout_s,
    )
    app.add_middleware(ReleaseTimingMiddleware, min_release_ms=settings.min_release_ms)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    if settings.rate_limit_per_minute > 0:
        app.add_middleware(
            RateLimitMiddleware,
            per_minute=settings.rate_limit_per_minute,
            burst=settings.rate_limit_burst,
        )
    # Latency of every request, by route template (app/core/metrics.py).
    app.add_middleware(RequestMetricsMiddleware)
    # Outermost of ours: escaped exceptions become a JSON 503 without a logged message and
    # without closing the connection (app/api/middleware/guard.py).
    app.add_middleware(GuardMiddleware)
    return app
