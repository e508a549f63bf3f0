"""Responses `encrypted_content`: reasoning handed to a client and taken back on replay.

With `include: ["reasoning.encrypted_content"]` (Codex, any `store: false` client) each
reasoning item carries its text as an opaque blob; a later request that replays the item gets
the reasoning back into the prompt. The blob is compressed text plus an HMAC-SHA256 tag under a
key made when the server starts: a blob this process did not issue (another server, a restart,
an edit) is ignored, never trusted. It is authenticated, not encrypted: the reasoning is the
client's own output.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import zlib

PREFIX = "ninfer-rs.v1."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    """Seals reasoning text into a blob and opens blobs sealed with the same key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _tag(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def seal(self, text: str) -> str:
        payload = _b64(zlib.compress(text.encode()))
        return f"{PREFIX}{payload}.{self._tag(payload)}"

    def open(self, blob: str) -> str | None:
        """The reasoning text, or None for a blob this key did not seal."""
        if not isinstance(blob, str) or not blob.startswith(PREFIX):
            return None
        payload, _, tag = blob[len(PREFIX):].partition(".")
        if not hmac.compare_digest(tag, self._tag(payload)):
            return None
        try:
            return zlib.decompress(_unb64(payload)).decode()
        except (binascii.Error, ValueError, zlib.error, UnicodeDecodeError):
            return None
