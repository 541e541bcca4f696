"""OpenID Connect bearer tokens, beside API keys.

A token is accepted when it is a JWS signed with RS256 or ES256 (``none`` and every HMAC
algorithm are refused: a verifier that took HS256 could be handed the issuer's *public* key as
the secret) by a key of the issuer's JWKS, and its ``iss``, ``aud``, ``exp`` and ``nbf``
check out (30 s of leeway). The JWKS comes from the issuer's discovery document (or
``DPQUANT_OIDC_JWKS_URL``), is cached, and is fetched again when a token names an unknown key
id, at most once per ``DPQUANT_OIDC_JWKS_REFRESH_S`` (a flood of made-up key ids costs one
fetch per interval). Signatures are checked by ``joserfc``.

The token's subject becomes a principal like a key (:func:`subject_principal`): an
``api_key`` row of kind ``oidc`` registered on its first request, whose id the ledger and the
audit log record and which carries the subject's spending cap and revocation. The role comes
from the role claim (``admin``, ``analyst``, ``viewer``; otherwise 403) and the scope from the
datasets claim (a list of dataset ids; absent: unscoped, which only an admin may be).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from app.core.errors import DpquantError, forbidden, unauthorized
from app.core.principal import Principal

#: Only these: public-key signatures (an HMAC token could be signed with the public key).
ALGORITHMS = ["RS256", "ES256"]
LEEWAY_S = 30
#: Longest token accepted (a signed JWT with a few claims is ~1 kB).
MAX_TOKEN_LENGTH = 8192
ROLES = ("admin", "analyst", "viewer")
_NAMESPACE = uuid.UUID("6f1c2e9a-5b3d-4a8e-9c7f-2d4b6a8e0c13")


def looks_like_jwt(raw: str) -> bool:
    """A compact JWS (three base64url parts); API keys start with ``dpq_`` and have no dot."""
    return raw.count(".") == 2 and raw.startswith("ey")


def subject_marker(issuer: str, subject: str) -> str:
    """The ``key_hash`` of a subject's row: ``o`` and 63 hex digits. A key's hash is 64 hex
    digits, so no key can ever hash to it (a caller presenting ``issuer|subject`` as a key
    gets nothing)."""
    return "o" + hashlib.sha256(f"oidc|{issuer}|{subject}".encode()).hexdigest()[:63]


@dataclass(frozen=True)
class Config:
    issuer: str
    audience: str
    jwks_url: str | None
    role_claim: str
    datasets_claim: str
    refresh_s: float


class Verifier:
    """Checks tokens of one issuer; one per process (the JWKS cache is shared)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._keys: KeySet | None = None
        self._fetched_at = -1e18
        self._lock = asyncio.Lock()

    async def _jwks_url(self, client: httpx.AsyncClient) -> str:
        if self.config.jwks_url:
            return self.config.jwks_url
        url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = (await client.get(url)).raise_for_status().json()
        if document.get("issuer") != self.config.issuer:
            raise ValueError("the discovery document names another issuer")
        return str(document["jwks_uri"])

    async def _refresh(self, *, force: bool) -> KeySet | None:
        async with self._lock:
            now = time.monotonic()
            if self._keys is not None and not force:
                return self._keys
            if self._keys is not None and now - self._fetched_at < self.config.refresh_s:
                return self._keys  # refetched recently: a made-up kid gets no new fetch
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    url = await self._jwks_url(client)
                    body = (await client.get(url)).raise_for_status().json()
                self._keys = KeySet.import_key_set(body)
            except (httpx.HTTPError, ValueError, KeyError, JoseError):
                if self._keys is None:
                    raise DpquantError(
                        503,
                        "identity_provider_unavailable",
                        "the identity provider's keys could not be fetched; retry",
                        headers={"Retry-After": "5"},
                    ) from None
            self._fetched_at = now
            return self._keys

    async def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``; 401 for anything that does not verify."""
        if len(token) > MAX_TOKEN_LENGTH:
            raise unauthorized()
        try:
            header = jws.extract_compact(token.encode()).protected
        except (JoseError, ValueError):
            raise unauthorized() from None
        if header.get("alg") not in ALGORITHMS:
            raise unauthorized()
        keys = await self._refresh(force=False)
        kid = header.get("kid")
        if keys is not None and kid is not None and not _has_kid(keys, kid):
            keys = await self._refresh(force=True)
        if keys is None:
            raise unauthorized()
        try:
            decoded = jwt.decode(token, keys, algorithms=ALGORITHMS)
            claims = dict(decoded.claims)
            registry = jwt.JWTClaimsRegistry(
                leeway=LEEWAY_S,
                iss={"essential": True, "value": self.config.issuer},
                aud={"essential": True, "value": self.config.audience},
                exp={"essential": True},
                sub={"essential": True},
            )
            registry.validate(claims)
        except (JoseError, ValueError, TypeError):
            raise unauthorized() from None
        return claims

    def grants(self, claims: dict[str, Any]) -> tuple[str, frozenset[uuid.UUID] | None]:
        """(role, datasets or None) of verified claims; 403 when they grant nothing."""
        role = claims.get(self.config.role_claim)
        if role not in ROLES:
            raise forbidden(f"the token's {self.config.role_claim} claim names no role")
        listed = claims.get(self.config.datasets_claim)
        if listed is None:
            if role != "admin":
                raise forbidden(
                    f"the token has no {self.config.datasets_claim} claim: only an admin "
                    "token may be unscoped"
                )
            return role, None
        if not isinstance(listed, list) or len(listed) > 1000:
            raise forbidden(f"the token's {self.config.datasets_claim} claim is not a list")
        try:
            return role, frozenset(uuid.UUID(str(d)) for d in listed)
        except ValueError:
            raise forbidden(
                f"the token's {self.config.datasets_claim} claim holds no dataset id"
            ) from None


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


_SUBJECT = (
    "SELECT id, revoked_at, max_epsilon IS NOT NULL OR max_delta IS NOT NULL AS capped"
    " FROM api_key WHERE key_hash = %s"
)
_REGISTER = (
    "INSERT INTO api_key (id, prefix, key_hash, role, dataset_id, name, created_at, kind)"
    " VALUES (%(id)s, %(prefix)s, %(hash)s, %(role)s, NULL, %(name)s, %(now)s, 'oidc')"
    " ON CONFLICT (key_hash) DO NOTHING"
)


async def subject_principal(
    conn: psycopg.AsyncConnection[Any],
    *,
    issuer: str,
    claims: dict[str, Any],
    role: str,
    datasets: frozenset[uuid.UUID] | None,
) -> Principal | None:
    """The principal of a verified token's subject (registered on first sight); None when
    an admin revoked the subject."""
    subject = str(claims["sub"])[:300]
    marker = subject_marker(issuer, subject)
    cursor = await conn.execute(_SUBJECT, (marker,))
    row = await cursor.fetchone()
    if row is None:
        await conn.execute(
            _REGISTER,
            {
                "id": uuid.uuid5(_NAMESPACE, marker),
                "prefix": "oidc",
                "hash": marker,
                "role": role,
                "name": subject,
                "now": datetime.now(UTC),
            },
        )
        cursor = await conn.execute(_SUBJECT, (marker,))
        row = await cursor.fetchone()
        assert row is not None
    key_id, revoked_at, capped = row
    if revoked_at is not None:
        return None
    return Principal(
        key_id=key_id,
        role=role,
        scope=None,
        prefix="oidc",
        capped=bool(capped),
        datasets=datasets,
        subject=subject,
    )


def oidc_verifier(settings: Any) -> Verifier | None:
    """The verifier the settings describe (None: keys only)."""
    if not settings.oidc_issuer:
        return None
    if not settings.oidc_audience:
        raise ValueError("DPQUANT_OIDC_AUDIENCE is required with DPQUANT_OIDC_ISSUER")
    return Verifier(
        Config(
            issuer=settings.oidc_issuer,
            audience=settings.oidc_audience,
            jwks_url=settings.oidc_jwks_url,
            role_claim=settings.oidc_role_claim,
            datasets_claim=settings.oidc_datasets_claim,
            refresh_s=settings.oidc_jwks_refresh_s,
        )
    )
