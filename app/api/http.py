"""HTTP helpers shared by the routers: decimal-exact JSON bodies, ETags, pagination cursors."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any, NoReturn

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app.core.errors import invalid


def _reject_constant(name: str) -> NoReturn:
    # NaN, Infinity and -Infinity are not JSON; the stdlib accepts them unless told otherwise.
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


class DecimalJSONRequest(Request):
    """A request whose JSON numbers with a fraction or exponent parse as ``Decimal``.

    Budgets are exact decimals end to end: ``0.1`` in a body is ``Decimal("0.1")``, never the
    binary float nearest to it. Float fields still accept the decimals (pydantic converts).
    """

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, parse_float=Decimal, parse_constant=_reject_constant)
            except (RecursionError, UnicodeDecodeError):
                # absurd nesting or bytes that are not UTF-8: malformed JSON (422), not a 400
                raise json.JSONDecodeError("not parseable as JSON", "", 0) from None
        return self._json


class DecimalJSONRoute(APIRoute):
    """Route class that hands endpoints a :class:`DecimalJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            return await original(DecimalJSONRequest(request.scope, request.receive))

        return handler


def json_bytes(model: BaseModel) -> bytes:
    """Deterministic JSON of a response model (same object, same bytes)."""
    return model.model_dump_json().encode()


def etag_of(body: bytes) -> str:
    """A strong ETag derived from the body bytes."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def conditional_json(request: Request, model: BaseModel, status_code: int = 200) -> Response:
    """A JSON response with an ``ETag``; ``304 Not Modified`` when ``If-None-Match`` matches."""
    body = json_bytes(model)
    tag = etag_of(body)
    headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
    inm = request.headers.get("if-none-match")
    if inm is not None:
        candidates = {c.strip().removeprefix("W/") for c in inm.split(",")}
        if tag in candidates or "*" in candidates:
            return Response(status_code=304, headers=headers)
    return Response(body, status_code=status_code, media_type="application/json", headers=headers)


#: Cursor positions are PostgreSQL ``bigint`` keys (identity columns start at 1).
MAX_CURSOR_POSITION = 2**63


def encode_cursor(position: int) -> str:
    """A cursor for keyset pagination over an admin's list (audit log, ledger) or a
    position the caller can count itself (an offset into its own datasets). Lists that
    readers page through use :func:`encode_item_cursor`: a global position would count
    rows outside the caller's scope."""
    return base64.urlsafe_b64encode(f"v1:{position}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    """The position inside a cursor; 422 naming ``query.cursor`` when it is not one of ours."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, _, number = raw.partition(":")
        if tag != "v1" or not number.isdigit():
            raise ValueError
        position = int(number)
        if not 0 < position < MAX_CURSOR_POSITION:
            raise ValueError
        return position
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid("query.cursor", "is not a cursor returned by this API") from None


_ITEM_TAG = "i1"


def encode_item_cursor(item_id: uuid.UUID) -> str:
    """A cursor that names the last item of a page by the id the page already shows: it
    reveals nothing the caller did not receive (a cursor on the global release sequence would
    let a key scoped to one dataset count other datasets' releases between two pages)."""
    return base64.urlsafe_b64encode(f"{_ITEM_TAG}:{item_id.hex}".encode()).decode().rstrip("=")


def decode_item_cursor(cursor: str | None) -> uuid.UUID | None:
    """The item id inside a cursor of :func:`encode_item_cursor`; 422 naming
    ``query.cursor`` when it is not one."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, _, value = raw.partition(":")
        if tag != _ITEM_TAG or len(value) != 32:
            raise ValueError
        return uuid.UUID(hex=value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid("query.cursor", "is not a cursor returned by this API") from None
