"""A real local OpenID Connect issuer for the tests: a discovery document and a JWKS served
over HTTP on 127.0.0.1, and tokens signed with its own keys (joserfc)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

AUDIENCE = "dpquant"


def _b64(obj: dict[str, Any]) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class LocalIssuer:
    """Serves ``/.well-known/openid-configuration`` and ``/jwks``; signs tokens."""

    def __init__(self) -> None:
        self.rsa = RSAKey.generate_key(2048, parameters={"kid": "rsa-1", "use": "sig"})
        self.ec = ECKey.generate_key("P-256", parameters={"kid": "ec-1", "use": "sig"})
        self.published: list[Any] = [self.rsa, self.ec]
        self.jwks_fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.issuer, "jwks_uri": issuer.issuer + "/jwks"}
                elif self.path == "/jwks":
                    issuer.jwks_fetches += 1
                    body = {"keys": [k.as_dict(private=False) for k in issuer.published]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def claims(self, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        base = {"iss": self.issuer, "aud": AUDIENCE, "sub": f"user-{uuid.uuid4().hex[:8]}",
                "iat": now, "nbf": now, "exp": now + 300}  # fmt: skip
        base.update(extra)
        return {k: v for k, v in base.items() if v is not None}

    def token(self, *, key: Any | None = None, alg: str | None = None, **claims: Any) -> str:
        """A signed token (RS256 with the RSA key unless told otherwise)."""
        key = key or self.rsa
        alg = alg or ("ES256" if isinstance(key, ECKey) else "RS256")
        header = {"alg": alg, "kid": key.kid} if key.kid else {"alg": alg}
        return jwt.encode(header, self.claims(**claims), key)

    def unsigned(self, **claims: Any) -> str:
        """``alg: none``: a token with no signature at all."""

        return _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(self.claims(**claims)) + "."

    def hs256_with_public_key(self, **claims: Any) -> str:
        """HS256 signed with the RSA key's *public* PEM as the secret (the key-confusion
        attack on verifiers that let the token choose the algorithm)."""
        secret = self.rsa.as_pem(private=False)  # joserfc itself refuses to sign this
        head = _b64({"alg": "HS256", "typ": "JWT", "kid": self.rsa.kid})
        body = _b64(self.claims(**claims))
        mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
        return f"{head}.{body}." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def rotate(self) -> Any:
        """Publish a new RSA key (the old ones stay) and return it."""
        key = RSAKey.generate_key(2048, parameters={"kid": f"rsa-{uuid.uuid4().hex[:6]}"})
        self.published.append(key)
        return key
