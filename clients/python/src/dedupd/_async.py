"""The asyncio client: :class:`AsyncClient`, its :class:`AsyncClaim` and ``once``.

The same API as the blocking client, awaited; heartbeats are asyncio tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
import weakref
from collections.abc import Awaitable, Generator, Iterator
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TypeVar, cast

import httpx

from . import _context, _core, _deadline
from ._errors import (
    AlreadyDone,
    Busy,
    ClaimLost,
    DedupdError,
    DoneFailed,
    InvalidRequest,
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


@contextlib.contextmanager
def _anyio_shield() -> Iterator[None]:
    """Under anyio (a task group, ``move_on_after``), keeps its cancel scopes
    from cancelling the waits inside again at every step; nothing without
    anyio."""
    try:
        import anyio
    except ImportError:  # pragma: no cover - httpx depends on anyio
        yield
        return
    with anyio.CancelScope(shield=True):
        yield


async def _uncancelled(aw: Awaitable[T]) -> T:
    """Runs ``aw`` (a claim's done or release) to its end in a task of its
    own, even when this task is cancelled (again) meanwhile: then, once it
    has ended, raises CancelledError."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    with _anyio_shield():
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                cancelled = True
    if cancelled:
        if not task.cancelled() and task.exception() is not None:
            _core.log.warning("after a cancellation: %s", task.exception())
        raise asyncio.CancelledError
    return task.result()


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
        self.url, auth = _core.basic_auth(_core.check_url(url), token)
        self._retries = _core.check_count(retries, "retries")
        self._max_retry_wait = _core.check_seconds(max_retry_wait, "max_retry_wait")
        self.max_result_bytes = _core.check_count(max_result_bytes, "max_result_bytes")
        self._timeout = _core.check_seconds(timeout, "timeout", positive=True)
        self._headers = _core.headers(token)
        self._auth = auth
        self._transport = transport
        self._http = self._new_http()
        # The event loop its connections belong to, from its first request.
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        # Those of the other loops still running, each with its own.
        self._others: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _new_http(self) -> httpx.AsyncClient:
        http = httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers,
            auth=self._auth,
            timeout=self._timeout,
            transport=self._transport,
        )
        # Each request within its timeout in all, not only each read.
        _deadline.bound(http)
        return http

    def _http_here(self) -> httpx.AsyncClient:
        """The connections for the running event loop. Those of another
        loop cannot be used from this one (each belongs to the loop that
        opened it): under a new loop the client opens new ones. Those of a
        loop still running are kept for it (two loops taking turns keep
        their pools); those of a loop that has ended (``asyncio.run``
        called again, say) are dropped: they cannot be closed without it (a
        ``transport`` given is kept as it is)."""
        loop = asyncio.get_running_loop()
        owner = None if self._loop is None else self._loop()
        if owner is loop:
            return self._http
        if self._loop is not None:
            if owner is not None and not owner.is_closed():
                self._others[owner] = self._http
            kept = self._others.pop(loop) if loop in self._others else None
            self._http = kept if kept is not None else self._new_http()
        self._loop = weakref.ref(loop)
        return self._http

    async def aclose(self) -> None:
        """Closes the pooled connections (those of another event loop, which
        cannot be closed from this one, are dropped)."""
        await self._http_here().aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(
        self, call: _core.Call[T], *, timeout: float | None = None, retries: int | None = None
    ) -> T:
        limit = self._retries if retries is None else retries
        attempt = 0
        while True:
            try:
                deadline = _deadline.start(self._timeout if timeout is None else timeout)
                try:
                    # Streamed, and read up to a cap: an answer is never
                    # held whole before it is known to be small enough.
                    async with self._http_here().stream(
                        call.method,
                        call.path,
                        content=call.content(),
                        headers=_core.body_headers(call),
                        timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                    ) as streamed:
                        answer = _core.Answer(call, streamed)
                        if answer.streamed:
                            async for chunk in streamed.aiter_raw():
                                answer.add(chunk)
                        resp = answer.response()
                finally:
                    _deadline.end(deadline)
            except httpx.DecodingError as e:
                raise _core.undecodable(call, e) from e
            except httpx.TransportError as e:
                if _core.may_resend(call, e) and attempt < limit:
                    await asyncio.sleep(_core.backoff(attempt))
                    attempt += 1
                    continue
                raise NetworkError(_core.network_detail(self.url, e), key=call.key) from e
            if attempt < limit:
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
        ttl: float = _core.DEFAULT_TTL,
        fingerprint: str | None = None,
        wait: float = 0.0,
        done_ttl: float | None = None,
    ) -> PendingClaim:
        """As :meth:`dedupd.Client.claim`. Await it for the :class:`AsyncClaim`,
        or use it directly as ``async with client.claim(key, ttl=30) as c:``."""
        ttl = _core.claim_ttl(ttl)
        call = _core.claim(key, ttl, fingerprint)
        _core.ttl_ms(done_ttl, "done_ttl")
        return PendingClaim(self._claim(call, _core.check_seconds(wait, "wait"), ttl, done_ttl))

    async def _claim(
        self, call: _core.Call[_core.Grant], wait: float, ttl: float, done_ttl: float | None
    ) -> AsyncClaim:
        if _context.held_here(self, call.key, asyncio.current_task()):
            raise _context.reentry(call.key)
        deadline = time.monotonic() + wait
        attempt = 0
        while True:
            sent_at = time.monotonic()
            try:
                grant = await self._claim_shielded(call)
            except Busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, _core.poll_delay(attempt)))
                attempt += 1
                continue
            return AsyncClaim(self, grant, ttl=ttl, done_ttl=done_ttl, sent_at=sent_at)

    async def _claim_shielded(self, call: _core.Call[_core.Grant]) -> _core.Grant:
        """Sends a claim and waits for its answer, in a task of its own, even
        when this task is cancelled meanwhile: the server may have granted
        it, and a claim nobody holds would keep the key busy for its whole
        TTL. A claim granted to a caller that was cancelled is released (to
        its end, as a block's release is), then the cancellation goes on."""
        task = asyncio.ensure_future(self._run(call))
        cancelled: asyncio.CancelledError | None = None
        with _anyio_shield():
            while not task.done():
                try:
                    await asyncio.wait([task])
                except asyncio.CancelledError as e:
                    cancelled = e
        if cancelled is None:
            return task.result()
        if not task.cancelled() and task.exception() is None:
            await _uncancelled(self._release_unwanted(task.result()))
        raise cancelled

    async def _release_unwanted(self, grant: _core.Grant) -> None:
        try:
            await self._run(_core.release(grant.key, grant.token))
        except Exception as e:  # the cancellation goes on all the same
            _core.log.warning(
                "releasing %r, claimed for a caller cancelled meanwhile, failed: %r", grant.key, e
            )

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
        ttl: float = _core.DEFAULT_TTL,
        done_ttl: float | None = None,
        fingerprint: Callable[..., str] | None = None,
        wait: float = 10.0,
        raise_if_done: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """As :meth:`dedupd.Client.once`, for ``async def`` functions; the
        heartbeat is an asyncio task."""
        settings = _core.Once.check(key, ttl, done_ttl, fingerprint, wait, raise_if_done)

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            _core.refuse_generator_function(fn)
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
                    _core.refuse_deferred(fn, value)
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
    """:class:`dedupd.Claim` for asyncio: ``await c.done(...)``, ``async with``.

    Leaving the block, its done or release runs to its end even when the
    task is cancelled (again) meanwhile."""

    def __init__(
        self,
        client: AsyncClient,
        grant: _core.Grant,
        *,
        ttl: float,
        done_ttl: float | None,
        sent_at: float,
    ) -> None:
        super().__init__(grant.key, grant.token, grant.fence, grant.expires_at_ms)
        self._client = client
        self.ttl = ttl
        self.done_ttl = done_ttl
        self.result: Any = None
        self._entered = False
        self._finished = False  # done or released: nothing more to send
        self._interval = _core.beat_interval(ttl)
        self._deadline = sent_at + ttl  # as Claim's: monotonic, from the last claim or extend
        self._beat: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None  # set when a manual extend changed the TTL
        self._context: Token[BaseClaim] | None = None

    async def done(self, result: Any = None, *, ttl: float | None = None) -> Record:
        """Marks the key done (for ``ttl``, else the claim's ``done_ttl``)
        with ``result``. In an ``async with`` block, its heartbeat stops, and
        leaving the block sends nothing more."""
        record = await self._done(result, ttl)
        await self._finish()
        if isinstance(self._lost, AlreadyDone):  # a beat that came after this done
            self._lost = None
        return record

    async def release(self) -> None:
        """Releases the key so a retry can claim it. In an ``async with``
        block, its heartbeat stops, and leaving the block sends nothing more."""
        await self._client.release(self.key, self.token)
        await self._finish()

    async def extend(self, ttl: float | None = None) -> Record:
        """Extends the claim to ``ttl`` seconds from now (else the claim's
        TTL). A ``ttl`` given becomes the claim's TTL: its heartbeat extends
        by it from then on, every ``ttl / 3``."""
        new = self.ttl if ttl is None else _core.claim_ttl(ttl)
        sent_at = time.monotonic()
        record = await self._client.extend(self.key, self.token, ttl=new)
        self.expires_at_ms = record.expires_at_ms
        self._deadline = sent_at + new
        if new != self.ttl:
            self.ttl = new
            self._interval = _core.beat_interval(new)
            if self._wake is not None:
                self._wake.set()
        return record

    async def _done(self, result: Any, ttl: float | None = None) -> Record:
        return await self._client.done(
            self.key, self.token, ttl=self.done_ttl if ttl is None else ttl, result=result
        )

    async def _finish(self) -> None:
        self._finished = True
        await self._stop_beat()

    async def _stop_beat(self) -> None:
        beat = self._beat
        if beat is not None and not beat.done():
            beat.cancel()
            await asyncio.wait([beat])

    async def __aenter__(self) -> AsyncClaim:
        if self._entered:
            raise RuntimeError("an AsyncClaim can be entered once")
        self._entered = True
        if not self._finished:
            self._wake = asyncio.Event()
            self._beat = asyncio.ensure_future(self._heartbeat(self._wake))
        self._context = _context.enter(self, self._client, asyncio.current_task())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await _uncancelled(self._leave_and_stop(exc))
        finally:
            _context.leave(self, self._context)

    async def _leave_and_stop(self, exc: BaseException | None) -> None:
        try:
            await self._leave(exc)
        finally:
            # After the done or release: the claim cannot lapse while they are retried.
            await self._stop_beat()

    async def _leave(self, exc: BaseException | None) -> None:
        if self._finished:  # done or released in the block
            return
        if exc is not None:
            if self._lost is None:
                try:
                    await self._client.release(self.key, self.token)
                except Exception as e:  # whatever it is, the block's own exception goes on
                    _core.log.warning("releasing %r after %r failed: %r", self.key, exc, e)
            return
        if self._lost is not None:
            raise ClaimLost(
                "the claim was lost while the work ran: it is not marked done", key=self.key
            ) from self._lost
        result = _core.encode_result(self.result, self._client.max_result_bytes)
        ttl = self.done_ttl
        try:
            while True:
                try:
                    await self._client.done(self.key, self.token, ttl=ttl, result=result)
                    break
                except InvalidRequest as e:
                    lighter = _core.lighter_done(self.key, e, result, ttl)
                    if lighter is None:
                        raise
                    result, ttl = lighter
        except NotOwner as e:
            raise ClaimLost("the claim was taken over before done", key=self.key) from e
        except DedupdError as e:
            raise DoneFailed(
                f"the work finished but marking it done failed: {e.reason()}",
                value=self.result,
                claim=self,
                key=self.key,
            ) from e
        self._finished = True
        if isinstance(self._lost, AlreadyDone):  # a beat that came after this done
            self._lost = None

    async def _heartbeat(self, wake: asyncio.Event) -> None:
        """Extends the claim every period, as Claim's heartbeat does: each
        extend sent once, waiting at most half the period; a failed one tried
        again sooner, until the claim's TTL has passed since the last that
        went through."""
        wait, failures = self._interval, 0
        while True:
            try:
                await asyncio.wait_for(wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
            else:  # a manual extend changed the TTL: the next beat is one period on
                wake.clear()
                wait = self._interval
                continue
            ttl = self.ttl
            sent_at = time.monotonic()
            try:
                record = await self._client._run(
                    _core.extend(self.key, self.token, ttl),
                    timeout=_core.beat_timeout(self._client._timeout, self._interval),
                    retries=0,
                )
            except DedupdError as e:
                if _core.ends_claim(e):  # lost, not_owner, done, unauthorized, ...
                    if self._finished and isinstance(e, AlreadyDone):
                        return None  # this claim's own done, answered first
                    if not self._finished:
                        _core.log.warning("the claim of %r is lost: %s", self.key, e)
                    self._lost = e
                    return
                failures += 1
                if time.monotonic() >= self._deadline:
                    _core.log.error(
                        "the claim of %r has expired: extends failed for its whole TTL: %s",
                        self.key,
                        e,
                    )
                    self._lost = e
                    return
                _core.log.warning("extending the claim of %r failed, retrying: %s", self.key, e)
                wait = _core.beat_retry(self._interval, failures)
            except Exception as e:  # a closed client, a bug: the claim cannot be vouched for
                _core.log.error("the heartbeat of %r stopped: %r", self.key, e)
                self._lost = e
                return
            else:
                self.expires_at_ms = record.expires_at_ms
                self._deadline = sent_at + ttl
                failures = 0
                # A manual extend changed the TTL while this one was out: extend by it now.
                wait = 0.0 if self.ttl != ttl else self._interval
