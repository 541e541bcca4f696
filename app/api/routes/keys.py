"""Admin endpoints for API keys."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response

from app.api.deps import AdminDep, ReaderDep, SessionDep
from app.api.http import DecimalJSONRoute
from app.auth import service
from app.auth.schemas import KeyCaps, KeyCreate, KeyCreated, KeyList, KeyPublic, KeySelf
from app.core.errors import error_responses, invalid

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=DecimalJSONRoute)


def _learn(request: Request, raw: str) -> None:
    """A key this process just made is a known key for the failed-authentication guard (it
    is let through from an address that has spent its failures; its lookup still decides)."""
    guard = getattr(request.app.state, "auth_guard", None)
    if guard is not None:
        guard.succeeded(service.hash_key(raw))


@router.post(
    "",
    status_code=201,
    response_model=KeyCreated,
    responses=error_responses(401, 403, 422, 503),
    summary="Create an API key (the secret is returned once)",
)
def create_key(
    body: KeyCreate, request: Request, session: SessionDep, principal: AdminDep
) -> KeyCreated:
    """Create a key with a role, optional dataset scope, spending caps and expiry; only its
    hash is stored."""
    key, raw = service.create_key(
        session,
        role=body.role,
        dataset_id=body.dataset_id,
        name=body.name,
        actor=principal,
        max_epsilon=body.max_epsilon,
        max_delta=body.max_delta,
        expires_at=body.expires_at,
    )
    _learn(request, raw)
    return KeyCreated(**KeyPublic.model_validate(key).model_dump(), key=raw)


@router.post(
    "/{key_id}/rotate",
    response_model=KeyCreated,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Rotate an API key: a new secret, returned once; the old one stops working",
)
def rotate_key(
    key_id: uuid.UUID, request: Request, session: SessionDep, principal: AdminDep
) -> KeyCreated:
    """Same id, role, scope, caps and expiry; a new secret (the old one fails at once)."""
    key, raw = service.rotate_key(session, key_id=key_id, actor=principal)
    _learn(request, raw)
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
    return KeySelf(
        id=principal.key_id,
        role=principal.role,
        dataset_id=principal.scope,
        datasets=None if principal.datasets is None else sorted(principal.datasets),
        subject=principal.subject,
    )


@router.patch(
    "/{key_id}",
    response_model=KeyPublic,
    responses=error_responses(401, 403, 404, 409, 422, 503),
    summary="Set the spending caps of a key or an OpenID Connect subject",
)
def set_key_caps(
    key_id: uuid.UUID, body: KeyCaps, session: SessionDep, principal: AdminDep
) -> KeyPublic:
    """`{"max_epsilon": "0.5"}` caps what the key (or the subject, listed with `kind`
    `oidc`) may spend in total; `null` removes a cap. Only the fields given change."""
    if not body.model_fields_set:
        raise invalid("body", "give max_epsilon and/or max_delta")
    caps = {name: getattr(body, name) for name in body.model_fields_set}
    key = service.set_caps(session, key_id=key_id, caps=caps, actor=principal)
    return KeyPublic.model_validate(key)


@router.delete(
    "/{key_id}",
    status_code=204,
    response_class=Response,
    responses=error_responses(401, 403, 404, 422, 503),
    summary="Revoke an API key",
)
def revoke_key(key_id: uuid.UUID, session: SessionDep, principal: AdminDep) -> Response:
    """Revoke a key; it stops working with the next request."""
    service.revoke_key(session, key_id=key_id, actor=principal)
    return Response(status_code=204)
