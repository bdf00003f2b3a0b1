"""The asyncio client: every method, ``async with client.claim(...)``, and
the decorator's paths (success, exception, repeat, heartbeat, a lost claim,
32 tasks racing on one key), against a real dedupd on each backend."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import pytest

import dedupd

from conftest import AsyncRecorder, Server

pytestmark = pytest.mark.anyio


async def eventually(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def heartbeat_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if not t.done() and "_heartbeat" in repr(t.get_coro())]


async def test_every_method(server: Server, key: str) -> None:
    async with server.async_client() as client:
        claim = await client.claim(key, ttl=30, fingerprint="sha256:1")
        assert re.fullmatch(r"[0-9a-f]{32}", claim.token)
        with pytest.raises(dedupd.Busy) as busy:
            await client.claim(key)
        assert busy.value.expires_at_ms == claim.expires_at_ms
        with pytest.raises(dedupd.FingerprintMismatch):
            await client.claim(key, fingerprint="sha256:2")
        with pytest.raises(dedupd.NotOwner):
            await client.extend(key, "f" * 32)
        extended = await claim.extend(60)
        assert extended.expires_at_ms > busy.value.expires_at_ms
        record = await client.get(key)
        assert record is not None
        assert (record.state, record.fence) == ("processing", claim.fence)
        await client.done(key, claim.token, result={"ok": True})
        with pytest.raises(dedupd.AlreadyDone) as done:
            await client.claim(key)
        assert done.value.result == {"ok": True}
        with pytest.raises(dedupd.AlreadyDone):
            await client.release(key, claim.token)

        other = await client.claim(f"{key}/2")
        await other.release()
        assert await client.get(f"{key}/2") is None
        lapsing = await client.claim(f"{key}/3", ttl=0.05)
        # The server's clock expires it: poll until it reads as absent.
        while await client.get(f"{key}/3") is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        with pytest.raises(dedupd.Lost):
            await lapsing.extend()

        assert await client.head(key) is None
        applied = await client.apply(key, "B", "2026-11-29T10:05:00Z")
        assert applied.applied
        assert (await client.apply(key, "A", "2026-11-29T10:00:00Z")).outcome == "stale"
        assert await client.head(key) == applied.head
        with pytest.raises(dedupd.InvalidRequest) as bad:
            await client.apply(key, "C", "soon")
        assert bad.value.field == "created_at"


async def test_async_with_claim_marks_done_or_releases(server: Server, key: str) -> None:
    async with server.async_client() as client:
        async with client.claim(f"{key}/ok", ttl=30) as c:
            assert dedupd.current_claim() is c
            assert len(heartbeat_tasks()) == 1
            c.result = [1, 2, 3]
        record = await client.get(f"{key}/ok")
        assert record is not None
        assert (record.state, record.result) == ("done", [1, 2, 3])

        with pytest.raises(LookupError):
            async with client.claim(f"{key}/fails", ttl=30):
                raise LookupError
        assert await client.get(f"{key}/fails") is None

        # An awaited claim is a context manager too.
        async with await client.claim(f"{key}/awaited") as c:
            c.result = "x"
        with pytest.raises(dedupd.AlreadyDone) as e:
            await client.claim(f"{key}/awaited")
        assert e.value.result == "x"
    assert heartbeat_tasks() == []


async def test_the_decorator_success_exception_and_repeat(server: Server, key: str) -> None:
    runs: list[str] = []
    async with server.async_client() as client:

        @client.once(key=lambda event: event["id"], ttl=30)
        async def handle(event: dict[str, str]) -> dict[str, Any]:
            runs.append(event["id"])
            claim = dedupd.current_claim()
            if event.get("fail"):
                raise ValueError("downstream refused")
            return {"id": event["id"], "fence": claim.fence}

        first = await handle({"id": key})
        assert await handle({"id": key}) == first
        assert runs == [key]

        with pytest.raises(ValueError, match="downstream"):
            await handle({"id": f"{key}/f", "fail": "yes"})
        assert await client.get(f"{key}/f") is None
        assert (await handle({"id": f"{key}/f"}))["id"] == f"{key}/f"

        @client.once(key=lambda event: event["id"], raise_if_done=True)
        async def strict(event: dict[str, str]) -> None:
            runs.append("strict")

        with pytest.raises(dedupd.AlreadyDone) as e:
            await strict({"id": key})
        assert e.value.result == first
        assert "strict" not in runs

        with pytest.raises(TypeError, match=r"Client\.once"):
            client.once(key=str)(lambda x: x)
    assert heartbeat_tasks() == []


async def test_a_heartbeat_keeps_a_one_second_claim_through_three_seconds(
    server: Server, key: str
) -> None:
    rec = AsyncRecorder()
    async with server.async_client(transport=rec) as worker, server.async_client() as other:

        @worker.once(key=lambda: key, ttl=1)
        async def slow() -> str:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                with pytest.raises(dedupd.Busy):
                    await other.claim(key)
                await asyncio.sleep(0.25)
            return "finished"

        assert await slow() == "finished"
        record = await other.get(key)
    assert rec.count("POST", "/extend") >= 6
    assert record is not None
    assert (record.state, record.result) == ("done", "finished")
    assert heartbeat_tasks() == []


async def test_a_claim_lost_mid_work_raises_claim_lost_and_is_never_done(
    server: Server, key: str
) -> None:
    rec = AsyncRecorder()
    resume = asyncio.Event()
    taken = asyncio.Event()
    async with server.async_client(transport=rec) as worker, server.async_client() as other:

        @worker.once(key=lambda: key, ttl=1)
        async def work() -> str:
            rec.hold_extends = resume  # a paused worker: its extend is held unsent
            await asyncio.wait_for(taken.wait(), 10)
            claim = dedupd.current_claim()
            await eventually(lambda: claim.lost, "the heartbeat to find the claim lost")
            return "too late"

        task = asyncio.ensure_future(work())
        try:
            await eventually(lambda: rec.held > 0, "an extend to be held")
            thief = await other.claim(key, ttl=30, wait=5)
        finally:
            rec.hold_extends = None
            resume.set()
            taken.set()
        with pytest.raises(dedupd.ClaimLost) as lost:
            await task
        assert isinstance(lost.value.__cause__, dedupd.NotOwner)
        assert rec.count("POST", "/done") == 0
        record = await other.get(key)
    assert record is not None
    assert (record.state, record.fence) == ("processing", thief.fence)
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_extends_that_fail_for_the_whole_ttl_lose_the_claim(server: Server, key: str) -> None:
    rec = AsyncRecorder()
    async with server.async_client(transport=rec) as worker:

        @worker.once(key=lambda: key, ttl=1)
        async def work() -> str:
            rec.cut_extends = True  # a partition: no extend gets an answer
            claim = dedupd.current_claim()
            await eventually(lambda: claim.lost, "the claim to be lost by the client's clock")
            return "too late"

        with pytest.raises(dedupd.ClaimLost) as e:
            await work()
        assert isinstance(e.value.__cause__, dedupd.NetworkError)
        assert rec.count("POST", "/extend") >= 2
        assert rec.count("POST", "/done") == 0
    assert heartbeat_tasks() == []


async def test_32_tasks_on_one_key_run_it_once_and_get_the_same_result(
    server: Server, key: str
) -> None:
    runs: list[int] = []
    async with server.async_client() as client:

        @client.once(key=lambda i: key, ttl=30)
        async def work(i: int) -> dict[str, Any]:
            runs.append(i)
            await asyncio.sleep(0.2)  # long enough for every other caller to find the key busy
            return {"by": i, "total": 1234}

        results = await asyncio.gather(*(work(i) for i in range(32)))
    assert len(runs) == 1
    assert results == [{"by": runs[0], "total": 1234}] * 32
    assert heartbeat_tasks() == []


async def test_cancelling_the_call_releases_and_stops_the_heartbeat(
    server: Server, key: str
) -> None:
    started = asyncio.Event()
    async with server.async_client() as client:

        @client.once(key=lambda: key, ttl=30)
        async def forever() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.ensure_future(forever())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.get(key) is None
    assert heartbeat_tasks() == []


class HoldsReleases(AsyncRecorder):
    """Holds each release until ``go`` is set; ``releasing`` is set when one
    is held."""

    def __init__(self) -> None:
        super().__init__()
        self.releasing = asyncio.Event()
        self.go = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            self.releasing.set()
            await self.go.wait()
        return await super().handle_async_request(request)


@pytest.mark.one_backend
async def test_a_cancelled_call_releases_even_when_cancelled_again(
    server: Server, key: str
) -> None:
    rec = HoldsReleases()
    started = asyncio.Event()
    async with server.async_client(transport=rec) as client:

        @client.once(key=lambda: key, ttl=30)
        async def forever() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.ensure_future(forever())
        await started.wait()
        task.cancel()
        await rec.releasing.wait()
        task.cancel()  # again, while the release is out
        for _ in range(5):
            await asyncio.sleep(0)  # the second cancellation lands
        rec.go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.get(key) is None
    assert heartbeat_tasks() == []


async def test_a_call_that_claims_its_own_key_again_fails_at_once(server: Server, key: str) -> None:
    rec = AsyncRecorder()
    async with server.async_client(transport=rec) as client:

        @client.once(key=lambda order, retry=False: order, wait=5)
        async def ship(order: str, retry: bool = False) -> str:
            if not retry:
                return await ship(order, retry=True)
            return "shipped"

        with pytest.raises(RuntimeError, match="would wait for itself"):
            await ship(key)
        assert rec.count("POST", key.split("/")[-1]) == 1  # the outer claim only
        assert await client.get(key) is None  # released by the outer call

        async with client.claim(key) as outer:
            async with client.claim(f"{key}/inner") as inner:
                inner.result = "inner"

            async def elsewhere() -> None:
                await client.claim(key)

            with pytest.raises(dedupd.Busy):  # another task: held elsewhere
                await asyncio.ensure_future(elsewhere())
            await outer.release()
        assert await ship(key, retry=True) == "shipped"


class HoldsClaimAnswers(AsyncRecorder):
    """Holds the answer of each claim (its request reached the server, which
    granted it) until ``go`` is set; ``answered`` is set when one is held."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = asyncio.Event()
        self.go = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await super().handle_async_request(request)
        path = request.url.raw_path.decode()
        if request.method == "POST" and not path.endswith(("/done", "/extend")):
            self.answered.set()
            await self.go.wait()
        return resp


