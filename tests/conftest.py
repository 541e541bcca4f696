"""Shared test fixtures: one real PostgreSQL for the whole test session, fresh schemas on it.

PostgreSQL comes from ``DPQUANT_TEST_DATABASE_URL`` when set, otherwise from an embedded
``pgserver`` started once per session in a temporary directory. Suites take fresh, empty
schemas from ``schema_factory`` (dropped at the end of the session), so runs never collide on
a shared server; they build them with the Alembic migrations, never with ``create_all``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.core.db import normalize_url

#: Suites that touch no database and start no process.
PURE_SUITES = frozenset({"mechanisms", "planner", "experiments"})


#: Database-backed suites run as two groups, each on one xdist worker in order, with its own
#: embedded PostgreSQL and session fixtures: the hardening suite (real processes, private
#: clusters) and the rest (measured 395 s and 390 s of test time on the 2-CPU machine).
DATABASE_GROUPS = {"hardening": "db-processes"}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, compile the mechanisms' numba kernels into their on-disk cache once,
    before the workers start (this hook runs ahead of xdist's).

    On a fresh checkout the cache is empty, and every process that starts before some
    process has written it compiles the same kernels again: the xdist workers, and each
    release worker the tests start, which compiles every mechanism as it warms up. Workers,
    and runs without xdist, do nothing here.
    """
    if hasattr(session.config, "workerinput") or not session.config.getoption("numprocesses", 0):
        return  # a worker, or a run in one process (which compiles each kernel once anyway)
    _ensure_embedded_pg_user()
    import numpy as np

    from app.mechanisms.jointexp import sample_interval_sequence
    from app.runtime.worker import warm_up

    warm_up()  # every mechanism on a grid, as a release worker does
    rng = np.random.default_rng(0)
    logw = np.zeros(8)
    pos = np.arange(8, dtype=np.int64)
    gaps = np.full(4, 7.0 / 4.0)
    for kernel in ("scaled", "ext", "log"):
        sample_interval_sequence(logw, pos, gaps, 0.5, rng, force_log_space=True, log_kernel=kernel)
    sample_interval_sequence(logw, pos, gaps, 0.5, rng, tilt=0.25)


def _ensure_embedded_pg_user() -> None:
    """As root, embedded PostgreSQL runs as a system user ``pgserver`` that pgserver creates
    on first use. Two xdist workers starting their servers at once on a machine where it
    does not exist yet both run ``useradd``: one chowns its data directory to a uid the
    other's entry replaced, and initdb fails ("could not change permissions", seen on a
    fresh machine). Create it once here, before the workers start."""
    if os.environ.get("DPQUANT_TEST_DATABASE_URL") or not hasattr(os, "geteuid"):
        return
    if os.geteuid() != 0:
        return
    from pgserver.utils import ensure_user_exists

    ensure_user_exists("pgserver")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs ``-n 3`` or more with ``--dist loadgroup``)
    every test outside the pure suites joins one of two groups (:data:`DATABASE_GROUPS`, the
    rest ``db-service``), so each group runs on one worker, in order, with one PostgreSQL and
    one set of session fixtures; the pure suites spread over the workers."""
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.path).relative_to(root).parts
        if len(parts) < 2 or parts[0] not in PURE_SUITES:
            group = DATABASE_GROUPS.get(parts[0], "db-service") if len(parts) > 1 else "db-service"
            item.add_marker(pytest.mark.xdist_group(group))


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` through libpq's ``options``."""
    parsed = make_url(normalize_url(url))
    return parsed.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False
    )


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A PostgreSQL server URL (external or embedded), without a schema."""
    external = os.environ.get("DPQUANT_TEST_DATABASE_URL")
    if external:
        yield normalize_url(external)
        return
    import pgserver

    tmp = tempfile.mkdtemp(prefix="dpquant-test-pg-")
    server = pgserver.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
    try:
        yield normalize_url(server.get_uri())
    finally:
        server.cleanup()  # stop PostgreSQL before its directory disappears
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def schema_factory(pg_server_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh, empty schemas (dropped at the end of the session); returns URLs."""
    created: list[str] = []
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")

    def factory() -> str:
        name = "dpq_test_" + uuid.uuid4().hex[:12]
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
        created.append(name)
        return with_schema(pg_server_url, name)

    yield factory
    with admin.connect() as conn:
        for name in created:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    admin.dispose()
