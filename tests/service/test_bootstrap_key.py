"""The bootstrap admin key (issue 28): a server that cannot listen changes no key, and a key
the server retired comes back with the same value; one an admin revoked does not."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from app.auth.service import ensure_bootstrap_key, retire_bootstrap_keys, revoke_key
from app.core.db import upgrade_database
from tests.servers import free_port
from tests.service.test_cli import _wait_until_ready
from tests.support import app_settings, auth, serving


def _fresh_key() -> str:
    return "dpq_" + secrets.token_urlsafe(32)


def _env(url: str, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPQUANT_")}
    env |= {"DPQUANT_DATABASE_URL": url, "DPQUANT_LOG_LEVEL": "INFO"}
    if key is not None:
        env["DPQUANT_BOOTSTRAP_ADMIN_KEY"] = key
    return env


def _serve(port: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "app.runtime.cli", "serve", "--port", str(port),
            "--workers", str(workers), "--release-workers", "0"]  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_a_server_that_cannot_listen_changes_no_key(
    make_schema: Callable[[], str], workers: int
) -> None:
    """A second ``dpquant serve`` on the running server's port, without the variable, used to
    revoke the running server's bootstrap key before failing to bind (and with SO_REUSEPORT
    web processes it could join the port instead). It now fails before it touches anything:
    no "listening on", a non-zero exit, the running server's key still answers 200."""
    url = make_schema()
    upgrade_database(url)
    key = _fresh_key()
    port = free_port()
    first = subprocess.Popen(
        _serve(port, workers),
        env=_env(url, key),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_ready(first, port)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/v1/keys/me", headers=auth(key)).status_code == 200
        second = subprocess.run(
            _serve(port, workers),
            env=_env(url, None),
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = second.stdout + second.stderr
        assert second.returncode != 0, output
        assert "cannot listen" in output and "listening on" not in output, output
        for _ in range(5):  # every web process of the first server still takes the key
            assert httpx.get(f"{base}/v1/keys/me", headers=auth(key)).status_code == 200
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                retired = conn.execute(
                    text("SELECT count(*) FROM audit_event WHERE action = 'key.retire'")
                ).scalar_one()
                live = conn.execute(
                    text("SELECT count(*) FROM api_key WHERE bootstrap AND revoked_at IS NULL")
                ).scalar_one()
        finally:
            engine.dispose()
        assert retired == 0 and live == 1
    finally:
        first.terminate()
        first.wait(timeout=60)


def test_a_retired_key_comes_back_and_a_revoked_one_does_not(
    make_schema: Callable[[], str],
) -> None:
    """Started without the variable, the server retires the bootstrap key; started with the
    same value again, the key answers 200 again (it used to log "registered" and stay 401).
    A bootstrap key an admin revoked stays revoked whatever the variable says."""
    url = make_schema()
    upgrade_database(url)
    key = _fresh_key()
    from app.api.factory import create_app

    def status(with_key: str | None) -> int:
        app = create_app(app_settings(url, admin_key=with_key))  # type: ignore[arg-type]
        with serving(app) as client:
            return client.get("/v1/keys/me", headers=auth(key)).status_code

    assert status(key) == 200
    assert status(None) == 401  # retired: the variable is unset
    assert status(key) == 200  # the same value again: restored
    assert status(_fresh_key()) == 401  # another value: retired again
    assert status(key) == 200
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            actions = conn.execute(
                text(
                    "SELECT action FROM audit_event"
                    " WHERE action IN ('key.retire', 'key.restore') ORDER BY id"
                )
            ).scalars()
            # unset: retire; same value: restore; another value: retire it; back: restore
            # it and retire the other
            assert list(actions) == [
                "key.retire",
                "key.restore",
                "key.retire",
                "key.restore",
                "key.retire",
            ]
        factory = sessionmaker(engine, expire_on_commit=False)
        with factory.begin() as session:
            outcome = ensure_bootstrap_key(session, raw=key)
            assert outcome.live and not outcome.registered and not outcome.restored
            key_id = session.execute(
                text("SELECT id FROM api_key WHERE bootstrap AND revoked_at IS NULL")
            ).scalar_one()
            revoke_key(session, key_id=key_id)  # an admin revokes it
        assert status(key) == 401
        with factory.begin() as session:
            assert retire_bootstrap_keys(session) == 0
            assert not ensure_bootstrap_key(session, raw=key).live
    finally:
        engine.dispose()