@pytest.mark.one_backend
@pytest.mark.parametrize("form", ["once", "async with"])
async def test_a_caller_cancelled_while_its_claim_is_answered_leaves_the_key_free(
    server: Server, key: str, form: str
) -> None:
    rec = HoldsClaimAnswers()
    runs: list[str] = []
    async with server.async_client(transport=rec) as client:

        @client.once(key=lambda: key, ttl=30, wait=0)
        async def work() -> str:
            runs.append("once")
            return "ok"

        async def block() -> None:
            async with client.claim(key, ttl=30):
                runs.append("block")

        task = asyncio.ensure_future(work() if form == "once" else block())
        await rec.answered.wait()  # granted by the server, the answer on its way
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)  # the cancellation lands
        rec.go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runs == []
        # Released, not left claimed by nobody for its 30 s: the next delivery runs it.
        assert await client.get(key) is None
        assert rec.count("DELETE") == 1
        assert await work() == "ok"
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_an_anyio_cancel_scope_still_releases(server: Server, key: str) -> None:
    """anyio cancels a scope's task again at every step until it leaves the
    scope: the release on the way out is not cut short."""
    import anyio

    async with server.async_client() as client:
        with anyio.move_on_after(0.2) as scope:
            async with client.claim(key, ttl=30):
                await asyncio.sleep(3600)
        assert scope.cancelled_caught
        assert await client.get(key) is None
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_a_release_or_done_in_the_block_is_final(server: Server, key: str) -> None:
    rec = AsyncRecorder()
    async with server.async_client(transport=rec) as client:
        async with client.claim(f"{key}/released", ttl=30) as c:
            await c.release()
        assert await client.get(f"{key}/released") is None

        async with client.claim(f"{key}/done", ttl=0.6) as c:
            await c.done("by hand")
            c.result = "not this"
            beats = rec.count("POST", "/extend")
            await asyncio.sleep(0.5)  # past the next beat's time: no beat comes to find it done
        assert not c.lost
        assert rec.count("POST", "/extend") == beats

        async def done_then_raise() -> None:
            async with client.claim(f"{key}/raised", ttl=30) as c:
                await c.done(2)
                raise KeyError("after the done")

        with pytest.raises(KeyError):
            await done_then_raise()
        assert rec.count("DELETE") == 1  # the first block's release only
        assert rec.count("POST", "/done") == 2
        for k, result in [(f"{key}/done", "by hand"), (f"{key}/raised", 2)]:
            record = await client.get(k)
            assert record is not None
            assert (record.state, record.result) == ("done", result)
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_an_extend_in_the_block_sets_the_heartbeats_ttl(server: Server, key: str) -> None:
    rec = AsyncRecorder()
    async with server.async_client(transport=rec) as client:
        async with client.claim(key, ttl=1) as c:
            await eventually(lambda: rec.count("POST", "/extend") >= 1, "a beat")
            await c.extend(3600)
            beats = rec.count("POST", "/extend")
            await asyncio.sleep(0.7)  # two of the old periods: no beat cuts it back to 1 s
            assert rec.count("POST", "/extend") == beats
            record = await client.get(key)
            assert record is not None
            assert record.expires_at_ms > time.time() * 1000 + 3000_000
            await c.extend(1.5)
            await eventually(lambda: rec.count("POST", "/extend") >= beats + 3, "beats every 0.5 s")
            record = await client.get(key)
            assert record is not None
            assert record.expires_at_ms <= time.time() * 1000 + 1600
        assert not c.lost
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_a_block_left_in_another_task_still_ends(server: Server, key: str) -> None:
    """Entered in one task (its context) and left in another, as an async
    generator finalized elsewhere is: the heartbeat stops and the done goes."""
    async with server.async_client() as client:
        c = await client.claim(key, ttl=30)
        await asyncio.ensure_future(c.__aenter__())
        c.result = "r"
        await c.__aexit__(None, None, None)
        record = await client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "r")
    assert heartbeat_tasks() == []


