"""Which requests are sent again, and which exception each problem code
raises. Retries need failures a healthy server does not give on demand, so
these tests answer from an httpx.MockTransport (test_client.py has the
real 503 of a store outage)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import dedupd
from dedupd._errors import error_class

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
