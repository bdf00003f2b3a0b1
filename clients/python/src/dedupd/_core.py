"""What the sync and async clients share: argument checks, each call's
request and the parsing of its answer, the retry rule, and results.

A :class:`Call` is one API request, built without I/O; the clients send it
(with :func:`retry_delay` deciding about retries) and hand the answer to its
``parse``.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Generic, NoReturn, TypeVar, cast
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from ._errors import (
    DedupdError,
    InvalidRequest,
    NotFound,
    ResultTooLarge,
    ServerError,
    from_problem,
)
from ._models import Applied, Head, Outcome, Record, State

T = TypeVar("T")

log = logging.getLogger("dedupd")

#: Largest result the decorator and the context manager store with a done,
#: as compact JSON (the server's ``claims.max_result_bytes`` by default).
DEFAULT_MAX_RESULT_BYTES = 65536

#: Keys (and streams) are at most this many bytes of UTF-8.
MAX_KEY_BYTES = 512

USER_AGENT = "dedupd-python/0.1.0"

#: The claim TTL of ``once`` and ``claim`` when none is given, in seconds.
DEFAULT_TTL = 300.0


# Argument checks: a clear error here rather than a puzzling answer later.


def check_url(url: str) -> str:
    if not isinstance(url, str):
        raise TypeError(f"url must be a str such as 'http://127.0.0.1:8080', got {url!r}")
    if any(c.isspace() or not c.isprintable() for c in url):
        # urlsplit drops a leading space; httpx would not, and every call
        # would fail as a network error, one retried as transient.
        raise ValueError(
            "url must not hold spaces, line breaks or other control characters (a value "
            f"pasted with them?), got {public_url(url)!r}"
        )
    if "?" in url or "#" in url:
        raise ValueError(
            "url must be dedupd's base URL, without a query (?...) or fragment (#...): the "
            f"API's paths would go inside it, got {public_url(url)!r}"
        )
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        # Not quoted whole: a user name and password in it stay out.
        raise ValueError(
            "url must be http:// or https:// with a host, and a port from 1 to 65535 if it "
            f"names one, such as 'http://127.0.0.1:8080', got {public_url(url)!r}"
        )
    return url.rstrip("/")


def check_key(key: object, what: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError(f"{what} must not be empty")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(
            f"{what} must be at most {MAX_KEY_BYTES} bytes of UTF-8, got {len(key.encode())}"
        )
    return key


def check_token(token: object) -> str:
    if not isinstance(token, str):
        raise TypeError(f"token must be the claim's token (a str), got {type(token).__name__}")
    return token


def ttl_ms(ttl: float | None, what: str = "ttl") -> int | None:
    """Seconds (int or float) as whole milliseconds, at least 1; ``None`` for
    the server's default."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {ttl!r}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {ttl!r}")
    return max(1, round(ttl * 1000))


def claim_ttl(ttl: float | None) -> float:
    """A claim's TTL: a number of seconds (never ``None``: the heartbeat
    needs to know it, and the server's answer only tells when it ends by the
    server's clock)."""
    if ttl is None:
        raise TypeError(
            f"ttl must be a number of seconds (the claim's TTL, {DEFAULT_TTL:g} when left out), "
            "not None"
        )
    ttl_ms(ttl)
    return float(ttl)