@pytest.mark.one_backend
async def test_work_that_would_run_later_is_refused(server: Server, key: str) -> None:
    async with server.async_client() as client:
        with pytest.raises(TypeError, match="generator function"):

            @client.once(key=str)
            async def generator(x: str) -> Any:
                yield x

        async def inner() -> int:
            return 1

        @client.once(key=lambda: key)
        async def deferred() -> Any:
            return inner()

        with pytest.raises(TypeError, match="runs later"):
            await deferred()
        assert await client.get(key) is None
    assert heartbeat_tasks() == []


def test_a_client_goes_on_under_a_new_event_loop(server: Server, key: str) -> None:
    # A module's client, a job's asyncio.run each: the first loop's
    # connections closed with it, and a claim made through them would be
    # left held by nobody.
    client = server.async_client()
    runs: list[str] = []

    @client.once(key=lambda k: k, ttl=60)
    async def handle(k: str) -> str:
        runs.append(k)
        return k

    assert asyncio.run(handle(f"{key}/a")) == f"{key}/a"
    assert asyncio.run(handle(f"{key}/b")) == f"{key}/b"
    assert asyncio.run(handle(f"{key}/b")) == f"{key}/b"
    assert runs == [f"{key}/a", f"{key}/b"]
    asyncio.run(client.aclose())


def test_two_event_loops_taking_turns_each_keep_their_connections(server: Server, key: str) -> None:
    client = server.async_client()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        used = []
        for loop in (first, second, first, second):
            assert loop.run_until_complete(client.get(key)) is None
            used.append(client._http)
        assert used[0] is used[2], "the first loop's pool, kept while it runs"
        assert used[1] is used[3]
        assert used[0] is not used[1]
        second.run_until_complete(client.aclose())
        first.run_until_complete(client.aclose())
    finally:
        first.close()
        second.close()
