"""The decorator and the context manager of the blocking client, against a
real dedupd on each backend: success, exception and repeat; heartbeats that
keep a claim alive, a claim lost mid-work, 32 threads racing on one key, and
a server restart in the middle of a heartbeat."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

import dedupd

from conftest import Recorder, Server, wait_until


def heartbeats() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dedupd-heartbeat")]


@pytest.fixture(autouse=True)
def _no_heartbeat_thread_outlives_its_client() -> Any:
    yield
    assert heartbeats() == []


def test_success_marks_done_with_the_result(client: dedupd.Client, key: str) -> None:
    seen: list[dedupd.BaseClaim] = []

    @client.once(key=lambda event: event["id"], ttl=30, done_ttl=600)
    def handle(event: dict[str, str]) -> dict[str, Any]:
        seen.append(dedupd.current_claim())
        return {"handled": event["id"], "n": 1}

    assert handle({"id": key}) == {"handled": key, "n": 1}
    record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", {"handled": key, "n": 1})
    # done_ttl: not the claim's 30 s, nor the server's default day.
    assert 500_000 < record.expires_at_ms - time.time() * 1000 <= 600_000
    # Inside the call: the claim's key, token and fence.
    (claim,) = seen
    assert (claim.key, claim.fence) == (key, record.fence)
    assert len(claim.token) == 32
    with pytest.raises(RuntimeError, match="outside a claim"):
        dedupd.current_claim()


def test_a_repeat_gets_the_first_result_without_running(client: dedupd.Client, key: str) -> None:
    runs: list[int] = []

    @client.once(key=lambda n: key)
    def work(n: int) -> list[int]:
        runs.append(n)
        return [n, n * 2]

    assert work(1) == [1, 2]
    assert work(2) == [1, 2]
    assert runs == [1]

    @client.once(key=lambda n: key, raise_if_done=True)
    def strict(n: int) -> list[int]:
        runs.append(n)
        return [n]

    with pytest.raises(dedupd.AlreadyDone) as e:
        strict(3)
    assert e.value.result == [1, 2]
    assert runs == [1]


def test_an_exception_releases_and_a_retry_runs_again(client: dedupd.Client, key: str) -> None:
    attempts: list[int] = []

    @client.once(key=lambda: key)
    def flaky() -> str:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise ConnectionResetError("downstream failed")
        return "ok"

    with pytest.raises(ConnectionResetError):
        flaky()
    assert client.get(key) is None
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert attempts == [0, 1]


def test_a_result_that_cannot_be_stored_is_done_without_one(
    server: Server, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with server.client(max_result_bytes=100) as client:

        @client.once(key=lambda k: k)
        def work(k: str) -> Any:
            return {"set": {1, 2}} if k.endswith("set") else "x" * 200

        with caplog.at_level(logging.WARNING, logger="dedupd"):
            assert work(f"{key}/set") == {"set": {1, 2}}
            assert work(f"{key}/big") == "x" * 200
        assert "not JSON" in caplog.text
        assert "over 100" in caplog.text
        # Done, without a result: repeats get None.
        assert work(f"{key}/set") is None
        assert work(f"{key}/big") is None


def test_a_result_the_server_refuses_is_done_without_one(server: Server, key: str) -> None:
    with server.client(max_result_bytes=10**6) as client:

        @client.once(key=lambda: key)
        def work() -> str:
            return "x" * 70_000

        assert work() == "x" * 70_000
        record = client.get(key)
        assert record is not None
        assert (record.state, record.result) == ("done", None)


def test_a_key_busy_elsewhere_raises_busy_with_its_expiry(client: dedupd.Client, key: str) -> None:
    holder = client.claim(key, ttl=30)
    ran: list[bool] = []

    @client.once(key=lambda: key, wait=0)
    def work() -> None:
        ran.append(True)

    with pytest.raises(dedupd.Busy) as e:
        work()
    assert e.value.expires_at == holder.expires_at
    assert ran == []


def test_a_waiting_caller_runs_once_the_holder_releases(
    server: Server, client: dedupd.Client, key: str
) -> None:
    holder = client.claim(key, ttl=30)
    rec = Recorder()
    with server.client(transport=rec) as waiter:

        @waiter.once(key=lambda: key, wait=10)
        def work() -> str:
            return "ran here"

        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(work()))
        t.start()
        try:
            wait_until(lambda: any(s == 409 for _, _, s in rec.calls), "the waiter to find it busy")
        finally:
            holder.release()
            t.join()
    assert result == ["ran here"]


def test_same_key_another_payload_is_a_fingerprint_mismatch(
    client: dedupd.Client, key: str
) -> None:
    @client.once(key=lambda e: key, fingerprint=lambda e: f"body:{e}")
    def work(e: str) -> str:
        return e

    assert work("a") == "a"
    assert work("a") == "a"
    with pytest.raises(dedupd.FingerprintMismatch):
        work("b")


def test_bad_decorator_arguments_are_refused(client: dedupd.Client) -> None:
    with pytest.raises(TypeError, match="key must be a function"):
        client.once(key="static")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        client.once(key=str, ttl=0)
    with pytest.raises(TypeError, match=r"AsyncClient\.once"):

        @client.once(key=str)
        async def coroutine(x: str) -> None: ...

    @client.once(key=lambda x: x)
    def f(x: object) -> None: ...

    with pytest.raises(TypeError, match="key function"):
        f(5)


def test_the_context_manager_marks_done_or_releases(client: dedupd.Client, key: str) -> None:
    with client.claim(f"{key}/ok", ttl=30, done_ttl=600) as c:
        assert dedupd.current_claim() is c
        c.result = {"rows": 3}
    with pytest.raises(dedupd.AlreadyDone) as e:
        client.claim(f"{key}/ok")
    assert e.value.result == {"rows": 3}

    with pytest.raises(KeyError), client.claim(f"{key}/fails", ttl=30):
        raise KeyError("boom")
    assert client.get(f"{key}/fails") is None


def test_a_heartbeat_keeps_a_one_second_claim_through_three_seconds(
    server: Server, client: dedupd.Client, key: str
) -> None:
    rec = Recorder()
    with server.client(transport=rec) as worker, server.client() as other:

        @worker.once(key=lambda: key, ttl=1)
        def slow() -> str:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                # Past the first second too, the key is held: busy to anyone else.
                with pytest.raises(dedupd.Busy):
                    other.claim(key)
                time.sleep(0.25)
            return "finished"

        assert slow() == "finished"
        beats = rec.count("POST", "/extend")
        time.sleep(0.7)  # two heartbeat intervals: none comes after the call
        assert rec.count("POST", "/extend") == beats
    assert beats >= 6
    assert all(s == 200 for m, p, s in rec.calls if p.endswith("/extend"))
    record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "finished")


def test_one_heartbeat_thread_keeps_many_claims(server: Server, key: str) -> None:
    """Eight blocks hold one-second claims at once for two seconds: the
    client's one heartbeat thread extends them all."""
    keys = [f"{key}/{i}" for i in range(8)]
    with server.client() as worker, server.client() as other:

        def hold(k: str) -> None:
            with worker.claim(k, ttl=1) as c:
                time.sleep(2)
                c.result = k

        threads = [threading.Thread(target=hold, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(heartbeats()) == 1
        for k in keys:
            with pytest.raises(dedupd.AlreadyDone) as e:
                other.claim(k)
            assert e.value.result == k


def test_a_claim_lost_mid_work_raises_claim_lost_and_is_never_done(
    server: Server, key: str
) -> None:
    """The worker's extends cannot reach the server (a partition): its 1 s
    claim expires, another worker takes the key, and when the partition heals
    the heartbeat hears not_owner. The call ends in ClaimLost, no done sent."""
    rec = Recorder()
    taken = threading.Event()
    with server.client(transport=rec) as worker, server.client() as other:

        @worker.once(key=lambda: key, ttl=1)
        def work() -> str:
            rec.cut_extends = True
            taken.wait(10)
            rec.cut_extends = False
            claim = dedupd.current_claim()
            wait_until(lambda: claim.lost, "the heartbeat to find the claim lost")
            return "too late"

        outcome: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as e:
                outcome.append(e)

        t = threading.Thread(target=run)
        t.start()
        try:
            wait_until(lambda: rec.count("POST", "/extend") > 0, "the first cut extend")
            thief = other.claim(key, ttl=30, wait=5)
        finally:
            taken.set()
            t.join()
        assert len(outcome) == 1
        assert isinstance(outcome[0], dedupd.ClaimLost)
        assert isinstance(outcome[0].__cause__, dedupd.NotOwner)
        assert rec.count("POST", "/done") == 0
        record = other.get(key)
        assert record is not None
        assert (record.state, record.fence) == ("processing", thief.fence)


def test_a_heartbeat_that_cannot_go_on_ends_in_claim_lost(server: Server, key: str) -> None:
    worker = server.client()

    @worker.once(key=lambda: key, ttl=0.3)
    def work() -> None:
        worker.close()  # every extend now fails in the client, not on the network
        claim = dedupd.current_claim()
        wait_until(lambda: claim.lost, "the heartbeat to stop")

    with pytest.raises(dedupd.ClaimLost) as e:
        work()
    assert isinstance(e.value.__cause__, RuntimeError)


def test_32_threads_on_one_key_run_it_once_and_get_the_same_result(
    client: dedupd.Client, key: str
) -> None:
    runs: list[str] = []
    gate = threading.Barrier(32)

    @client.once(key=lambda: key, ttl=30)
    def work() -> dict[str, Any]:
        runs.append(threading.current_thread().name)
        time.sleep(0.2)  # long enough for every other caller to find the key busy
        return {"by": threading.current_thread().name, "total": 1234}

    results: list[object] = []

    def call() -> None:
        gate.wait()
        try:
            results.append(work())
        except Exception as e:  # shown in the assertion below
            results.append(e)

    threads = [threading.Thread(target=call, name=f"racer-{i}") for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1
    assert results == [{"by": runs[0], "total": 1234}] * 32


def test_a_server_restart_in_the_middle_of_a_heartbeat(own_server: Server, key: str) -> None:
    restarted = threading.Event()
    with own_server.client() as client:

        @client.once(key=lambda: key, ttl=3)
        def work() -> str:
            claim = dedupd.current_claim()
            restarted.wait(30)
            # A heartbeat after the restart extends the claim further.
            before = claim.expires_at_ms
            wait_until(lambda: claim.expires_at_ms > before, "an extend after the restart")
            return "survived"

        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(work()))
        t.start()
        try:
            wait_until(lambda: client.get(key) is not None, "the claim")
            own_server.restart()
        finally:
            restarted.set()
            t.join()
        assert result == ["survived"]
        record = client.get(key)
        assert record is not None
        assert (record.state, record.result) == ("done", "survived")
