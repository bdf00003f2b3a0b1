"""Which requests are sent again, and which exception each problem code
raises. Retries need failures a healthy server does not give on demand, so
these tests answer from an httpx.MockTransport (test_client.py has the
real 503 of a store outage)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import pickle
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import dedupd
from dedupd import _core
from dedupd._errors import error_class

from conftest import wait_until

URL = "http://dedupd.test"
TOKEN = "ab" * 16


def scripted(*answers: httpx.Response | Exception) -> tuple[httpx.MockTransport, list[str]]:
    """A transport giving ``answers`` in order (an exception is raised), and the
    list of requests it saw."""
    seen: list[str] = []
    it: Iterator[httpx.Response | Exception] = iter(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.raw_path.decode()}")
        answer = next(it)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle), seen


def problem(
    status: int, code: str, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"type": f"urn:dedupd:problem:{code}", "status": status, "code": code, "detail": code}
    return httpx.Response(status, json={**body, **extra}, headers=headers)


CLAIMED = httpx.Response(
    201, json={"key": "k", "state": "processing", "token": TOKEN, "fence": 1, "expires_at_ms": 1}
)
STATE = httpx.Response(
    200, json={"key": "k", "state": "processing", "fence": 1, "expires_at_ms": 1}
)


def client(transport: httpx.MockTransport, **kw: Any) -> dedupd.Client:
    return dedupd.Client(URL, token=TOKEN, transport=transport, max_retry_wait=0.05, **kw)


def read_error() -> httpx.ReadError:
    return httpx.ReadError("connection reset")


def test_a_write_the_server_did_not_apply_is_sent_again() -> None:
    t, seen = scripted(
        problem(503, "store_unavailable", {"Retry-After": "0"}),
        problem(507, "keys_in_memory_full", {"Retry-After": "0"}),
        CLAIMED,
    )
    assert client(t).claim("k").fence == 1
    assert seen == ["POST /v1/claims/k"] * 3


def test_a_connect_failure_sent_nothing_so_a_write_is_sent_again() -> None:
    t, seen = scripted(httpx.ConnectError("refused"), CLAIMED)
    assert client(t).claim("k").token == TOKEN
    assert len(seen) == 2


@pytest.mark.parametrize(
    "answer",
    [
        problem(503, "store_unavailable"),  # no Retry-After
        problem(507, "insufficient_storage", {"Retry-After": "30"}),  # longer than max_retry_wait
        problem(500, "internal"),
        httpx.ReadTimeout("no answer in time"),  # the claim may have been made
    ],
    ids=["503-without-retry-after", "retry-after-too-long", "500", "read-timeout"],
)
def test_a_write_that_may_have_changed_something_is_not_sent_again(
    answer: httpx.Response | Exception,
) -> None:
    t, seen = scripted(answer, CLAIMED)
    with pytest.raises((dedupd.Unavailable, dedupd.ServerError, dedupd.NetworkError)):
        client(t).claim("k")
    assert len(seen) == 1


def test_a_read_is_sent_again_after_a_network_failure_or_a_502() -> None:
    t, seen = scripted(read_error(), httpx.Response(502), STATE)
    record = client(t).get("k")
    assert record is not None
    assert record.fence == 1
    assert seen == ["GET /v1/claims/k"] * 3


def test_retries_are_bounded() -> None:
    t, seen = scripted(*[read_error()] * 10)
    with pytest.raises(dedupd.NetworkError):
        client(t, retries=2).get("k")
    assert len(seen) == 3
    busy = [problem(503, "store_unavailable", {"Retry-After": "0"})] * 10
    t, seen = scripted(*busy)
    with pytest.raises(dedupd.Unavailable) as e:
        client(t, retries=3).done("k", TOKEN)
    assert (len(seen), e.value.retry_after) == (4, 0.0)


def test_the_async_client_retries_by_the_same_rule() -> None:
    import asyncio

    async def run() -> list[str]:
        seen: list[str] = []
        answers = iter([problem(503, "store_unavailable", {"Retry-After": "0"}), read_error()])

        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request.method)
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

        async with dedupd.AsyncClient(URL, transport=httpx.MockTransport(handle)) as c:
            with pytest.raises(dedupd.NetworkError):
                await c.claim("k")
        return seen

    assert asyncio.run(run()) == ["POST", "POST"]


def test_every_request_carries_the_token_and_json() -> None:
    requests: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(204)

    dedupd.Client(URL, token=TOKEN, transport=httpx.MockTransport(handle)).release("a/b c", TOKEN)
    (r,) = requests
    assert r.headers["authorization"] == f"Bearer {TOKEN}"
    assert r.headers["content-type"] == "application/json"
    assert r.url.raw_path == b"/v1/claims/a%2Fb%20c"
    assert r.content == f'{{"token":"{TOKEN}"}}'.encode()


def documented_codes() -> list[tuple[int, str]]:
    """(status, code) of each row of the errors table in docs/claims.md."""
    doc = Path(__file__).resolve().parents[3] / "docs" / "claims.md"
    rows = re.findall(r"^\| (\d{3}) \| (.+?) \|", doc.read_text(), re.M)
    codes = [(int(s), c) for s, cell in rows for c in re.findall(r"`([a-z_]+)`", cell)]
    assert len(codes) > 30
    return codes


EXPECTED: dict[str, type[dedupd.DedupdError]] = {
    "busy": dedupd.Busy,
    "done": dedupd.AlreadyDone,
    "not_owner": dedupd.NotOwner,
    "lost": dedupd.Lost,
    "fingerprint_mismatch": dedupd.FingerprintMismatch,
    "store_unavailable": dedupd.Unavailable,
    "insufficient_storage": dedupd.Unavailable,
    "keys_in_memory_full": dedupd.Unavailable,
    "unauthorized": dedupd.Unauthorized,
    "not_found": dedupd.NotFound,
    "internal": dedupd.ServerError,
    "invalid_key": dedupd.InvalidRequest,
    "result_too_large": dedupd.ResultTooLarge,
}


@pytest.mark.parametrize(("status", "code"), [*documented_codes(), (413, "result_too_large")])
def test_every_documented_code_raises_a_named_exception(status: int, code: str) -> None:
    cls = error_class(status, code)
    assert cls is not dedupd.DedupdError
    if code in EXPECTED:
        assert cls is EXPECTED[code]
    elif code != "internal":
        assert cls is not dedupd.ServerError, f"{code} falls through to ServerError"


def test_a_problem_becomes_its_exception_with_its_fields() -> None:
    cases: list[tuple[httpx.Response, Callable[[dedupd.DedupdError], Any], Any]] = [
        (
            problem(409, "done", state="done", expires_at_ms=5, result={"a": 1}),
            lambda e: e.result,
            {"a": 1},
        ),
        (problem(409, "busy", state="processing", expires_at_ms=5), lambda e: e.expires_at_ms, 5),
        (problem(503, "store_unavailable", {"Retry-After": "1"}), lambda e: e.retry_after, 1.0),
        (problem(400, "invalid_ttl", field="ttl_ms"), lambda e: e.field, "ttl_ms"),
        (httpx.Response(500, text="oops"), lambda e: type(e), dedupd.ServerError),
        (httpx.Response(418, json=[1]), lambda e: type(e), dedupd.ServerError),
    ]
    for answer, get, expected in cases:
        t, _ = scripted(answer)
        with pytest.raises(dedupd.DedupdError) as e:
            client(t, retries=0).claim("k")
        assert get(e.value) == expected
        assert e.value.status == answer.status_code


# Owner writes: done, release and extend do nothing more when sent twice.

DROPPED: list[Callable[[], Exception]] = [
    lambda: httpx.ReadError("connection reset"),
    lambda: httpx.RemoteProtocolError("Server disconnected without sending a response."),
    lambda: httpx.ReadTimeout("timed out"),
    lambda: httpx.WriteError("broken pipe"),
]
DROPPED_IDS = ["read-error", "server-disconnected", "read-timeout", "write-error"]


def record(state: str = "processing") -> httpx.Response:
    return httpx.Response(200, json={"key": "k", "state": state, "expires_at_ms": 1})


OWNER_CALLS: dict[str, tuple[Callable[[dedupd.Client], Any], Callable[[], httpx.Response]]] = {
    "done": (lambda c: c.done("k", TOKEN, result=[1]), lambda: record("done")),
    "release": (lambda c: c.release("k", TOKEN), lambda: httpx.Response(204)),
    "extend": (lambda c: c.extend("k", TOKEN, ttl=30), record),
}


@pytest.mark.parametrize("dropped", DROPPED, ids=DROPPED_IDS)
@pytest.mark.parametrize("name", list(OWNER_CALLS))
def test_an_owners_write_is_sent_again_after_a_dropped_answer(
    name: str, dropped: Callable[[], Exception]
) -> None:
    call, answer = OWNER_CALLS[name]
    t, seen = scripted(dropped(), dropped(), answer())
    call(client(t))
    assert len(seen) == 3
    assert len(set(seen)) == 1


@pytest.mark.parametrize("dropped", DROPPED, ids=DROPPED_IDS)
@pytest.mark.parametrize(
    "call",
    [lambda c: c.claim("k"), lambda c: c.apply("s", "e", "2026-01-01T00:00:00Z")],
    ids=["claim", "apply"],
)
def test_a_claim_or_apply_is_not_sent_again_once_it_may_have_arrived(
    call: Callable[[dedupd.Client], Any], dropped: Callable[[], Exception]
) -> None:
    t, seen = scripted(dropped(), CLAIMED)
    with pytest.raises(dedupd.NetworkError):
        call(client(t))
    assert len(seen) == 1


def proxy_503() -> httpx.Response:
    return httpx.Response(503, text="<h1>Service Unavailable</h1>", headers={"Retry-After": "0"})


def test_a_503_that_is_not_dedupds_resends_only_what_is_safe() -> None:
    """A proxy's 503 may come after it forwarded the request: a claim is not
    sent again (the claim may be made); a read, or a done, is."""
    t, seen = scripted(proxy_503(), CLAIMED)
    with pytest.raises(dedupd.Unavailable) as e:
        client(t).claim("k")
    assert (len(seen), e.value.status, e.value.code) == (1, 503, None)
    t, seen = scripted(proxy_503(), STATE)
    assert client(t).get("k") is not None
    assert len(seen) == 2
    t, seen = scripted(proxy_503(), record("done"))
    assert client(t).done("k", TOKEN).state == "done"
    assert len(seen) == 2
    # A 503 of dedupd's that names something else is not a "nothing changed" either.
    t, seen = scripted(problem(503, "something_else", {"Retry-After": "0"}), CLAIMED)
    with pytest.raises(dedupd.Unavailable):
        client(t).claim("k")
    assert len(seen) == 1


@pytest.mark.parametrize(
    "answer",
    [
        lambda: httpx.Response(404, text="<h1>Not Found</h1>"),
        lambda: httpx.Response(404, json={"error": "no such route"}),
        lambda: httpx.Response(404),
    ],
    ids=["html", "other-json", "empty"],
)
def test_only_dedupds_not_found_is_an_absent_key(answer: Callable[[], httpx.Response]) -> None:
    t, _ = scripted(answer(), answer())
    c = client(t)
    with pytest.raises(dedupd.ServerError, match="not_found"):
        c.get("k")
    with pytest.raises(dedupd.ServerError, match="not_found"):
        c.head("s")
    t, _ = scripted(problem(404, "not_found"), problem(404, "not_found"))
    c = client(t)
    assert c.get("k") is None
    assert c.head("s") is None


def test_every_error_pickles_with_its_fields() -> None:
    e = dedupd.Busy(
        "held", status=409, code="busy", problem={"code": "busy", "expires_at_ms": 5}, key="k"
    )
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is dedupd.Busy
    assert (again.detail, again.status, again.code, again.key) == ("held", 409, "busy", "k")
    assert again.problem == {"code": "busy", "expires_at_ms": 5}
    assert str(again) == str(e)


def test_secrets_stay_out_of_messages_and_reprs() -> None:
    # A malformed answer that carries the owner token.
    malformed = {"key": "k", "token": TOKEN, "fence": "one", "expires_at_ms": 1, "x": "y" * 500}
    t, _ = scripted(httpx.Response(201, json=malformed))
    with pytest.raises(dedupd.ServerError) as e:
        client(t).claim("k")
    assert "fence" in str(e.value)
    assert len(str(e.value)) < 400
    for text in (str(e.value), repr(e.value)):
        assert TOKEN not in text
    # The URL's userinfo.
    t, _ = scripted(httpx.ConnectError("refused"))
    c = dedupd.Client("http://user:s3cret@dedupd.test", transport=t, retries=0)
    with pytest.raises(dedupd.NetworkError) as n:
        c.get("k")
    assert "dedupd.test" in str(n.value)
    assert "s3cret" not in str(n.value)
    assert "s3cret" not in repr(n.value)
    # The calls, with the token in their bodies.
    for call in (
        _core.done("k", TOKEN, None, {"a": 1}),
        _core.release("k", TOKEN),
        _core.extend("k", TOKEN, 30),
    ):
        assert TOKEN not in repr(call)


def test_a_token_that_would_break_its_header_is_refused_without_being_shown() -> None:
    for bad in ("tok_s3cret\nX-Evil: 1", "tok_s3cret\r", "tok_s3cret\x00", "tøk_s3cret", " tok"):
        with pytest.raises(ValueError, match="visible ASCII") as e:
            dedupd.Client(URL, token=bad)
        assert "s3cret" not in str(e.value)
        with pytest.raises(ValueError, match="visible ASCII"):
            dedupd.AsyncClient(URL, token=bad)


def test_a_urls_user_and_password_are_basic_auth_never_logged_nor_beside_a_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ValueError, match="in place of the token") as e:
        dedupd.Client("http://user:s3cret@dedupd.test", token=TOKEN)
    assert "s3cret" not in str(e.value)
    with pytest.raises(ValueError, match="in place of the token"):
        dedupd.AsyncClient("http://user:s3cret@dedupd.test", token=TOKEN)
    # Without a token: sent as basic authentication (to a proxy in front of
    # dedupd, say), as httpx would, but kept out of its request log.
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization", ""))
        return problem(404, "not_found")

    c = dedupd.Client("http://user:s3cret@dedupd.test", transport=httpx.MockTransport(handle))
    with caplog.at_level(logging.DEBUG):
        assert c.get("k") is None
    assert seen == ["Basic " + base64.b64encode(b"user:s3cret").decode()]
    assert c.url == "http://dedupd.test"
    assert "dedupd.test" in caplog.text
    assert "s3cret" not in caplog.text


class Unread(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body read by the client as it comes, not by the test's Response."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body


@pytest.mark.parametrize(
    "answer",
    [
        lambda: httpx.Response(
            200, stream=Unread(b"not gzip"), headers={"content-encoding": "gzip"}
        ),
        lambda: httpx.Response(
            200, content=b"[" * 200_000, headers={"content-type": "application/json"}
        ),
        lambda: httpx.Response(409, content=b"{" * 200_000),
    ],
    ids=["bad-gzip", "deep-json", "deep-problem"],
)
def test_an_answer_that_cannot_be_read_is_a_dedupd_error(
    answer: Callable[[], httpx.Response],
) -> None:
    t, _ = scripted(answer())
    with pytest.raises(dedupd.DedupdError):
        client(t, retries=0).get("k")


class Huge(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body four times the largest the client reads (a misbehaving peer's,
    or a proxy's huge page; as large as it likes in truth), counting the bytes
    handed to the client."""

    CHUNK = b" " * 65536

    def __init__(self) -> None:
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < 4 * _core.MAX_ANSWER_BYTES:
            self.sent += len(self.CHUNK)
            yield self.CHUNK

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self:
            yield chunk


