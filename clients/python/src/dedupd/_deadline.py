"""A whole request's deadline: httpx's timeouts bound each connect, read and
write, so a peer (a proxy, a load balancer) that sends its answer a byte at a
time is never timed out, and the call, a heartbeat's extend or a block's done
would wait for ever. Each connection of a client's pools is wrapped so that
every operation waits at most what is left of the request's ``timeout``,
then fails with httpx's own timeout (a network failure like any other).

The deadline is a context variable, set around each request by the client: a
thread's own, or an asyncio task's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

import httpcore

if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterable, Iterator

    import httpx

_DEADLINE: ContextVar[float | None] = ContextVar("dedupd_request_deadline", default=None)


def start(seconds: float) -> Token[float | None]:
    """Requests made from now take at most ``seconds`` in all, until
    :func:`end` (a plain call, not a context manager: one of those costs
    every request some microseconds more)."""
    return _DEADLINE.set(time.monotonic() + seconds)


def end(token: Token[float | None]) -> None:
    """Ends what :func:`start` began."""
    _DEADLINE.reset(token)


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Requests made inside take at most ``seconds`` in all."""
    token = start(seconds)
    try:
        yield
    finally:
        end(token)


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the request's time; raises ``late``
    once none is."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("the request took longer than the client's timeout")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(
            self._inner.start_tls(
                ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
            )
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(
            self._inner.connect_tcp(
                host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options
            )
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(
            self._inner.connect_unix_socket(
                path, _left(timeout, httpcore.ConnectTimeout), socket_options
            )
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _AsyncStream(
            await self._inner.start_tls(
                ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
            )
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _AsyncStream(
            await self._inner.connect_tcp(
                host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options
            )
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _AsyncStream(
            await self._inner.connect_unix_socket(
                path, _left(timeout, httpcore.ConnectTimeout), socket_options
            )
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def pools(http: httpx.Client | httpx.AsyncClient) -> list[Any]:
    """The connection pools of a client's transports: its own, and those the
    environment's proxies mounted."""
    transports = [getattr(http, "_transport", None)]
    transports += list(getattr(http, "_mounts", {}).values())
    return [getattr(t, "_pool", None) for t in transports if t is not None]


def bound(http: httpx.Client | httpx.AsyncClient) -> bool:
    """Wraps the connections of ``http``'s pools (httpx's own transports,
    not one given by the caller) so that each request keeps to its
    deadline. httpx has no setting for it: this reaches into its pools
    (``_pool._network_backend``), and says whether it could (a later httpx
    may lay them out differently; the requests then have httpx's
    per-operation timeouts only)."""
    found = pools(http)
    if not found or any(not hasattr(p, "_network_backend") for p in found):
        return False
    for pool in found:
        inner = pool._network_backend
        if isinstance(inner, (_Backend, _AsyncBackend)):
            continue
        if isinstance(inner, httpcore.AsyncNetworkBackend):
            pool._network_backend = _AsyncBackend(inner)
        elif isinstance(inner, httpcore.NetworkBackend):
            pool._network_backend = _Backend(inner)
        else:
            return False
    return True