def check_seconds(value: float, what: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        least = "more than 0" if positive else "0 or more"
        raise ValueError(f"{what} must be {least} seconds, got {value!r}")
    return float(value)


def check_count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be zero or more, got {value!r}")
    return value


def headers(token: str | None) -> dict[str, str]:
    # dedupd never compresses: an answer that is compressed is not its own
    # (see Answer), and a small one could decode to gigabytes.
    h = {"user-agent": USER_AGENT, "accept": "application/json", "accept-encoding": "identity"}
    if token is not None:
        # Visible ASCII only: a line break or a NUL would fail every request
        # later, with the header, token and all, in httpx's error and log.
        if not isinstance(token, str) or not token or not all("!" <= c <= "~" for c in token):
            raise ValueError(
                "token must be a non-empty str of visible ASCII characters, without spaces "
                "or line breaks (an API token)"
            )
        h["authorization"] = f"Bearer {token}"
    return h


def basic_auth(url: str, token: str | None) -> tuple[str, httpx.BasicAuth | None]:
    """``url`` without its ``user:password@``, and those as the basic
    authentication httpx would send for them (to a proxy in front of
    dedupd): sent the same, but never in httpx's log of each request's URL.
    Refused beside a token: a request has one ``Authorization`` header, and
    the URL's would replace the token dedupd checks."""
    parts = httpx.URL(url)
    if not parts.userinfo:
        return url, None
    if token is not None:
        raise ValueError(
            f"url {public_url(url)!r} has a user and password, which would be sent as the "
            "Authorization header in place of the token: give one or the other"
        )
    return public_url(url), httpx.BasicAuth(parts.username, parts.password)


def created_at_text(created_at: str | datetime) -> str:
    if isinstance(created_at, datetime):
        if created_at.tzinfo is None or created_at.utcoffset() is None:
            raise ValueError(
                "created_at must be an aware datetime (with a timezone), got a naive one"
            )
        offset = created_at.utcoffset()
        if offset is not None and (offset.seconds % 60 or offset.microseconds):
            # RFC 3339 offsets are whole minutes (a historical zone's
            # +00:09:21 is not one): the same instant, in UTC.
            created_at = created_at.astimezone(timezone.utc)
        return created_at.isoformat()
    if not isinstance(created_at, str):
        raise TypeError(
            f"created_at must be an RFC 3339 str or an aware datetime, got {created_at!r}"
        )
    return created_at


def segment(key: str) -> str:
    """A key as one path segment: everything percent-encoded but unreserved
    characters, and ``.`` too, so that ``.`` and ``..`` stay keys rather
    than path steps."""
    return quote(key, safe="").replace(".", "%2E")


# Results.


def encode_result(value: Any, limit: int) -> Any:
    """``value`` when it can be stored as a done's result (JSON, and its
    compact encoding at most ``limit`` bytes), else ``None`` (logged)."""
    if value is None:
        return None
    try:
        size = len(json_bytes(value))
    except (TypeError, ValueError, RecursionError) as e:
        log.warning("the result (%s) is not JSON, so it is not stored: %s", type(value).__name__, e)
        return None
    if size > limit:
        log.warning("the result is %d bytes of JSON, over %d: it is not stored", size, limit)
        return None
    return value


def refuses_result(e: InvalidRequest) -> bool:
    """Whether the server refused a done for its result alone (too large, or
    nested too deep): it changed nothing, and a done without one will do."""
    return isinstance(e, ResultTooLarge) or e.field == "result"


def lighter_done(
    key: str, e: InvalidRequest, result: Any, ttl: float | None
) -> tuple[Any, float | None] | None:
    """What to send again a block's done with, that the server refused for
    its result or its TTL alone (it changed nothing): without the result
    (too large, nested too deep), or with the server's ``claims.max_ttl``
    for a TTL over it (as its refusal names it; without a TTL, its
    ``claims.default_done_ttl``, when it names none). The work
    has run: marking it done matters more than either, and failing instead
    would leave the key claimed, so the work would run again at the next
    delivery. None when neither is the cause."""
    if result is not None and refuses_result(e):
        log.warning("the result of %r is not stored: %s", key, e)
        return None, ttl
    if ttl is not None and e.field == "ttl_ms":
        most = _most_ms(e)
        if most is not None and most < ttl * 1000:
            log.warning(
                "the done_ttl of %r is refused (%s): marked done for the server's longest", key, e
            )
            return result, most / 1000
        log.warning(
            "the done_ttl of %r is refused (%s): marked done for the server's default done TTL",
            key,
            e,
        )
        return result, None
    return None


def _most_ms(e: InvalidRequest) -> int | None:
    """The longest TTL a refusal names, in ms: its problem's ``maximum``, or
    from a server that has none, its detail's ``must be at most N (the
    configured maximum)``."""
    maximum = e.problem.get("maximum")
    if isinstance(maximum, int) and not isinstance(maximum, bool) and maximum > 0:
        return maximum
    found = re.search(r"at most (\d+)", e.detail)
    return int(found.group(1)) if found else None


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def refuse_deferred(fn: Callable[..., Any], value: Any) -> None:
    """Raises TypeError when a function decorated with ``once`` returned work
    that runs later (a coroutine or other awaitable, a generator): it would
    run outside the claim, after the key was marked done."""
    if not (inspect.isawaitable(value) or inspect.isgenerator(value) or inspect.isasyncgen(value)):
        return
    if inspect.iscoroutine(value) or inspect.isgenerator(value):
        value.close()  # no "never awaited" warning: it is refused, not forgotten
    raise TypeError(
        f"{getattr(fn, '__qualname__', fn)!s} returned {type(value).__name__}, work that "
        "runs later, outside the claim: decorate a plain function with Client.once, an "
        "async def with AsyncClient.once"
    )


def refuse_generator_function(fn: Callable[..., Any]) -> None:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{getattr(fn, '__qualname__', fn)!s} is a generator function: its body runs when "
            "the generator is iterated, outside the claim; once cannot decorate it"
        )


