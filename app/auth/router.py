"""Admin endpoints for API keys."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from app.auth import service
from app.auth.deps import AdminDep, ReaderDep
from app.auth.schemas import KeyCreate, KeyCreated, KeyList, KeyPublic, KeySelf
from app.db import SessionDep
from app.errors import error_responses
from app.ops.http import DecimalJSONRoute

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=DecimalJSONRoute)


@router.post(
    "",
    status_code=201,
    response_model=KeyCreated,
    responses=error_responses(401, 403, 422, 503),
    summary="Create an API key (the secret is returned once)",
)
def create_key(body: KeyCreate, session: SessionDep, principal: AdminDep) -> KeyCreated:
    """Create a key with a role and optional dataset scope; only its hash is stored."""
    key, raw = service.create_key(
        session, role=body.role, dataset_id=body.dataset_id, name=body.name
    )
    return KeyCreated(**KeyPublic.model_validate(key).model_dump(), key=raw)


@router.get(
    "",
    response_model=KeyList,
    responses=error_responses(401, 403, 503),
    summary="List API keys",
)
def list_keys(session: SessionDep, principal: AdminDep) -> KeyList:
    """Every key with its prefix, role, scope and revocation time; never a secret."""
    return KeyList(items=[KeyPublic.model_validate(k) for k in service.list_keys(session)])


@router.get(
    "/me",
    response_model=KeySelf,
    responses=error_responses(401, 403, 503),
    summary="Describe the calling key (role and scope)",
)
def read_own_key(principal: ReaderDep) -> KeySelf:
    """The calling key's id, role and dataset scope, so a dashboard knows what to show."""
    return KeySelf(id=principal.key_id, role=principal.role, dataset_id=principal.scope)


@router.delete(
    "/{key_id}",
    status_code=204,
    response_class=Response,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Revoke an API key",
)
def revoke_key(key_id: uuid.UUID, session: SessionDep, principal: AdminDep) -> Response:
    """Revoke a key; it stops working with the next request."""
    service.revoke_key(session, key_id=key_id)
    return Response(status_code=204)
