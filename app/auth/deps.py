"""FastAPI dependencies: who is calling, and may they?"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from app.auth.principal import Principal
from app.auth.service import authenticate
from app.errors import forbidden, unauthorized

bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Authenticate the bearer key; 401 when missing, unknown, revoked or expired.

    Uses its own short session, closed before the endpoint runs, so that an endpoint
    that waits (a release waiting for its worker) holds no connection while it waits.
    """
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    # Autocommit: a lookup (and at most one single-statement write per key and minute) needs
    # no transaction, which saves the BEGIN and ROLLBACK round trips on every request.
    factory: sessionmaker[Session] = request.app.state.autocommit_factory
    with factory() as session, session.begin():
        principal = authenticate(session, raw=credentials.credentials)
    if principal is None:
        raise unauthorized()
    return principal


def _requires(*roles: str) -> object:
    # async: a role check does no I/O, and a sync dependency costs a thread-pool round trip
    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            raise forbidden(f"requires role {' or '.join(roles)}")
        return principal

    return Depends(dependency)


AdminDep = Annotated[Principal, _requires("admin")]
AnalystDep = Annotated[Principal, _requires("admin", "analyst")]
ReaderDep = Annotated[Principal, _requires("admin", "analyst", "viewer")]