# Secrets out of messages.

_REDACTED = "<redacted>"
_SHOWN_CHARS = 200


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _REDACTED if k == "token" else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def shown(value: Any) -> str:
    """``value`` for an error message: ``token`` fields redacted, at most 200
    characters."""
    text = repr(_redact(value))
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def public_url(url: str) -> str:
    """``url`` without its userinfo (``user:password@``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


# Calls.


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: ``read`` marks a read, ``owner`` a write that only the
    claim's owner can make and that changes nothing when made twice (done,
    release, extend): both are sent again after any network failure, even
    one after the request went out. ``key`` names the key or stream for
    errors. The body (with its owner token) is left out of the repr."""

    method: str
    path: str
    body: dict[str, Any] | None = field(repr=False)
    key: str
    parse: Callable[[httpx.Response], T] = field(repr=False)
    read: bool = False
    owner: bool = False

    @property
    def resendable(self) -> bool:
        """Whether sending it twice does what sending it once does."""
        return self.read or self.owner

    def content(self) -> bytes | None:
        return None if self.body is None else json_bytes(self.body)


def body_headers(call: Call[Any]) -> dict[str, str] | None:
    return None if call.body is None else {"content-type": "application/json"}


def _json(resp: httpx.Response, key: str) -> dict[str, Any]:
    try:
        value = resp.json()
    except (ValueError, RecursionError) as e:  # not JSON, or nested past Python's stack
        raise ServerError(
            f"HTTP {resp.status_code} with a body that is not JSON",
            status=resp.status_code,
            key=key,
        ) from e
    if not isinstance(value, dict):
        raise ServerError(
            f"HTTP {resp.status_code} with an unexpected body: {shown(value)}",
            status=resp.status_code,
            key=key,
        )
    return value


def error(resp: httpx.Response, key: str) -> DedupdError:
    """The exception for an error answer."""
    try:
        problem = resp.json()
    except (ValueError, RecursionError):
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    return from_problem(resp.status_code, problem, retry_after=retry_after(resp.headers), key=key)


def _ok(resp: httpx.Response, key: str) -> dict[str, Any]:
    if resp.is_success:
        return _json(resp, key)
    raise error(resp, key)


def _field(body: Mapping[str, Any], name: str, kind: type[T], resp: httpx.Response) -> T:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ServerError(
            f"the answer's {name!r} is not a {kind.__name__}: {shown(dict(body))}",
            status=resp.status_code,
        )
    return value


def _record(resp: httpx.Response, key: str) -> Record:
    body = _ok(resp, key)
    state = _field(body, "state", str, resp)
    if state not in ("processing", "done"):
        raise ServerError(f"unknown state {state!r}", status=resp.status_code, key=key)
    fence = body.get("fence")
    return Record(
        key=_field(body, "key", str, resp),
        state=cast(State, state),
        expires_at_ms=_field(body, "expires_at_ms", int, resp),
        fence=fence if isinstance(fence, int) else None,
        result=body.get("result"),
    )


@dataclass(frozen=True)
class Grant:
    """A successful claim's answer."""

    key: str
    token: str
    fence: int
    expires_at_ms: int


def claim(key: str, ttl: float | None, fingerprint: str | None) -> Call[Grant]:
    key = check_key(key)
    body: dict[str, Any] = {}
    ms = ttl_ms(ttl)
    if ms is not None:
        body["ttl_ms"] = ms
    if fingerprint is not None:
        if not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str, got {fingerprint!r}")
        body["fingerprint"] = fingerprint

    def parse(resp: httpx.Response) -> Grant:
        b = _ok(resp, key)
        return Grant(
            key=_field(b, "key", str, resp),
            token=_field(b, "token", str, resp),
            fence=_field(b, "fence", int, resp),
            expires_at_ms=_field(b, "expires_at_ms", int, resp),
        )

    return Call("POST", f"/v1/claims/{segment(key)}", body, key, parse)


