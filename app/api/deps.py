"""FastAPI dependencies: the request's database session; who is calling, and may they?"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from app.api.middleware.ratelimit import MAX_TOKEN_LENGTH, AuthFailureGuard
from app.auth.oidc import Verifier, looks_like_jwt, subject_principal
from app.auth.service import authenticate, hash_key
from app.core.db import CommitOutcomeUnknown, sqlstate
from app.core.errors import DpquantError, forbidden, unauthorized
from app.core.pg import run_async
from app.core.principal import Principal


def get_session(request: Request) -> Iterator[Session]:
    """One session per request: commit on success, roll back on error, always close."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    session = factory()
    try:
        yield session
        try:
            session.commit()
        except DBAPIError as exc:
            if exc.connection_invalidated or sqlstate(exc) is None:
                raise CommitOutcomeUnknown() from None
            raise
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


#: One session per request. Declared with ``scope="function"`` so the commit happens
#: *before* the response is sent, and a failed commit becomes an error response instead of
#: a success that was never stored.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

bearer = HTTPBearer(
    auto_error=False,
    description="API key, or an OpenID Connect token of the configured issuer: "
    "`Authorization: Bearer <key or token>`",
)


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Authenticate the bearer key or OpenID Connect token; 401 when missing, unknown,
    revoked, expired or not verifying (403 when a token's claims grant no role).

    On the event loop, with a pooled connection of the hot path given back before the
    endpoint runs (an endpoint that waits, like a release waiting for its worker, holds no
    connection while it waits). A lookup that lost its connection is simply run again.
    Keys and tokens share the per-address limit on failed authentications.
    """
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    raw = credentials.credentials
    verifier: Verifier | None = getattr(request.app.state, "oidc", None)
    token = verifier is not None and looks_like_jwt(raw)
    if not token and len(raw) > MAX_TOKEN_LENGTH:  # a token's length: the verifier's check
        raise unauthorized()
    guard: AuthFailureGuard | None = getattr(request.app.state, "auth_guard", None)
    address = request.client.host if request.client is not None else ""
    digest = hash_key(raw)
    if guard is not None:
        wait = guard.admit(address, digest)
        if wait > 0.0:
            retry_after = max(1, math.ceil(wait))
            raise DpquantError(
                429,
                "rate_limited",
                f"too many failed authentications from this address; retry after {retry_after} s",
                headers={"Retry-After": str(retry_after)},
            )
    try:
        if token:
            assert verifier is not None
            principal = await _token_principal(request, verifier, raw)
        else:
            principal = await run_async(
                request.app.state.pg_pool,
                functools.partial(authenticate, raw=raw),
                idempotent=True,
            )
    except DpquantError as exc:
        if exc.status_code == 401 and guard is not None:
            guard.failed(address)
        raise
    if principal is None:
        if guard is not None:
            guard.failed(address)
        raise unauthorized()
    if guard is not None:
        guard.succeeded(digest)
    return principal


async def _token_principal(request: Request, verifier: Verifier, raw: str) -> Principal | None:
    """An OpenID Connect token's principal (:mod:`app.auth.oidc`; None: its subject was
    revoked); 401 unless it verifies, 403 when its claims grant no role (or an unscoped
    non-admin)."""
    claims = await verifier.claims(raw)
    role, datasets = verifier.grants(claims)
    principal: Principal | None = await run_async(
        request.app.state.pg_pool,
        functools.partial(
            subject_principal, issuer=verifier.config.issuer, claims=claims, role=role,
            datasets=datasets,
        ),
    )  # fmt: skip
    return principal


def _requires(*roles: str) -> object:
    # One dependency (authentication and the role check) on the bearer scheme: FastAPI
    # resolves every level of a dependency tree on every request.
    async def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        principal = await get_principal(request, credentials)
        if principal.role not in roles:
            raise forbidden(f"requires role {' or '.join(roles)}")
        return principal

    return Depends(dependency)


AdminDep = Annotated[Principal, _requires("admin")]
AnalystDep = Annotated[Principal, _requires("admin", "analyst")]
ReaderDep = Annotated[Principal, _requires("admin", "analyst", "viewer")]
