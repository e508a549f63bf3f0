"""Remote media (`http(s)://` URLs) fetched under limits, refusing internal addresses (SSRF).

`MediaFetcher.fetch(url)` follows at most `MAX_REDIRECTS` redirects by hand, checking each hop;
the connector's resolver drops every loopback, private, link-local (cloud metadata included),
shared, multicast, reserved or unspecified address a host name resolves to, so the connection
goes only to an address that was checked (no second lookup to rebind); an IP literal is checked
before connecting. `--media-allow-private` (ours) lifts the address rule for operators who serve
media from their own network. Bodies over `max_bytes` and fetches over `timeout_s` stop early.
Failures raise `ApiError`: 502 `media_fetch_failed`, 504 `media_fetch_timeout` (contract §3).
"""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from yarl import URL

from .errors import ApiError

MAX_REDIRECTS = 3
TIMEOUT_S = 30.0
MAX_BYTES = 64 << 20


def refused_address(address: str) -> bool:
    """Whether `address` is internal: loopback, private, link-local, shared, reserved, ..."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


class _GuardedResolver(AbstractResolver):
    """The default resolver, keeping only public addresses."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[dict[str, Any]]:
        hosts = [h for h in await self._inner.resolve(host, port, family)
                 if not refused_address(h["host"])]
        if not hosts:
            raise OSError(errno.EACCES, f"{host} resolves only to internal addresses")
        return hosts

    async def close(self) -> None:
        await self._inner.close()


def _failed(url: str, why: str) -> ApiError:
    return ApiError(502, f"The media URL {_short(url)} could not be fetched: {why}.",
                    "media_fetch_failed")


def _short(url: str) -> str:
    return url if len(url) <= 120 else url[:117] + "..."


class MediaFetcher:
    """One client session for the server's lifetime (`start` / `close`)."""

    def __init__(self, allow_private: bool, max_bytes: int = MAX_BYTES,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.allow_private = allow_private
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = None if self.allow_private else _GuardedResolver()
            connector = aiohttp.TCPConnector(resolver=resolver, limit=16)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url)
        except TimeoutError:
            raise ApiError(504, f"Fetching the media URL {_short(url)} took over "
                           f"{self.timeout_s:g} s.", "media_fetch_timeout") from None

    async def _follow(self, url: str) -> bytes:
        target = URL(url)
        for _ in range(MAX_REDIRECTS + 1):
            self._check(target, url)
            try:
                async with self._session_now().get(target, allow_redirects=False) as reply:
                    if reply.status in (301, 302, 303, 307, 308):
                        location = reply.headers.get("Location")
                        if not location:
                            raise _failed(url, f"a {reply.status} redirect without a Location")
                        target = target.join(URL(location))
                        continue
                    if reply.status != 200:
                        raise _failed(url, f"the server answered HTTP {reply.status}")
                    return await self._body(reply, url)
            except (aiohttp.ClientError, OSError) as exc:
                raise _failed(url, str(exc) or type(exc).__name__) from None
        raise _failed(url, f"more than {MAX_REDIRECTS} redirects")

    def _check(self, target: URL, url: str) -> None:
        if target.scheme not in ("http", "https") or not target.host:
            raise _failed(url, f"a redirect to {target.scheme or 'a relative'} URL")
        if self.allow_private:
            return
        try:
            literal = refused_address(target.host.strip("[]"))
        except ValueError:
            return  # a host name: the resolver checks its addresses
        if literal:
            raise _failed(url, f"{target.host} is an internal address")

    async def _body(self, reply: aiohttp.ClientResponse, url: str) -> bytes:
        if (reply.content_length or 0) > self.max_bytes:
            raise _failed(url, f"it is over {self.max_bytes >> 20} MiB")
        data = bytearray()
        async for chunk in reply.content.iter_chunked(1 << 16):
            data += chunk
            if len(data) > self.max_bytes:
                raise _failed(url, f"it is over {self.max_bytes >> 20} MiB")
        return bytes(data)