def done(key: str, token: str, ttl: float | None, result: Any) -> Call[Record]:
    key = check_key(key)
    body: dict[str, Any] = {"token": check_token(token)}
    ms = ttl_ms(ttl)
    if ms is not None:
        body["ttl_ms"] = ms
    if result is not None:
        body["result"] = result
    # Fail here, not in the middle of sending, on a result that is not JSON.
    json_bytes(body)
    return Call(
        "POST", f"/v1/claims/{segment(key)}/done", body, key, lambda r: _record(r, key), owner=True
    )


def extend(key: str, token: str, ttl: float | None) -> Call[Record]:
    key = check_key(key)
    body: dict[str, Any] = {"token": check_token(token)}
    ms = ttl_ms(ttl)
    if ms is not None:
        body["ttl_ms"] = ms
    return Call(
        "POST",
        f"/v1/claims/{segment(key)}/extend",
        body,
        key,
        lambda r: _record(r, key),
        owner=True,
    )


def release(key: str, token: str) -> Call[None]:
    key = check_key(key)

    def parse(resp: httpx.Response) -> None:
        if resp.status_code == 204:
            return
        if resp.is_success:
            # dedupd answers 204: a 200 with a page is something between.
            raise ServerError(
                f"HTTP {resp.status_code} to a release, not dedupd's 204: the release is not "
                "known to have been made",
                status=resp.status_code,
                key=key,
            )
        raise error(resp, key)

    body = {"token": check_token(token)}
    return Call("DELETE", f"/v1/claims/{segment(key)}", body, key, parse, owner=True)


#: How dedupd's ``not_found`` for a path it has no route for begins (its
#: answer to a key or stream with no record says something else).
UNKNOWN_ROUTE = "no resource at "


def _absent(resp: httpx.Response, key: str) -> bool:
    """Whether the answer is dedupd's ``404 not_found`` for the key or
    stream (raises any other 404: one without the problem's code is not
    dedupd's, a wrong base path behind a proxy say, and dedupd's own for a
    path it has no route for, a wrong base path pointed at dedupd, tells
    nothing about the key either)."""
    if resp.status_code != 404:
        return False
    e = error(resp, key)
    if type(e) is NotFound and e.code == "not_found":
        if e.detail.startswith(UNKNOWN_ROUTE):
            path = e.detail[len(UNKNOWN_ROUTE) :]
            raise ServerError(
                f"dedupd has no resource at {path}: the url is not dedupd's API base (a "
                "wrong base path?)",
                status=404,
                code=e.code,
                problem=e.problem,
                key=key,
            )
        return True
    if e.code is None:
        raise ServerError(
            "HTTP 404 without dedupd's not_found problem: is the url dedupd's API (a proxy's "
            "base path)?",
            status=404,
            key=key,
        )
    raise e


def get(key: str) -> Call[Record | None]:
    key = check_key(key)

    def parse(resp: httpx.Response) -> Record | None:
        return None if _absent(resp, key) else _record(resp, key)

    return Call("GET", f"/v1/claims/{segment(key)}", None, key, parse, read=True)


def _head(value: object, resp: httpx.Response) -> Head:
    if not isinstance(value, dict):
        raise ServerError(
            f"the answer's head is not an object: {shown(value)}", status=resp.status_code
        )
    return Head(
        event_id=_field(value, "event_id", str, resp),
        created_at=_field(value, "created_at", str, resp),
    )


def apply(stream: str, event_id: str, created_at: str | datetime) -> Call[Applied]:
    stream = check_key(stream, "stream")
    body = {"event_id": check_key(event_id, "event_id"), "created_at": created_at_text(created_at)}

    def parse(resp: httpx.Response) -> Applied:
        b = _ok(resp, stream)
        outcome = _field(b, "outcome", str, resp)
        if outcome not in ("applied", "stale", "duplicate"):
            raise ServerError(f"unknown outcome {outcome!r}", status=resp.status_code, key=stream)
        head = b.get("head")
        return Applied(
            stream=_field(b, "stream", str, resp),
            outcome=cast(Outcome, outcome),
            head=None if head is None else _head(head, resp),
        )

    return Call("POST", f"/v1/streams/{segment(stream)}/apply", body, stream, parse)


