"""FastAPI dependencies: who is calling, and may they?"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.service import authenticate
from app.db import SessionDep
from app.errors import forbidden, unauthorized

bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


@dataclass(frozen=True)
class Principal:
    """The authenticated key: its id, role and optional dataset scope."""

    key_id: uuid.UUID
    role: str
    scope: uuid.UUID | None

    def can_see(self, dataset_id: uuid.UUID) -> bool:
        """True when the dataset lies inside this key's scope."""
        return self.scope is None or self.scope == dataset_id


def get_principal(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """Authenticate the bearer key; 401 when missing, unknown or revoked."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    key = authenticate(session, raw=credentials.credentials)
    if key is None:
        raise unauthorized()
    return Principal(key_id=key.id, role=key.role, scope=key.dataset_id)


def _requires(*roles: str) -> object:
    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            raise forbidden(f"requires role {' or '.join(roles)}")
        return principal

    return Depends(dependency)


AdminDep = Annotated[Principal, _requires("admin")]
AnalystDep = Annotated[Principal, _requires("admin", "analyst")]
ReaderDep = Annotated[Principal, _requires("admin", "analyst", "viewer")]