def both_clients(handle: Callable[[httpx.Request], httpx.Response], call: str) -> list[Any]:
    """What ``get(call)`` raises or returns on the blocking client and on the
    async one, each answered by ``handle``."""
    outcomes: list[Any] = []
    with dedupd.Client(URL, token=TOKEN, transport=httpx.MockTransport(handle)) as c:
        try:
            outcomes.append(c.get(call))
        except dedupd.DedupdError as e:
            outcomes.append(e)

    async def run() -> None:
        async with dedupd.AsyncClient(URL, token=TOKEN, transport=httpx.MockTransport(handle)) as c:
            try:
                outcomes.append(await c.get(call))
            except dedupd.DedupdError as e:
                outcomes.append(e)

    asyncio.run(run())
    return outcomes


def test_an_answer_larger_than_dedupds_largest_is_refused_without_being_read_whole() -> None:
    bodies: list[Huge] = []

    def huge(request: httpx.Request) -> httpx.Response:
        bodies.append(Huge())
        return httpx.Response(500, stream=bodies[-1])

    for e in both_clients(huge, "k"):
        assert isinstance(e, dedupd.ServerError), repr(e)
        assert "over the" in str(e)
        assert "not read" in str(e)
    assert len(bodies) == 2  # refused at once, not retried
    for body in bodies:
        assert body.sent <= _core.MAX_ANSWER_BYTES + len(Huge.CHUNK)

    # One that says how long it is: refused before any of it is read.
    def announced(request: httpx.Request) -> httpx.Response:
        bodies.append(Huge())
        return httpx.Response(200, headers={"content-length": str(1 << 30)}, stream=bodies[-1])

    bodies.clear()
    for e in both_clients(announced, "k"):
        assert isinstance(e, dedupd.ServerError), repr(e)
        assert f"of {1 << 30} bytes" in str(e)
    assert [b.sent for b in bodies] == [0, 0]

    # The largest record dedupd sends (a result of 1 MiB, claims.max_result_bytes'
    # most, with a key of 512 bytes) is read as it always was.
    record = {
        "key": "k" * 512,
        "state": "done",
        "fence": 1,
        "expires_at_ms": 1,
        "result": ["x" * 1022] * 1024,
    }
    assert len(json.dumps(record)) > 1 << 20
    for got in both_clients(lambda request: httpx.Response(200, json=record), "k"):
        assert isinstance(got, dedupd.Record), repr(got)
        assert got.result == record["result"]


