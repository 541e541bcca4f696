"""FastAPI dependencies: who is calling, and may they?"""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.principal import Principal
from app.auth.service import authenticate
from app.errors import forbidden, unauthorized
from app.pg import run_async

bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Authenticate the bearer key; 401 when missing, unknown, revoked or expired.

    On the event loop, with a pooled connection of the hot path given back before the
    endpoint runs (an endpoint that waits, like a release waiting for its worker, holds no
    connection while it waits). A lookup that lost its connection is simply run again.
    """
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    principal = await run_async(
        request.app.state.pg_pool,
        functools.partial(authenticate, raw=credentials.credentials),
        idempotent=True,
    )
    if principal is None:
        raise unauthorized()
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
