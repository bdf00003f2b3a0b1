"""The blocking client: :class:`Client`, its :class:`Claim` and ``once``."""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import os
import threading
import time
import weakref
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


# The clients of this process, for a forked child to reset (see _after_fork).
_CLIENTS: weakref.WeakSet[Client] = weakref.WeakSet()


def _reset_clients_in_child() -> None:
    for client in list(_CLIENTS):
        client._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_clients_in_child)


def _heartbeats_of(client: Client) -> tuple[_Heartbeats, weakref.finalize[[], Client]]:
    """A client's heartbeats, whose thread ends when the client is garbage
    collected (dropped without ``close()``), and the finalizer that ends it."""
    heartbeats = _Heartbeats()
    end = weakref.finalize(client, heartbeats.abandon)
    end.atexit = False
    return heartbeats, end


class Client:
    """A dedupd server's claims and ordering API, over a pool of connections.

    ``url`` is the server's base URL (``http://127.0.0.1:8080``), ``token``
    an API token when the server has ``api.tokens``, ``timeout`` the seconds
    each request may take. Reads, and an owner's done, release and extend
    (which do nothing more when sent twice), are sent again after a network
    failure; a claim or an apply only when its connection could not be
    opened (nothing was sent). Any write is also sent again after dedupd's
    503 or 507 saying it changed nothing, when its ``Retry-After`` is at
    most ``max_retry_wait`` seconds. ``retries`` bounds the retries of one
    call. ``max_result_bytes`` is the largest result (as compact JSON) that
    ``once`` and ``with client.claim(...)`` store with a done.

    Safe to share between threads; close it (or use it as a context manager)
    to close its connections. In a child process made by ``os.fork()``, it
    opens new connections and a new heartbeat thread (a ``transport`` given
    here is kept as it is).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        max_retry_wait: float = 5.0,
        max_result_bytes: int = _core.DEFAULT_MAX_RESULT_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, self._auth = _core.basic_auth(_core.check_url(url), token)
        self._retries = _core.check_count(retries, "retries")
        self._max_retry_wait = _core.check_seconds(max_retry_wait, "max_retry_wait")
        self.max_result_bytes = _core.check_count(max_result_bytes, "max_result_bytes")
        self._timeout = _core.check_seconds(timeout, "timeout", positive=True)
        self._headers = _core.headers(token)
        self._transport = transport
        self._http = self._new_http()
        self._heartbeats, self._heartbeats_end = _heartbeats_of(self)
        self._closed = False
        self._inherited: httpx.Client | None = None
        _CLIENTS.add(self)

    def _new_http(self) -> httpx.Client:
        http = httpx.Client(
            base_url=self.url,
            headers=self._headers,
            auth=self._auth,
            timeout=self._timeout,
            transport=self._transport,
        )
        # Each request within its timeout in all, not only each read.
        _deadline.bound(http)
        return http

    def _after_fork(self) -> None:
        """In the child of a fork: the parent's heartbeat thread does not run
        here (and its lock may be held), and its pooled connections are the
        parent's. Starts afresh with new ones. The inherited connections are
        kept unused, not closed: closing them could end the parent's."""
        if self._closed:
            return
        self._inherited = self._http
        self._http = self._new_http()
        # The parent's heartbeats are not ended from here (their lock may be held).
        self._heartbeats_end.detach()
        self._heartbeats, self._heartbeats_end = _heartbeats_of(self)

    def close(self) -> None:
        """Closes the pooled connections, and stops the heartbeat thread (a
        claim still held in a block is then lost: leaving it raises
        ClaimLost)."""
        self._closed = True
        self._heartbeats.close()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(
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
                    with self._http.stream(
                        call.method,
                        call.path,
                        content=call.content(),
                        headers=_core.body_headers(call),
                        timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                    ) as streamed:
                        answer = _core.Answer(call, streamed)
                        if answer.streamed:
                            for chunk in streamed.iter_raw():
                                answer.add(chunk)
                        resp = answer.response()
                finally:
                    _deadline.end(deadline)
            except httpx.DecodingError as e:
                raise _core.undecodable(call, e) from e
            except httpx.TransportError as e:
                if _core.may_resend(call, e) and attempt < limit:
                    time.sleep(_core.backoff(attempt))
                    attempt += 1
                    continue
                raise NetworkError(_core.network_detail(self.url, e), key=call.key) from e
            if attempt < limit:
                delay = _core.retry_delay(call, resp, attempt, self._max_retry_wait)
                if delay is not None:
                    time.sleep(delay)
                    attempt += 1
                    continue
            return call.parse(resp)

    # The API, one call each.

    def claim(
        self,
        key: str,
        *,
        ttl: float = _core.DEFAULT_TTL,
        fingerprint: str | None = None,
        wait: float = 0.0,
        done_ttl: float | None = None,
    ) -> Claim:
        """Claims ``key`` for ``ttl`` seconds (300 by default); ``fingerprint``
        (a digest of the payload) makes a claim of the same key with another
        payload fail with FingerprintMismatch.

        Raises Busy when another worker holds the key, AlreadyDone (with its
        ``result``) when its work is done. With ``wait`` seconds, a busy key
        is claimed again (with a backoff) until it is free, done, or ``wait``
        passes.

        The :class:`Claim` answers ``done``, ``release`` and ``extend``; used
        as a context manager it heartbeats, and marks done (with ``done_ttl``)
        or releases on the way out.
        """
        ttl = _core.claim_ttl(ttl)
        call = _core.claim(key, ttl, fingerprint)
        deadline = time.monotonic() + _core.check_seconds(wait, "wait")
        _core.ttl_ms(done_ttl, "done_ttl")
        if _context.held_here(self, call.key, threading.get_ident()):
            raise _context.reentry(call.key)
        attempt = 0
        while True:
            sent_at = time.monotonic()
            try:
                grant = self._run(call)
            except Busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(left, _core.poll_delay(attempt)))
                attempt += 1
                continue
            return Claim(self, grant, ttl=ttl, done_ttl=done_ttl, sent_at=sent_at)

    def done(self, key: str, token: str, *, ttl: float | None = None, result: Any = None) -> Record:
        """Marks the work for ``key`` done, for ``ttl`` seconds (the server's
        default done TTL when ``None``), storing ``result`` (any JSON value;
        ``None`` stores none) for repeats to get. Raises NotOwner when
        ``token`` does not hold the key, ResultTooLarge over the server's
        limit."""
        return self._run(_core.done(key, token, ttl, result))

    def release(self, key: str, token: str) -> None:
        """Releases the claim so a retry can claim the key again (nothing to do
        when nobody holds it). Raises NotOwner, or AlreadyDone."""
        self._run(_core.release(key, token))

    def extend(self, key: str, token: str, *, ttl: float | None = None) -> Record:
        """Extends the claim to ``ttl`` seconds from now (the server's default
        claim TTL when ``None``). Raises Lost when it expired, NotOwner when
        another worker holds the key, AlreadyDone."""
        return self._run(_core.extend(key, token, ttl))

    def get(self, key: str) -> Record | None:
        """The key's state (with its fence, and its result once done), or
        ``None`` when no live record holds it (dedupd's ``404 not_found``;
        another 404 raises)."""
        return self._run(_core.get(key))

    def apply(self, stream: str, event_id: str, created_at: str | datetime) -> Applied:
        """Records that ``event_id`` (created at ``created_at``: RFC 3339 text
        or an aware datetime) is applied to ``stream``, unless it is a
        duplicate or older than the stream's head: check ``.applied`` (or
        ``.outcome``) before the write."""
        return self._run(_core.apply(stream, event_id, created_at))

    def head(self, stream: str) -> Head | None:
        """The stream's newest applied event, or ``None``."""
        return self._run(_core.head(stream))

    # Once.

    def once(
        self,
        key: Callable[..., str],
        *,
        ttl: float = _core.DEFAULT_TTL,
        done_ttl: float | None = None,
        fingerprint: Callable[..., str] | None = None,
        wait: float = 10.0,
        raise_if_done: bool = False,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorates a function so that its work runs once per key.

        ``key`` (and ``fingerprint``, optional) are called with the
        function's arguments. Each call claims the key for ``ttl`` seconds,
        extends the claim every ``ttl / 3`` while the function runs, then:

        - on return, marks the key done for ``done_ttl`` seconds (the
          server's default when ``None``) with the return value as its
          result, when that is JSON of at most ``max_result_bytes``; if that
          done fails (no answer through the retries), raises DoneFailed with
          the value;
        - on an exception, releases the key and re-raises;
        - when a heartbeat found the claim lost (expired and taken over),
          raises ClaimLost and does not mark it done.

        A repeat of a done key returns the stored result (decoded JSON;
        ``None`` when none was stored) without calling the function, or
        raises AlreadyDone with ``raise_if_done``. A caller that finds the key
        busy waits up to ``wait`` seconds for it to be done (and returns its
        result) or free (and claims it); then it raises Busy.

        The function must do its work when called: an ``async def`` or a
        generator function is refused (TypeError), and so is a call that
        returns an awaitable or a generator (the key is released).
        """
        settings = _core.Once.check(key, ttl, done_ttl, fingerprint, wait, raise_if_done)

        def decorate(fn: Callable[P, R]) -> Callable[P, R]:
            if inspect.iscoroutinefunction(fn):
                raise TypeError(
                    f"{fn.__qualname__} is an async def: decorate it with AsyncClient.once"
                )
            _core.refuse_generator_function(fn)

            @functools.wraps(fn)
            def once(*args: P.args, **kwargs: P.kwargs) -> R:
                k, fp = settings.key_of(args, kwargs)
                try:
                    claim = self.claim(
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
                with claim:
                    value = fn(*args, **kwargs)
                    _core.refuse_deferred(fn, value)
                    claim.result = value
                return value

            return once

        return decorate


class Claim(BaseClaim):
    """A claim this client holds (see :class:`BaseClaim` for its fields).

    As a context manager (``with client.claim(key, ttl=30) as c:``), it is
    extended every ``ttl / 3`` (by the client's heartbeat thread) while the
    block runs, and :func:`dedupd.current_claim` returns it. Set
    ``c.result`` in the block to store a result. Leaving the block:

    - normally: marks done with ``c.result`` (when JSON and small enough),
      the heartbeat going on until the done has gone through; raises
      DoneFailed (with ``.value``) when it does not;
    - by an exception: releases the key, and the exception goes on;
    - normally, but a heartbeat found the claim lost: raises ClaimLost, and
      does not mark done;
    - after ``c.done(...)`` or ``c.release()`` in the block: nothing more is
      sent (the heartbeat stopped with them), and an exception goes on.
    """

    def __init__(
        self,
        client: Client,
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
        # By this process's monotonic clock, when the claim has surely
        # expired unless an extend goes through: the last claim or extend
        # that did, from when it was sent, plus its TTL.
        self._deadline = sent_at + ttl
        self._failures = 0
        self._beating = False  # guarded by the heartbeats' lock
        self._entry: _Entry | None = None  # its heap entry (guarded by the heartbeats' lock)
        self._context: Token[BaseClaim] | None = None

    def done(self, result: Any = None, *, ttl: float | None = None) -> Record:
        """Marks the key done (for ``ttl``, else the claim's ``done_ttl``)
        with ``result``. In a ``with`` block, its heartbeat stops, and leaving
        the block sends nothing more."""
        record = self._done(result, ttl)
        self._finish()
        if isinstance(self._lost, AlreadyDone):  # a beat that came after this done
            self._lost = None
        return record

    def release(self) -> None:
        """Releases the key so a retry can claim it. In a ``with`` block, its
        heartbeat stops, and leaving the block sends nothing more."""
        self._client.release(self.key, self.token)
        self._finish()

    def extend(self, ttl: float | None = None) -> Record:
        """Extends the claim to ``ttl`` seconds from now (else the claim's
        TTL). A ``ttl`` given becomes the claim's TTL: its heartbeat extends
        by it from then on, every ``ttl / 3``."""
        new = self.ttl if ttl is None else _core.claim_ttl(ttl)
        sent_at = time.monotonic()
        record = self._client.extend(self.key, self.token, ttl=new)
        self.expires_at_ms = record.expires_at_ms
        self._deadline = sent_at + new
        if new != self.ttl:
            self.ttl = new
            self._interval = _core.beat_interval(new)
            self._client._heartbeats.reschedule(self)
        return record

    def _done(self, result: Any, ttl: float | None = None) -> Record:
        return self._client.done(
            self.key, self.token, ttl=self.done_ttl if ttl is None else ttl, result=result
        )

    def _finish(self) -> None:
        self._finished = True
        self._client._heartbeats.stop(self)

    def __enter__(self) -> Claim:
        if self._entered:
            raise RuntimeError("a Claim can be entered once")
        self._entered = True
        if not self._finished:
            self._client._heartbeats.start(self)
        self._context = _context.enter(self, self._client, threading.get_ident())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._leave(exc)
        finally:
            # After the done or release: the claim cannot lapse while they are retried.
            self._client._heartbeats.stop(self)
            _context.leave(self, self._context)

    def _leave(self, exc: BaseException | None) -> None:
        if self._finished:  # done or released in the block
            return
        if exc is not None:
            if self._lost is None:
                try:
                    self._client.release(self.key, self.token)
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
                    self._client.done(self.key, self.token, ttl=ttl, result=result)
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

    def _beat(self) -> float | None:
        """One heartbeat (on the client's heartbeat thread): extends the claim,
        and tells when to beat next, or ``None`` to stop (the claim is lost).
        The extend is sent once, waiting at most half the period for its
        answer (the thread beats for every claim of the client); a failed
        one is tried again sooner, by the next beat."""
        ttl = self.ttl
        sent_at = time.monotonic()
        try:
            record = self._client._run(
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
                return None
            self._failures += 1
            if time.monotonic() >= self._deadline:
                _core.log.error(
                    "the claim of %r has expired: extends failed for its whole TTL: %s", self.key, e
                )
                self._lost = e
                return None
            _core.log.warning("extending the claim of %r failed, retrying: %s", self.key, e)
            return _core.beat_retry(self._interval, self._failures)
        except Exception as e:  # a closed client, a bug: the claim cannot be vouched for
            _core.log.error("the heartbeat of %r stopped: %r", self.key, e)
            self._lost = e
            return None
        self.expires_at_ms = record.expires_at_ms
        self._deadline = sent_at + ttl
        self._failures = 0
        # A manual extend changed the TTL while this one was out: extend by it now.
        return 0.0 if self.ttl != ttl else self._interval


#: How long a client's heartbeat thread waits for another claim, once it has
#: none to keep, before it ends (the next claim starts another).
IDLE_SECONDS = 2.0


class _Entry:
    """A claim's place in the heap: a weak reference (a stale entry keeps
    neither the claim nor its client alive), and whether it is the claim's
    current one."""

    __slots__ = ("claim", "live")

    def __init__(self, claim: Claim) -> None:
        self.claim = weakref.ref(claim)
        self.live = True


class _Heartbeats:
    """The heartbeats of a client's claims held in ``with`` blocks: one thread
    (started with the first) extends each claim when it is due, every
    ``ttl / 3``. Entering and leaving a block costs a heap push and a flag,
    not a thread start and join, while blocks come at least every
    :data:`IDLE_SECONDS`: the thread ends once it has had no claim to keep
    for that long (the next claim starts another), or at once when its
    client is garbage collected, so a client dropped without ``close()``
    leaves no thread behind.

    Each beating claim has one live entry in the heap (``claim._entry``);
    entries of stopped or rescheduled claims stay until popped (or a
    compaction), and are skipped. Entries refer to their claims weakly."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, _Entry]] = []  # a heap
        self._stale = 0  # entries in the heap that are no longer live
        self._live = 0  # live entries in the heap
        self._order = itertools.count()
        self._busy: Claim | None = None  # the claim being extended now
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, claim: Claim) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the client is closed")
            claim._beating = True
            self._schedule(claim, claim._interval)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dedupd-heartbeat", daemon=True
                )
                self._thread.start()

    def reschedule(self, claim: Claim) -> None:
        """Makes the next beat of ``claim`` due one period from now (its
        period changed)."""
        with self._cond:
            if claim._beating and self._busy is not claim:
                self._schedule(claim, claim._interval)

    def stop(self, claim: Claim) -> None:
        """Stops beating for ``claim``; returns once no extend of it is in flight."""
        with self._cond:
            if claim._beating:
                claim._beating = False
                if claim._entry is not None:
                    self._retire(claim._entry)
                    claim._entry = None
                    if self._live == 0:
                        self._cond.notify_all()  # the thread has nothing left to keep
            while self._busy is claim:
                self._cond.wait()
            if self._stale > 64 and self._stale * 2 > len(self._due):
                kept = []
                for d in self._due:
                    if d[2].live and d[2].claim() is None:  # dropped while beating
                        d[2].live = False
                        self._live -= 1
                    if d[2].live:
                        kept.append(d)
                self._due = kept
                heapq.heapify(self._due)
                self._stale = 0

    def close(self) -> None:
        """Ends the thread; the claims still beating are lost."""
        self.abandon()
        with self._cond:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def abandon(self) -> None:
        """Tells the thread to end without waiting for it (its client is
        closed or garbage collected)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _retire(self, entry: _Entry) -> None:
        """Marks a live entry stale (with the lock held)."""
        entry.live = False
        self._stale += 1
        self._live -= 1

    def _schedule(self, claim: Claim, delay: float) -> None:
        """Pushes the claim's next beat (with the lock held)."""
        if claim._entry is not None:
            self._retire(claim._entry)
        entry = _Entry(claim)
        claim._entry = entry
        self._live += 1
        heapq.heappush(self._due, (time.monotonic() + delay, next(self._order), entry))
        if self._due[0][2] is entry:
            self._cond.notify_all()  # due before whatever the thread waits for

    def _next(self) -> Claim | None:
        """Waits (with the lock held) for the next beat that is due, and
        takes it: its claim, or ``None`` when the thread is to end."""
        idle_since: float | None = None
        while True:
            if self._closed:
                for _, _, entry in self._due:
                    held = entry.claim() if entry.live else None
                    if held is not None:
                        held._beating = False
                        held._entry = None
                        held._lost = RuntimeError("the client was closed with the claim held")
                self._thread = None
                return None
            while self._due:
                top = self._due[0][2]
                if top.live and top.claim() is not None:
                    break
                heapq.heappop(self._due)
                if top.live:  # its claim was dropped while beating
                    self._live -= 1
                else:
                    self._stale -= 1
            if not self._due:
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                if now - idle_since >= IDLE_SECONDS:
                    self._thread = None  # the next start makes another
                    return None
                self._cond.wait(idle_since + IDLE_SECONDS - now)
                continue
            idle_since = None
            wait = self._due[0][0] - time.monotonic()
            if wait <= 0:
                break
            self._cond.wait(wait)
        _, _, entry = heapq.heappop(self._due)
        claim = entry.claim()
        assert claim is not None  # checked above, with the lock held
        entry.live = False
        self._live -= 1
        claim._entry = None
        self._busy = claim
        return claim

    def _run(self) -> None:
        while True:
            with self._cond:
                claim = self._next()
            if claim is None:
                return
            delay = claim._beat()
            with self._cond:
                self._busy = None
                if claim._beating:
                    if delay is None:
                        claim._beating = False
                    else:
                        self._schedule(claim, delay)
                self._cond.notify_all()
            del claim  # not kept (nor its client) while the thread waits