def test_a_compressed_answer_is_refused_and_never_decoded() -> None:
    # dedupd never compresses, and the client asks it not to: a gzip body
    # (1 MiB of it can decode to 1 GiB) is not dedupd's, and is not decoded.
    bomb = gzip.compress(b" " * (8 << 20))
    asked: list[str | None] = []

    def gzipped(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("accept-encoding"))
        return httpx.Response(200, stream=Unread(bomb), headers={"content-encoding": "gzip"})

    for e in both_clients(gzipped, "k"):
        assert isinstance(e, dedupd.ServerError), repr(e)
        assert "Content-Encoding 'gzip'" in str(e)
    assert asked == ["identity", "identity"]


def test_a_retry_after_that_is_not_ascii_digits_is_no_delay() -> None:
    t, seen = scripted(
        httpx.Response(
            503,
            json={"code": "store_unavailable"},
            headers=[(b"retry-after", "\u00b2".encode())],  # a digit to str.isdigit
        ),
        STATE,
    )
    assert client(t, retries=1).get("k") is not None
    assert len(seen) == 2


def test_a_release_answered_by_something_else_is_not_taken_for_one() -> None:
    t, _ = scripted(httpx.Response(200, html="<html>captive portal</html>"))
    with pytest.raises(dedupd.ServerError, match="not dedupd's 204"):
        client(t, retries=0).release("k", TOKEN)


