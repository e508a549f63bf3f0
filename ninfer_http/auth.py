"""API-key check (contract §2 "Auth"): `Authorization: Bearer K` or `x-api-key: K`."""
from __future__ import annotations

import hmac

from aiohttp import web


def _same(candidate: str, key: str) -> bool:
    # Constant-time comparison so the key cannot be guessed byte by byte from timings.
    return hmac.compare_digest(candidate.strip().encode(), key.encode())


def has_valid_key(request: web.Request, key: str) -> bool:
    """True when the request carries `key`; the Bearer scheme is case-insensitive."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and _same(token, key):
        return True
    api_key = request.headers.get("x-api-key")
    return api_key is not None and _same(api_key, key)


def is_exempt(request: web.Request) -> bool:
    """`GET /health` and every `OPTIONS` need no key."""
    if request.method == "OPTIONS":
        return True
    return request.path == "/health" and request.method in ("GET", "HEAD")