def head(stream: str) -> Call[Head | None]:
    stream = check_key(stream, "stream")

    def parse(resp: httpx.Response) -> Head | None:
        return None if _absent(resp, stream) else _head(_ok(resp, stream).get("head"), resp)

    return Call("GET", f"/v1/streams/{segment(stream)}", None, stream, parse, read=True)


# Retries.


def retry_after(headers: httpx.Headers) -> float | None:
    """The ``Retry-After`` header in seconds (delay-seconds or an HTTP date)."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    if raw.isascii() and raw.isdigit():  # not "²", a digit to str.isdigit
        return float(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - datetime.now(tz=when.tzinfo).timestamp())


def backoff(attempt: int) -> float:
    """A jittered delay before retry ``attempt`` (0, 1, ...): 50 ms doubling, at most 1 s."""
    return min(1.0, 0.05 * 2.0**attempt) * random.uniform(0.5, 1.0)


#: The problem codes of dedupd's answers that changed nothing and say when to
#: come back (503 and 507 with ``Retry-After``). A 503 without one of them
#: may be a proxy's, after it forwarded the request.
NOTHING_CHANGED = frozenset({"store_unavailable", "insufficient_storage", "keys_in_memory_full"})


def problem_code(resp: httpx.Response) -> str | None:
    try:
        problem = resp.json()
    except ValueError:
        return None
    code = problem.get("code") if isinstance(problem, dict) else None
    return code if isinstance(code, str) else None


def retry_delay(
    call: Call[Any], resp: httpx.Response, attempt: int, max_wait: float
) -> float | None:
    """How long to wait before sending ``call`` again after ``resp``, or
    ``None`` not to. A claim or an apply is sent again only when dedupd said
    it changed nothing and when to come back: 503 or 507 with one of the
    :data:`NOTHING_CHANGED` codes and ``Retry-After`` (at most ``max_wait``
    seconds). A read, or an owner's done, release or extend, is also sent
    again after any 503 or 507 with ``Retry-After``, and after a 502, 503 or
    504 without one."""
    status = resp.status_code
    if status in (503, 507):
        after = retry_after(resp.headers)
        if after is not None and (call.resendable or problem_code(resp) in NOTHING_CHANGED):
            return after if after <= max_wait else None
    if call.resendable and status in (502, 503, 504):
        return backoff(attempt)
    return None


# A failed connect sent nothing, so any request may be sent again after one.
CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)


def may_resend(call: Call[Any], e: httpx.TransportError) -> bool:
    """Whether ``call`` may be sent again after a network failure: a read, or
    an owner's done, release or extend, always (twice does what once does);
    a claim or an apply only when its connection could not be opened (a
    dropped answer may follow a claim that was made)."""
    return call.resendable or isinstance(e, CONNECT_FAILURES)


#: The largest answer the clients read, in bytes: dedupd's largest is a done
#: key's record or ``409 done`` with its result, at most ``claims.max_result_bytes``
#: (1 MiB at most, 64 KiB by default) and a key of 512 bytes. A larger answer is
#: not dedupd's, and is refused before it is read whole.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class Answer:
    """An answer's body, read as it comes and never past
    :data:`MAX_ANSWER_BYTES`. An answer that is compressed (dedupd never
    compresses, and the client asks for ``identity``) or says it is longer
    is refused before its body is read. The sync and async clients feed
    it their chunks (:meth:`add`) while :attr:`streamed`."""

    def __init__(self, call: Call[Any], resp: httpx.Response) -> None:
        self._call = call
        self._resp = resp
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ServerError(
                f"HTTP {resp.status_code} with a body in Content-Encoding {shown(encoding)}, "
                "which dedupd never sends (the client asks for identity): not read",
                status=resp.status_code,
                key=call.key,
            )
        length = resp.headers.get("content-length", "").strip()
        if length.isascii() and length.isdigit() and int(length) > MAX_ANSWER_BYTES:
            self._too_large(f"of {int(length)} bytes")
        self._chunks: list[bytes] = []
        self._total = 0
        try:
            # Given already read by its transport (a test's MockTransport).
            self._chunks.append(resp.content)
            self.streamed = False
        except httpx.ResponseNotRead:
            self.streamed = True
        self._count(sum(map(len, self._chunks)))

    def add(self, chunk: bytes) -> None:
        """Takes the next chunk of the body; raises once it is too long."""
        self._count(len(chunk))
        self._chunks.append(chunk)

    def response(self) -> httpx.Response:
        """The answer, its body read whole."""
        r = self._resp
        content = b"".join(self._chunks)
        return httpx.Response(
            r.status_code,
            headers=r.headers,
            content=content,
            request=r.request,
            extensions=r.extensions,
        )

    def _count(self, n: int) -> None:
        self._total += n
        if self._total > MAX_ANSWER_BYTES:
            self._too_large(f"of more than {MAX_ANSWER_BYTES} bytes")

    def _too_large(self, size: str) -> NoReturn:
        raise ServerError(
            f"HTTP {self._resp.status_code} with a body {size}, over the {MAX_ANSWER_BYTES} "
            "bytes of the largest answer dedupd sends: not read",
            status=self._resp.status_code,
            key=self._call.key,
        )


def undecodable(call: Call[Any], e: httpx.DecodingError) -> ServerError:
    """The error for an answer whose body its ``Content-Encoding`` does not
    decode: not dedupd's."""
    return ServerError(f"an answer that cannot be decoded: {e}", key=call.key)