def test_the_blocks_exception_goes_on_whatever_its_release_meets() -> None:
    for release in (
        lambda: httpx.Response(200, stream=Unread(b"x"), headers={"content-encoding": "gzip"}),
        lambda: httpx.Response(500, content=b"[" * 200_000),
    ):
        t, seen = routed(claim=claimed, release=release)
        with client(t, retries=0) as c:

            @c.once(key=lambda: "k")
            def work() -> None:
                raise KeyError("the user's own")

            with pytest.raises(KeyError, match="the user's own"):
                work()
        assert seen == ["claim", "release"]


# The heartbeat and the way out, against scripted answers.


def routed(
    **answers: Callable[[], httpx.Response | Exception],
) -> tuple[httpx.MockTransport, list[str]]:
    """A transport answering by the operation (``claim``, ``extend``,
    ``done``, ``release``, ``get``), and the list of operations it saw."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        if request.method == "DELETE":
            op = "release"
        elif path.endswith(("/done", "/extend")):
            op = path.rsplit("/", 1)[1]
        else:
            op = "claim" if request.method == "POST" else "get"
        seen.append(op)
        answer = answers[op]()
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle), seen


def claimed() -> httpx.Response:
    return httpx.Response(
        201,
        json={"key": "k", "state": "processing", "token": TOKEN, "fence": 1, "expires_at_ms": 1},
    )


def test_the_default_ttl_is_sent_and_times_the_heartbeat() -> None:
    """No ttl given: 300 s, sent, and the heartbeat's period is a third of it
    by this process's clock, whatever the server's expiry says (here 1970: a
    skewed clock)."""
    bodies: list[Any] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append((request.url.raw_path.decode(), json.loads(request.content or b"null")))
        return claimed() if len(bodies) == 1 else record("done")

    c = client(httpx.MockTransport(handle))
    with c.claim("k") as claim:
        assert claim.ttl == 300
        time.sleep(0.05)  # beats timed by the server's expiry would come every millisecond
    c.close()
    assert bodies[0] == ("/v1/claims/k", {"ttl_ms": 300_000})
    assert [path for path, _ in bodies[1:]] == ["/v1/claims/k/done"]


@pytest.mark.parametrize(
    ("refusal", "sent_again"),
    [
        # The server names its maximum in the problem: taken from there,
        # whatever the detail's words.
        (problem(400, "invalid_ttl", field="ttl_ms", maximum=123_000), 123_000),
        # A server from before `maximum`: read from the detail.
        (
            problem(
                400,
                "invalid_ttl",
                field="ttl_ms",
                detail="ttl_ms: must be at most 456000 (the configured maximum)",
            ),
            456_000,
        ),
        # Neither: the server's default done TTL (none sent).
        (problem(400, "invalid_ttl", field="ttl_ms", maximum="lots"), None),
    ],
    ids=["maximum", "detail", "neither"],
)
def test_a_done_ttl_over_the_servers_maximum_is_sent_again_within_it(
    refusal: httpx.Response, sent_again: int | None
) -> None:
    bodies: list[Any] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content or b"null"))
        if len(bodies) == 1:
            return claimed()
        return refusal if len(bodies) == 2 else record("done")

    c = client(httpx.MockTransport(handle))

    @c.once(key=lambda: "k", ttl=30, done_ttl=1_000)
    def work() -> int:
        return 7

    assert work() == 7
    c.close()
    assert bodies[1]["ttl_ms"] == 1_000_000
    assert bodies[2].get("ttl_ms") == sent_again, bodies[2]
    assert bodies[2]["result"] == 7


@pytest.mark.parametrize(
    "refusal",
    [
        lambda: problem(401, "unauthorized"),
        lambda: problem(403, "read_only_token"),
        lambda: problem(400, "invalid_token", field="token"),
    ],
    ids=["401", "403", "400"],
)
def test_a_heartbeat_refused_for_good_loses_the_claim(
    refusal: Callable[[], httpx.Response],
) -> None:
    t, seen = routed(claim=claimed, extend=refusal, done=lambda: record("done"))
    with client(t) as c:

        @c.once(key=lambda: "k", ttl=0.3)
        def work() -> None:
            claim = dedupd.current_claim()
            wait_until(lambda: claim.lost, "the heartbeat to give up")

        with pytest.raises(dedupd.ClaimLost) as e:
            work()
    assert e.value.__cause__ is not None
    assert type(e.value.__cause__) is type(error_class(refusal().status_code, None)("x"))
    assert seen == ["claim", "extend"]


@pytest.mark.parametrize(
    "failure",
    [
        lambda: problem(503, "store_unavailable"),
        lambda: httpx.ConnectError("refused"),
        lambda: problem(429, "auth_throttled"),
    ],
    ids=["503", "no-answer", "429"],
)
def test_a_heartbeat_that_keeps_failing_loses_the_claim_once_its_ttl_passed(
    failure: Callable[[], httpx.Response | Exception],
) -> None:
    t, seen = routed(claim=claimed, extend=failure, done=lambda: record("done"))
    with client(t, retries=0) as c:

        @c.once(key=lambda: "k", ttl=0.5)
        def work() -> None:
            claim = dedupd.current_claim()
            wait_until(lambda: claim.lost, "the claim to expire by the client's clock")

        with pytest.raises(dedupd.ClaimLost) as e:
            work()
    assert isinstance(e.value.__cause__, (dedupd.Unavailable, dedupd.NetworkError))
    assert seen.count("extend") >= 2  # tried again
    assert "done" not in seen


def test_the_async_heartbeat_follows_the_same_rules() -> None:
    async def run(extend: Callable[[], httpx.Response | Exception]) -> BaseException | None:
        t, _ = routed(claim=claimed, extend=extend, done=lambda: record("done"))
        async with dedupd.AsyncClient(URL, token=TOKEN, transport=t, retries=0) as c:

            @c.once(key=lambda: "k", ttl=0.3)
            async def work() -> None:
                claim = dedupd.current_claim()
                while not claim.lost:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)

            try:
                await asyncio.wait_for(work(), 10)
            except dedupd.ClaimLost as e:
                return e.__cause__
        return None

    assert isinstance(asyncio.run(run(lambda: problem(401, "unauthorized"))), dedupd.Unauthorized)
    assert isinstance(asyncio.run(run(lambda: httpx.ConnectError("x"))), dedupd.NetworkError)


def test_a_done_that_fails_raises_done_failed_with_the_value() -> None:
    t, seen = scripted(CLAIMED, read_error(), read_error())
    c = client(t, retries=1)

    @c.once(key=lambda: "k")
    def work() -> dict[str, int]:
        return {"v": 1}

    with pytest.raises(dedupd.DoneFailed) as e:
        work()
    assert e.value.value == {"v": 1}
    assert e.value.claim.key == "k"
    assert isinstance(e.value.__cause__, dedupd.NetworkError)
    assert TOKEN not in str(e.value)
    assert seen == ["POST /v1/claims/k", "POST /v1/claims/k/done", "POST /v1/claims/k/done"]
    c.close()

    t, seen = scripted(CLAIMED, problem(500, "internal"))
    with client(t, retries=0) as c, pytest.raises(dedupd.DoneFailed) as e, c.claim("k") as claim:
        claim.result = [5]
    assert e.value.value == [5]
    assert isinstance(e.value.__cause__, dedupd.ServerError)


def test_the_async_done_that_fails_raises_done_failed_with_the_value() -> None:
    async def run() -> dedupd.DoneFailed:
        t, _ = scripted(claimed(), read_error())
        async with dedupd.AsyncClient(URL, token=TOKEN, transport=t, retries=0) as c:

            @c.once(key=lambda: "k")
            async def work() -> str:
                return "value"

            with pytest.raises(dedupd.DoneFailed) as e:
                await work()
            return e.value

    failed = asyncio.run(run())
    assert failed.value == "value"
    assert isinstance(failed.__cause__, dedupd.NetworkError)


def test_a_release_after_an_exception_is_sent_again_after_a_dropped_answer() -> None:
    t, seen = scripted(CLAIMED, read_error(), httpx.Response(204))
    with client(t) as c, pytest.raises(KeyError), c.claim("k"):
        raise KeyError("the work failed")
    assert seen == ["POST /v1/claims/k", "DELETE /v1/claims/k", "DELETE /v1/claims/k"]


class Trickler:
    """A peer (a misbehaving proxy, say) on a real socket that answers a
    claim at once and everything else a byte at a time, for ever:
    ``status`` the status line itself, ``body`` a body after its headers."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self.closed.is_set():
                    request = conn.recv(65536)
                    if not request:
                        return
                    line = request.split(b"\r\n", 1)[0]
                    if line.startswith(b"POST /v1/claims/k "):
                        body = json.dumps(
                            {
                                "key": "k",
                                "state": "processing",
                                "token": TOKEN,
                                "fence": 1,
                                "expires_at_ms": 1,
                            }
                        ).encode()
                        conn.sendall(
                            b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
                            + f"content-length: {len(body)}\r\n\r\n".encode()
                            + body
                        )
                        continue
                    if self.mode == "status":
                        answer = b"HTTP/1.1 200 OK\r\n" * 10_000
                    else:
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
                        answer = b" " * 1_000_000
                    for byte in answer:
                        if self.closed.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(0.05)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@pytest.fixture(params=["status", "body"])
