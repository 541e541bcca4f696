"""Per-key request rate limit: a token bucket per API key, 429 with ``Retry-After``.

Configured by ``DPQUANT_RATE_LIMIT_PER_MINUTE`` (0 = off, the default) and
``DPQUANT_RATE_LIMIT_BURST`` (bucket size; 0 = one minute's worth). The bucket is keyed by
the SHA-256 of the presented bearer token, so no raw key is kept in memory, and it is
checked before any database work, so a flooding key costs almost nothing. Buckets live in
each server process: with W workers a key may get up to W times the configured rate in
the worst case (requests are spread over workers by the kernel). Requests without a bearer
token are not limited here (they are refused with 401 without touching the database).

:class:`AuthFailureGuard` limits what the per-key buckets cannot: a flood of *random*
tokens (each a fresh bucket, each a database lookup). Failed authentications are counted
per client address; an address that spent its allowance gets 429 for further unknown
tokens without a lookup, while keys that authenticated recently in this process keep
working from it (a shared proxy address does not lock out the clients it carries).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

#: At most this many buckets are remembered; the least recently used are forgotten.
MAX_BUCKETS = 100_000


class TokenBuckets:
    """Thread-safe token buckets: ``rate_per_s`` refill, ``burst`` capacity."""

    def __init__(
        self, *, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = per_minute / 60.0
        self.burst = float(burst if burst > 0 else per_minute)
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, identity: str) -> float:
        """Spend one token; returns 0 when allowed, else the seconds until one is available."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.pop(identity, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
            if tokens >= 1.0:
                self._buckets[identity] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[identity] = (tokens, now)
                wait = (1.0 - tokens) / self.rate_per_s
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return wait

    def wait(self, identity: str) -> float:
        """The seconds until ``identity`` has a token (0 when it has one); spends nothing."""
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(identity, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate_per_s)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s


def bearer_identity(scope: Scope) -> str | None:
    """SHA-256 of the bearer token of the request, or None when there is none."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return hashlib.sha256(token.strip()).hexdigest()
    return None


class RateLimitMiddleware:
    """Pure ASGI middleware answering 429 (``Retry-After``) when a key exceeds its rate."""

    def __init__(self, app: ASGIApp, *, per_minute: int, burst: int) -> None:
        self.app = app
        self.buckets = TokenBuckets(per_minute=per_minute, burst=burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        identity = bearer_identity(scope)
        wait = 0.0 if identity is None else self.buckets.take(identity)
        if wait <= 0.0:
            await self.app(scope, receive, send)
            return
        retry_after = max(1, math.ceil(wait))
        body = json.dumps(
            {
                "type": "rate_limited",
                "detail": f"too many requests for this API key; retry after {retry_after} s",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


#: Tokens longer than this are no key (ours are 47 characters; bootstrap keys are typed by
#: operators): refused with 401 before they are hashed or looked up.
MAX_TOKEN_LENGTH = 512
#: How long a key that authenticated is remembered as one (it still needs its lookup).
KNOWN_KEY_S = 300.0
#: At most this many recently authenticated keys are remembered per process.
MAX_KNOWN_KEYS = 100_000


class AuthFailureGuard:
    """Failed authentications per client address, and keys known to be good.

    ``per_minute`` failures per address refill (``burst`` at once); once spent, an unknown
    token from that address is answered 429 without a database lookup. A key that
    authenticated within :data:`KNOWN_KEY_S` is let through to its lookup (which still
    decides: a revoked key gets 401). Per process, like the key buckets.
    """

    def __init__(
        self, *, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = TokenBuckets(per_minute=per_minute, burst=burst, clock=clock)
        self._clock = clock
        self._known: OrderedDict[str, float] = OrderedDict()
        self._blocked: dict[str, float] = {}
        self._lock = threading.Lock()

    def admit(self, address: str, digest: str) -> float:
        """0 when a lookup may run; else the seconds until the address may try again."""
        now = self._clock()
        with self._lock:
            seen = self._known.get(digest)
            if seen is not None and now - seen < KNOWN_KEY_S:
                return 0.0
            until = self._blocked.get(address)
            if until is None or until <= now:
                self._blocked.pop(address, None)
                return 0.0
            return until - now

    def failed(self, address: str) -> None:
        """A lookup from ``address`` found no live key: one of its failures is spent, and
        the address waits once none is left."""
        self.failures.take(address)
        wait = self.failures.wait(address)
        if wait > 0.0:
            with self._lock:
                self._blocked[address] = self._clock() + wait
                while len(self._blocked) > MAX_BUCKETS:
                    self._blocked.pop(next(iter(self._blocked)))

    def succeeded(self, digest: str) -> None:
        """The key with this digest authenticated."""
        with self._lock:
            self._known.pop(digest, None)
            self._known[digest] = self._clock()
            while len(self._known) > MAX_KNOWN_KEYS:
                self._known.popitem(last=False)