def network_detail(url: str, e: httpx.TransportError) -> str:
    safe = public_url(url)
    message = str(e)
    userinfo = urlsplit(url).netloc.rpartition("@")[0]
    if userinfo:
        message = message.replace(userinfo, _REDACTED)
    return f"no answer from {safe}: {type(e).__name__}: {message}"


# Once and its claims.


def poll_delay(attempt: int) -> float:
    """The wait before claiming a busy key again: 10 ms doubling, at most 250 ms, jittered."""
    return min(0.25, 0.01 * 2.0**attempt) * random.uniform(0.5, 1.0)


def beat_interval(ttl: float) -> float:
    """The heartbeat's period: a third of the claim's TTL (by this process's
    monotonic clock, never the server's expiry against the local wall clock)."""
    return max(0.001, ttl / 3)


def beat_timeout(timeout: float, interval: float) -> float:
    """How long a heartbeat's extend waits for its answer: at most half the
    period, so that a slow answer leaves time for another beat before the
    claim ends."""
    return min(timeout, interval / 2)


def beat_retry(interval: float, failures: int) -> float:
    """The wait before the next beat after ``failures`` failed ones in a row:
    sooner than the period (at most a third of it, 50 ms doubling to 1 s,
    jittered), never less than 5 ms."""
    return max(0.005, min(interval / 3, backoff(failures - 1)))


def ends_claim(e: DedupdError) -> bool:
    """Whether an extend's refusal means the claim is gone for good: a 4xx
    answer (``lost``, ``not_owner``, ``done``, and ``unauthorized``,
    ``read_only_token``, an invalid request, which retrying cannot change),
    but not 408 or 429. No answer, a 5xx or an answer this client does not
    understand is worth another try."""
    return e.status is not None and 400 <= e.status < 500 and e.status not in (408, 429)


@dataclass(frozen=True)
class Once:
    """The checked settings of ``once``."""

    key: Callable[..., str]
    ttl: float
    done_ttl: float | None
    fingerprint: Callable[..., str] | None
    wait: float
    raise_if_done: bool

    @classmethod
    def check(
        cls,
        key: Callable[..., str],
        ttl: float,
        done_ttl: float | None,
        fingerprint: Callable[..., str] | None,
        wait: float,
        raise_if_done: bool,
    ) -> Once:
        if not callable(key):
            raise TypeError(
                "key must be a function of the decorated function's arguments that returns the "
                "key, such as key=lambda event: event['request_id']"
            )
        if fingerprint is not None and not callable(fingerprint):
            raise TypeError("fingerprint must be a function of the decorated function's arguments")
        ttl = claim_ttl(ttl)
        ttl_ms(done_ttl, "done_ttl")
        return cls(
            key, ttl, done_ttl, fingerprint, check_seconds(wait, "wait"), bool(raise_if_done)
        )

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str | None]:
        """The key and fingerprint of one call."""
        key = check_key(self.key(*args, **kwargs), "the key function's value")
        fp = None if self.fingerprint is None else self.fingerprint(*args, **kwargs)
        if fp is not None and not isinstance(fp, str):
            raise TypeError(f"the fingerprint function must return a str, got {fp!r}")
        return key, fp