def trickler(request: pytest.FixtureRequest) -> Iterator[Trickler]:
    t = Trickler(request.param)
    yield t
    t.close()


def finishes(fn: Callable[[], Any]) -> BaseException | None:
    """Runs ``fn`` on a thread; its exception. Fails if it is still running
    after a minute (it would never end)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # handed to the test
            caught.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the call never ended"
    return caught[0] if caught else None


def test_a_peer_answering_a_byte_at_a_time_is_cut_off_at_the_timeout(trickler: Trickler) -> None:
    # httpx's timeout bounds each read: every byte resets it. The client's
    # bounds the whole request.
    with dedupd.Client(trickler.url, token=TOKEN, timeout=0.5, retries=0) as c:
        e = finishes(lambda: c.get("x"))
    assert isinstance(e, dedupd.NetworkError), repr(e)
    assert isinstance(e.__cause__, httpx.TimeoutException), repr(e.__cause__)

    async def get() -> None:
        async with dedupd.AsyncClient(trickler.url, token=TOKEN, timeout=0.5, retries=0) as c:
            await c.get("x")

    e = finishes(lambda: asyncio.run(get()))
    assert isinstance(e, dedupd.NetworkError), repr(e)
    assert isinstance(e.__cause__, httpx.TimeoutException), repr(e.__cause__)


def test_a_heartbeat_answered_a_byte_at_a_time_loses_the_claim_once_its_ttl_passed(
    trickler: Trickler,
) -> None:
    # Each extend waits at most its share of the period, so the claim is
    # found lost by the client's clock and the block's done is never sent.
    with dedupd.Client(trickler.url, token=TOKEN, timeout=0.5, retries=0) as c:

        def work() -> None:
            with c.claim("k", ttl=0.6):
                claim = dedupd.current_claim()
                wait_until(lambda: claim.lost, "the claim to be found lost")

        e = finishes(work)
    assert isinstance(e, dedupd.ClaimLost), repr(e)

    async def awork() -> None:
        async with dedupd.AsyncClient(trickler.url, token=TOKEN, timeout=0.5, retries=0) as c:
            claim = await c.claim("k", ttl=0.6)
            async with claim:
                while not claim.lost:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)

    e = finishes(lambda: asyncio.run(asyncio.wait_for(awork(), 30)))
    assert isinstance(e, dedupd.ClaimLost), repr(e)
