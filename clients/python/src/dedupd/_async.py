"""The asyncio client: :class:`AsyncClient`, its :class:`AsyncClaim` and ``once``.

The same API as the blocking client, awaited; heartbeats are asyncio tasks.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import httpx

from . import _core
from ._context import CURRENT
from ._errors import (
    AlreadyDone,
    Busy,
    ClaimLost,
    DedupdError,
    InvalidRequest,
    Lost,
    NetworkError,
    NotOwner,
)
from ._models import Applied, BaseClaim, Head, Record

if TYPE_CHECKING:
    from datetime import datetime

    from typing_extensions import ParamSpec

    P = ParamSpec("P")

R = TypeVar("R")
T = TypeVar("T")


class AsyncClient:
    """:class:`dedupd.Client` for asyncio: the same arguments, methods and
    rules, each method awaited. Close it with ``await client.aclose()`` (or
    ``async with``)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        max_retry_wait: float = 5.0,
        max_result_bytes: int = _core.DEFAULT_MAX_RESULT_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = _core.check_url(url)
        self._retries = _core.check_count(retries, "retries")
        self._max_retry_wait = _core.check_seconds(max_retry_wait, "max_retry_wait")
        self.max_result_bytes = _core.check_count(max_result_bytes, "max_result_bytes")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=_core.headers(token),
            timeout=_core.check_seconds(timeout, "timeout", positive=True),
            transport=transport,
        )

    async def aclose(self) -> None:
        """Closes the pooled connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: _core.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                resp = await self._http.request(
                    call.method, call.path, content=call.content(), headers=_core.body_headers(call)
                )
            except httpx.TransportError as e:
                if _core.may_resend(call, e) and attempt < self._retries:
                    await asyncio.sleep(_core.backoff(attempt))
                    attempt += 1
                    continue
                raise NetworkError(_core.network_detail(self.url, e), key=call.key) from e
            if attempt < self._retries:
                delay = _core.retry_delay(call, resp, attempt, self._max_retry_wait)
                if delay is not None:
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
            return call.parse(resp)

    def claim(
        self,
        key: str,
        *,
        ttl: float | None = None,
        fingerprint: str | None = None,
        wait: float = 0.0,
        done_ttl: float | None = None,
    ) -> PendingClaim:
        """As :meth:`dedupd.Client.claim`. Await it for the :class:`AsyncClaim`,
        or use it directly as ``async with client.claim(key, ttl=30) as c:``."""
        call = _core.claim(key, ttl, fingerprint)
        _core.ttl_ms(done_ttl, "done_ttl")
        return PendingClaim(self._claim(call, _core.check_seconds(wait, "wait"), ttl, done_ttl))

    async def _claim(
        self, call: _core.Call[_core.Grant], wait: float, ttl: float | None, done_ttl: float | None
    ) -> AsyncClaim:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        attempt = 0
        while True:
            try:
                grant = await self._run(call)
            except Busy:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, _core.poll_delay(attempt)))
                attempt += 1
                continue
            return AsyncClaim(self, grant, ttl=ttl, done_ttl=done_ttl)

    async def done(
        self, key: str, token: str, *, ttl: float | None = None, result: Any = None
    ) -> Record:
        """As :meth:`dedupd.Client.done`."""
        return await self._run(_core.done(key, token, ttl, result))

    async def release(self, key: str, token: str) -> None:
        """As :meth:`dedupd.Client.release`."""
        await self._run(_core.release(key, token))

    async def extend(self, key: str, token: str, *, ttl: float | None = None) -> Record:
        """As :meth:`dedupd.Client.extend`."""
        return await self._run(_core.extend(key, token, ttl))

    async def get(self, key: str) -> Record | None:
        """As :meth:`dedupd.Client.get`."""
        return await self._run(_core.get(key))

    async def apply(self, stream: str, event_id: str, created_at: str | datetime) -> Applied:
        """As :meth:`dedupd.Client.apply`."""
        return await self._run(_core.apply(stream, event_id, created_at))

    async def head(self, stream: str) -> Head | None:
        """As :meth:`dedupd.Client.head`."""
        return await self._run(_core.head(stream))

    def once(
        self,
        key: Callable[..., str],
        *,
        ttl: float = 300.0,
        done_ttl: float | None = None,
        fingerprint: Callable[..., str] | None = None,
        wait: float = 10.0,
        raise_if_done: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """As :meth:`dedupd.Client.once`, for ``async def`` functions; the
        heartbeat is an asyncio task."""
        settings = _core.Once.check(key, ttl, done_ttl, fingerprint, wait, raise_if_done)

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(
                    f"{getattr(fn, '__qualname__', fn)!s} is not an async def: decorate it with "
                    "Client.once"
                )

            @functools.wraps(fn)
            async def once(*args: P.args, **kwargs: P.kwargs) -> R:
                k, fp = settings.key_of(args, kwargs)
                try:
                    claim = await self.claim(
                        k,
                        ttl=settings.ttl,
                        fingerprint=fp,
                        wait=settings.wait,
                        done_ttl=settings.done_ttl,
                    )
                except AlreadyDone as e:
                    if settings.raise_if_done:
                        raise
                    return cast(R, e.result)
                async with claim:
                    value = await fn(*args, **kwargs)
                    claim.result = value
                return value

            return once

        return decorate


class PendingClaim:
    """What :meth:`AsyncClient.claim` returns: await it for the claim, or
    enter it with ``async with`` to claim, heartbeat, and mark done or
    release on the way out."""

    def __init__(self, claiming: Awaitable[AsyncClaim]) -> None:
        self._claiming = claiming
        self._claim: AsyncClaim | None = None

    def __await__(self) -> Generator[Any, None, AsyncClaim]:
        return self._claiming.__await__()

    async def __aenter__(self) -> AsyncClaim:
        self._claim = await self._claiming
        return await self._claim.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._claim is not None:
            await self._claim.__aexit__(exc_type, exc, tb)


class AsyncClaim(BaseClaim):
    """:class:`dedupd.Claim` for asyncio: ``await c.done(...)``, ``async with``."""

    def __init__(
        self,
        client: AsyncClient,
        grant: _core.Grant,
        *,
        ttl: float | None,
        done_ttl: float | None,
    ) -> None:
        super().__init__(grant.key, grant.token, grant.fence, grant.expires_at_ms)
        self._client = client
        self.ttl = ttl
        self.done_ttl = done_ttl
        self.result: Any = None
        self._beat: asyncio.Task[None] | None = None
        self._context: Any = None

    async def done(self, result: Any = None, *, ttl: float | None = None) -> Record:
        """Marks the key done (for ``ttl``, else the claim's ``done_ttl``) with ``result``."""
        return await self._client.done(
            self.key, self.token, ttl=self.done_ttl if ttl is None else ttl, result=result
        )

    async def release(self) -> None:
        """Releases the key so a retry can claim it."""
        await self._client.release(self.key, self.token)

    async def extend(self, ttl: float | None = None) -> Record:
        """Extends the claim by ``ttl`` seconds from now (else the claim's TTL)."""
        record = await self._client.extend(
            self.key, self.token, ttl=self.ttl if ttl is None else ttl
        )
        self.expires_at_ms = record.expires_at_ms
        return record

    async def __aenter__(self) -> AsyncClaim:
        if self._beat is not None:
            raise RuntimeError("an AsyncClaim can be entered once")
        interval = _core.beat_interval(self.ttl, self.expires_at_ms)
        self._beat = asyncio.ensure_future(self._heartbeat(interval))
        self._context = CURRENT.set(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        CURRENT.reset(self._context)
        if self._beat is not None:
            self._beat.cancel()
            # Waits for the task to end; a cancellation of this task still comes through.
            await asyncio.wait([self._beat])
        if exc is not None:
            if self._lost is None:
                try:
                    await self.release()
                except DedupdError as e:
                    _core.log.warning("releasing %r after %r failed: %s", self.key, exc, e)
            return
        if self._lost is not None:
            raise ClaimLost(
                "the claim was lost while the work ran: it is not marked done", key=self.key
            ) from self._lost
        result = _core.encode_result(self.result, self._client.max_result_bytes)
        try:
            try:
                await self.done(result)
            except InvalidRequest as e:
                if result is None or not _core.refuses_result(e):
                    raise
                _core.log.warning("the result of %r is not stored: %s", self.key, e)
                await self.done()
        except NotOwner as e:
            raise ClaimLost("the claim was taken over before done", key=self.key) from e

    async def _heartbeat(self, interval: float) -> None:
        wait, failures = interval, 0
        while True:
            await asyncio.sleep(wait)
            try:
                await self.extend()
            except (Lost, NotOwner, AlreadyDone) as e:
                self._lost = e
                return
            except DedupdError as e:  # no answer, a restart, a 503: beat on until it expires
                _core.log.warning("extending the claim of %r failed, retrying: %s", self.key, e)
                wait, failures = min(interval, _core.backoff(failures)), failures + 1
            except Exception as e:  # a closed client, a bug: the claim cannot be vouched for
                _core.log.error("the heartbeat of %r stopped: %r", self.key, e)
                self._lost = e
                return
            else:
                wait, failures = interval, 0
