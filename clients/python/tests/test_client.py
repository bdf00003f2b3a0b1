"""Every method of the blocking client and every error it maps, against a
real dedupd on each backend."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import datetime, timedelta, timezone

import httpx
import pytest

import dedupd

from conftest import BACKENDS, Recorder, Server, wait_until

OTHER_TOKEN = "0" * 32


def test_claim_get_done_and_the_state_table(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key, ttl=30)
    assert claim.key == key
    assert re.fullmatch(r"[0-9a-f]{32}", claim.token)
    assert claim.token not in repr(claim)
    record = client.get(key)
    assert record is not None
    assert (record.state, record.fence, record.expires_at_ms) == (
        "processing",
        claim.fence,
        claim.expires_at_ms,
    )

    with pytest.raises(dedupd.Busy) as busy:
        client.claim(key)
    assert busy.value.status == 409
    assert busy.value.state == "processing"
    assert busy.value.expires_at_ms == claim.expires_at_ms
    assert busy.value.expires_at == claim.expires_at
    assert busy.value.key == key

    done = client.done(key, claim.token, ttl=60, result={"charged": 42, "ids": ["a", "b"]})
    assert (done.key, done.state) == (key, "done")
    got = client.get(key)
    assert got is not None
    assert (got.state, got.result) == ("done", {"charged": 42, "ids": ["a", "b"]})

    with pytest.raises(dedupd.AlreadyDone) as again:
        client.claim(key)
    assert again.value.result == {"charged": 42, "ids": ["a", "b"]}
    assert again.value.expires_at_ms == done.expires_at_ms

    # A repeated done by the owner changes nothing, its first result included.
    repeat = client.done(key, claim.token, result="another")
    assert repeat.expires_at_ms == done.expires_at_ms
    got = client.get(key)
    assert got is not None
    assert got.result == {"charged": 42, "ids": ["a", "b"]}


def test_done_without_a_result_stores_none(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key)
    claim.done()
    with pytest.raises(dedupd.AlreadyDone) as e:
        client.claim(key)
    assert e.value.result is None
    record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", None)


def test_fences_grow_and_a_release_frees_the_key(client: dedupd.Client, key: str) -> None:
    first = client.claim(key)
    first.release()
    assert client.get(key) is None
    second = client.claim(key)
    assert second.fence > first.fence
    # Released by its owner already: nothing to do.
    client.release(key, second.token)
    client.release(key, second.token)
    assert client.get(key) is None


def test_only_the_owner_completes_releases_or_extends(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key, ttl=30)
    for call in (
        lambda: client.done(key, OTHER_TOKEN),
        lambda: client.release(key, OTHER_TOKEN),
        lambda: client.extend(key, OTHER_TOKEN),
    ):
        with pytest.raises(dedupd.NotOwner) as e:
            call()
        assert e.value.state == "processing"
        assert e.value.expires_at_ms == claim.expires_at_ms
    record = client.get(key)
    assert record is not None
    assert (record.state, record.fence) == ("processing", claim.fence)


def test_extend_moves_the_expiry(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key, ttl=5)
    first = claim.expires_at_ms
    record = claim.extend(60)
    assert record.state == "processing"
    assert record.expires_at_ms >= first + 50_000
    assert claim.expires_at_ms == record.expires_at_ms
    got = client.get(key)
    assert got is not None
    assert got.expires_at_ms == record.expires_at_ms


def test_a_lapsed_claim_is_lost_to_extend_but_done_records_it(
    client: dedupd.Client, key: str
) -> None:
    claim = client.claim(key, ttl=0.05)
    wait_until(lambda: client.get(key) is None, "the claim to expire")
    with pytest.raises(dedupd.Lost) as lost:
        claim.extend()
    assert (lost.value.status, lost.value.code) == (404, "lost")
    # Nobody took over: the finished work is recorded.
    claim.done(result=1)
    with pytest.raises(dedupd.AlreadyDone) as e:
        client.claim(key)
    assert e.value.result == 1


def test_a_done_key_refuses_release_and_extend(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key)
    claim.done()
    with pytest.raises(dedupd.AlreadyDone):
        claim.release()
    with pytest.raises(dedupd.AlreadyDone):
        claim.extend()


def test_a_claim_with_another_fingerprint_is_refused(client: dedupd.Client, key: str) -> None:
    claim = client.claim(key, fingerprint="sha256:aaaa")
    with pytest.raises(dedupd.Busy):
        client.claim(key, fingerprint="sha256:aaaa")
    with pytest.raises(dedupd.FingerprintMismatch) as e:
        client.claim(key, fingerprint="sha256:bbbb")
    assert (e.value.status, e.value.state) == (422, "processing")
    assert e.value.expires_at_ms == claim.expires_at_ms


@pytest.mark.parametrize("k", ["a/b", "100%", "with space", "ключ", "?#&=+", "%2F", ".", ".."])
def test_any_key_is_one_path_segment(client: dedupd.Client, k: str) -> None:
    claim = client.claim(k)
    assert claim.key == k
    record = client.get(k)
    assert record is not None
    assert (record.key, record.fence) == (k, claim.fence)
    claim.release()
    assert client.get(k) is None


def test_a_result_over_the_servers_limit_is_refused_and_changes_nothing(
    client: dedupd.Client, key: str
) -> None:
    claim = client.claim(key)
    with pytest.raises(dedupd.ResultTooLarge) as e:
        claim.done("x" * 70_000)
    assert (e.value.status, e.value.code) == (413, "result_too_large")
    record = client.get(key)
    assert record is not None
    assert record.state == "processing"
    claim.done("small")
    record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "small")


def test_bad_input_is_refused_with_the_field_named(client: dedupd.Client, key: str) -> None:
    with pytest.raises(dedupd.InvalidRequest) as e:
        client.claim(f"{key}\x01")
    assert (e.value.code, e.value.field) == ("invalid_key", "key")
    with pytest.raises(dedupd.InvalidRequest) as e:
        client.claim(key, ttl=365 * 86400)
    assert e.value.code == "invalid_ttl"
    with pytest.raises(dedupd.InvalidRequest) as e:
        client.done(key, "not-a-token")
    assert (e.value.code, e.value.field) == ("invalid_token", "token")
    with pytest.raises(dedupd.InvalidRequest) as e:
        client.apply(key, "e1", "yesterday")
    assert (e.value.code, e.value.field) == ("invalid_created_at", "created_at")
    with pytest.raises(dedupd.InvalidRequest) as e:
        client.claim(key, fingerprint="")
    assert e.value.code == "invalid_fingerprint"


def test_bad_arguments_fail_before_any_request(server: Server) -> None:
    rec = Recorder()
    with server.client(transport=rec) as c:
        for call, error in [
            (lambda: c.claim(""), ValueError),
            (lambda: c.claim(7), TypeError),  # type: ignore[arg-type]
            (lambda: c.claim("k" * 513), ValueError),
            (lambda: c.claim("k", ttl=0), ValueError),
            (lambda: c.claim("k", ttl=-1), ValueError),
            (lambda: c.claim("k", ttl=float("nan")), ValueError),
            (lambda: c.claim("k", ttl="5"), TypeError),  # type: ignore[arg-type]
            (lambda: c.claim("k", ttl=True), TypeError),
            (lambda: c.claim("k", wait=-1), ValueError),
            (lambda: c.claim("k", done_ttl=0), ValueError),
            (lambda: c.done("k", None), TypeError),  # type: ignore[arg-type]
            (lambda: c.done("k", "t", result=object()), TypeError),
            (lambda: c.done("k", "t", result=float("inf")), ValueError),
            (lambda: c.apply("s", "e", datetime(2026, 1, 1)), ValueError),
            (lambda: c.apply("s", "e", 1700000000), TypeError),  # type: ignore[arg-type]
            (lambda: c.head(""), ValueError),
        ]:
            with pytest.raises(error):
                call()
    assert rec.calls == []
    with pytest.raises(ValueError, match="http"):
        dedupd.Client("localhost:8080")
    # No host, or a port no server listens on: every call would fail as if
    # the server were down, and be retried as transient.
    for url in ("http://:8080", "http://127.0.0.1:99999", "http://127.0.0.1:0", "http://h:x"):
        for make in (dedupd.Client, dedupd.AsyncClient):
            with pytest.raises(ValueError, match="a port from 1 to 65535"):
                make(url)
    with pytest.raises(ValueError, match="with a host") as raised:
        dedupd.Client("http://user:s3cret@:8080")
    assert "s3cret" not in str(raised.value)
    # URLs that would not be used as checked: each call would fail, or go elsewhere.
    for url in (" " + server.url, server.url + " ", server.url + "\n", server.url + "/\t"):
        for make in (dedupd.Client, dedupd.AsyncClient):
            with pytest.raises(ValueError, match="spaces, line breaks"):
                make(url)
    for url in (server.url + "/?x=1", server.url + "/dedupd?api-key=abc", server.url + "#v1"):
        for make in (dedupd.Client, dedupd.AsyncClient):
            with pytest.raises(ValueError, match="without a query"):
                make(url)
    with pytest.raises(ValueError, match="token"):
        dedupd.Client(server.url, token="")
    with pytest.raises(ValueError, match="timeout"):
        dedupd.Client(server.url, timeout=0)
    with pytest.raises(TypeError, match="retries"):
        dedupd.Client(server.url, retries=1.5)  # type: ignore[arg-type]


def test_apply_and_head_keep_streams_in_order(client: dedupd.Client, key: str) -> None:
    assert client.head(key) is None
    b = client.apply(key, f"{key}:B", "2026-11-29T10:05:00Z")
    assert (b.stream, b.outcome, b.applied) == (key, "applied", True)
    assert b.head == dedupd.Head(f"{key}:B", "2026-11-29T10:05:00Z")
    # An aware datetime is RFC 3339 with its offset: 10:00 UTC, older than B.
    a = client.apply(
        key, f"{key}:A", datetime(2026, 11, 29, 11, tzinfo=timezone(timedelta(hours=1)))
    )
    assert (a.outcome, a.applied, a.head) == ("stale", False, b.head)
    assert client.apply(key, f"{key}:B", "2026-11-29T10:05:00Z").outcome == "duplicate"
    assert client.head(key) == b.head
    # An offset with seconds (a historical zone's), which RFC 3339 has not:
    # sent as the same instant in UTC, 10:10:00, newer than B.
    odd = timezone(timedelta(minutes=9, seconds=21))
    c = client.apply(key, f"{key}:C", datetime(2026, 11, 29, 10, 19, 21, tzinfo=odd))
    assert (c.outcome, c.applied) == ("applied", True)
    assert c.head.created_at in ("2026-11-29T10:10:00+00:00", "2026-11-29T10:10:00Z")


def test_a_token_is_needed(server: Server, key: str) -> None:
    with dedupd.Client(server.url) as anonymous, pytest.raises(dedupd.Unauthorized) as e:
        anonymous.get(key)
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    with dedupd.Client(server.url, token="wrong") as wrong, pytest.raises(dedupd.Unauthorized):
        wrong.claim(key)


def test_a_read_only_token_reads_but_does_not_write(
    server: Server, client: dedupd.Client, key: str
) -> None:
    claim = client.claim(key)
    with dedupd.Client(server.url, token=server.read_token) as reader:
        record = reader.get(key)
        assert record is not None
        assert record.fence == claim.fence
        with pytest.raises(dedupd.Forbidden) as e:
            reader.release(key, claim.token)
        assert (e.value.status, e.value.code) == (403, "read_only_token")
    assert client.get(key) == record


@pytest.mark.parametrize("base", ["/api", "/v2"])
def test_a_wrong_base_path_raises_instead_of_reading_as_absent(
    server: Server, client: dedupd.Client, key: str, base: str
) -> None:
    """dedupd answers a path it has no route for with its own 404 not_found:
    a client pointed at a wrong base path must not read a done key as absent."""
    client.claim(key).done({"charged": 1})
    client.apply(key, "evt-1", "2026-01-01T00:00:00Z")
    with dedupd.Client(server.url + base, token=server.token) as wrong:
        with pytest.raises(dedupd.ServerError, match="not dedupd's API") as e:
            wrong.get(key)
        assert e.value.status == 404
        assert f"{base}/v1/claims/" in str(e.value)
        with pytest.raises(dedupd.ServerError, match="not dedupd's API"):
            wrong.head(key)

    async def read_async() -> None:
        async with dedupd.AsyncClient(server.url + base, token=server.token) as wrong:
            with pytest.raises(dedupd.ServerError, match="not dedupd's API"):
                await wrong.get(key)
            with pytest.raises(dedupd.ServerError, match="not dedupd's API"):
                await wrong.head(key)

    asyncio.run(read_async())
    # The right base still reads an absent key as None.
    assert client.get(f"{key}/absent") is None
    assert client.head(f"{key}/absent") is None


def test_no_server_is_a_network_error(key: str) -> None:
    from conftest import free_port

    with dedupd.Client(f"http://127.0.0.1:{free_port()}", retries=1) as c:
        with pytest.raises(dedupd.NetworkError) as e:
            c.get(key)
        assert isinstance(e.value.__cause__, httpx.ConnectError)


@pytest.mark.skipif("redis" not in BACKENDS, reason="DEDUPD_TEST_BACKENDS leaves Redis out")
@pytest.mark.parametrize("own_server", ["redis"], indirect=True)
def test_a_store_outage_is_unavailable_and_a_claim_retries_through_it(
    own_server: Server, key: str
) -> None:
    """503 store_unavailable with Retry-After: raised as Unavailable when
    retries are off; with retries on, the write goes through once the store is
    back."""
    assert own_server.redis is not None
    own_server.redis.stop()
    with own_server.client(retries=0) as c, pytest.raises(dedupd.Unavailable) as e:
        c.claim(key)
    assert (e.value.status, e.value.code, e.value.retry_after) == (503, "store_unavailable", 1.0)

    rec = Recorder()
    outcome: list[object] = []
    with own_server.client(transport=rec) as c:
        t = threading.Thread(target=lambda: outcome.append(c.claim(key)))
        t.start()
        wait_until(lambda: rec.count("POST") >= 1, "the first claim's 503")
        own_server.redis.start()
        t.join()
    assert rec.calls[0][2] == 503
    assert rec.calls[-1][2] == 201
    assert isinstance(outcome[0], dedupd.Claim)
