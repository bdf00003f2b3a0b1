"""The asyncio client: every method, ``async with client.claim(...)``, and
the decorator's paths (success, exception, repeat, heartbeat, a lost claim,
32 tasks racing on one key), against a real dedupd on each backend."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

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
    taken = asyncio.Event()
    async with server.async_client(transport=rec) as worker, server.async_client() as other:

        @worker.once(key=lambda: key, ttl=1)
        async def work() -> str:
            rec.cut_extends = True
            await asyncio.wait_for(taken.wait(), 10)
            rec.cut_extends = False
            claim = dedupd.current_claim()
            await eventually(lambda: claim.lost, "the heartbeat to find the claim lost")
            return "too late"

        task = asyncio.ensure_future(work())
        try:
            await eventually(lambda: rec.count("POST", "/extend") > 0, "the first cut extend")
            thief = await other.claim(key, ttl=30, wait=5)
        finally:
            taken.set()
        with pytest.raises(dedupd.ClaimLost) as lost:
            await task
        assert isinstance(lost.value.__cause__, dedupd.NotOwner)
        assert rec.count("POST", "/done") == 0
        record = await other.get(key)
    assert record is not None
    assert (record.state, record.fence) == ("processing", thief.fence)
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
