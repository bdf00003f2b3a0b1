"""The decorator and the context manager of the blocking client, against a
real dedupd on each backend: success, exception and repeat; heartbeats that
keep a claim alive, a claim lost mid-work, 32 threads racing on one key, and
a server restart in the middle of a heartbeat."""

from __future__ import annotations

import contextvars
import gc
import logging
import os
import pickle
import threading
import time
import weakref
from typing import Any

import httpx
import pytest

import dedupd
from dedupd import _sync

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


def test_a_done_ttl_over_the_servers_maximum_still_marks_done(
    client: dedupd.Client, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The server refuses a done's TTL over its claims.max_ttl (30 days by
    # default) only once the work has run: failing then would leave the key
    # claimed, and the next delivery would run the work again.
    runs: list[int] = []

    @client.once(key=lambda: key, ttl=30, done_ttl=40 * 86400)
    def charge() -> dict[str, int]:
        runs.append(1)
        return {"charged": 10}

    with caplog.at_level(logging.WARNING, logger="dedupd"):
        assert charge() == {"charged": 10}
    assert "done_ttl" in caplog.text
    assert "invalid_ttl" in caplog.text
    record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", {"charged": 10})
    # The server's longest (claims.max_ttl, 30 days by default), not the 40
    # days asked for.
    left = record.expires_at_ms - time.time() * 1000
    assert 29 * 86_400_000 < left <= 30 * 86_400_000, left
    assert charge() == {"charged": 10}
    assert runs == [1]


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
    seen: list[int] = []
    with server.client() as worker, server.client() as other:

        def hold(k: str) -> None:
            with worker.claim(k, ttl=1) as c:
                time.sleep(2)
                seen.append(len(heartbeats()))
                c.result = k

        threads = [threading.Thread(target=hold, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [1] * 8
        for k in keys:
            with pytest.raises(dedupd.AlreadyDone) as e:
                other.claim(k)
            assert e.value.result == k


def test_a_claim_lost_mid_work_raises_claim_lost_and_is_never_done(
    server: Server, key: str
) -> None:
    """The worker's heartbeat stalls (a paused process: its extend is held
    unsent): its 1 s claim expires, another worker takes the key, and when the
    held extend goes out it is answered not_owner. The call ends in
    ClaimLost, no done sent."""
    rec = Recorder()
    resume = threading.Event()
    taken = threading.Event()
    with server.client(transport=rec) as worker, server.client() as other:

        @worker.once(key=lambda: key, ttl=1)
        def work() -> str:
            rec.hold_extends = resume
            taken.wait(10)
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
            wait_until(lambda: rec.held > 0, "an extend to be held")
            thief = other.claim(key, ttl=30, wait=5)
        finally:
            rec.hold_extends = None
            resume.set()
            taken.set()
            t.join()
        assert len(outcome) == 1
        assert isinstance(outcome[0], dedupd.ClaimLost)
        assert isinstance(outcome[0].__cause__, dedupd.NotOwner)
        assert rec.count("POST", "/done") == 0
        record = other.get(key)
        assert record is not None
        assert (record.state, record.fence) == ("processing", thief.fence)


@pytest.mark.one_backend
def test_extends_that_fail_for_the_whole_ttl_lose_the_claim(server: Server, key: str) -> None:
    """A partition: every extend fails (no answer). They are tried again
    sooner than every period, and once the claim's TTL has passed since the
    last one that went through (by this client's clock), it is lost: the call
    ends in ClaimLost, no done sent."""
    rec = Recorder()
    with server.client(transport=rec) as worker:

        @worker.once(key=lambda: key, ttl=1)
        def work() -> str:
            rec.cut_extends = True
            claim = dedupd.current_claim()
            wait_until(lambda: claim.lost, "the claim to be lost by the client's clock")
            return "too late"

        with pytest.raises(dedupd.ClaimLost) as e:
            work()
        assert isinstance(e.value.__cause__, dedupd.NetworkError)
        assert rec.count("POST", "/extend") >= 2
        assert rec.count("POST", "/done") == 0


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


class DropsDoneAnswers(Recorder):
    """Sends each done to the server, then drops the answer of the first
    ``drops`` of them (the server hung up before answering)."""

    def __init__(self, drops: int) -> None:
        super().__init__()
        self.drops = drops

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle_request(request)
        if request.url.raw_path.endswith(b"/done") and self.drops > 0:
            self.drops -= 1
            resp.read()
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response.", request=request
            )
        return resp


@pytest.mark.one_backend
def test_a_done_whose_answer_is_dropped_is_sent_again(server: Server, key: str) -> None:
    rec = DropsDoneAnswers(drops=2)
    with server.client(transport=rec) as worker:

        @worker.once(key=lambda: key)
        def work() -> dict[str, int]:
            return {"v": 1}

        assert work() == {"v": 1}
        # The first done went through; the second and third find it done (200).
        assert [s for m, p, s in rec.calls if p.endswith("/done")] == [200, 200, 200]
        record = worker.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", {"v": 1})


class FailsDonesWhileBeating(Recorder):
    """Each done fails without reaching the server until the heartbeat has
    extended the claim twice since the first one."""

    def __init__(self) -> None:
        super().__init__()
        self.dones = 0
        self.beats_during_done = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path
        if path.endswith(b"/extend") and self.dones > 0:
            self.beats_during_done += 1
        if path.endswith(b"/done"):
            self.dones += 1
            if self.beats_during_done < 2:
                raise httpx.ReadError("connection reset (the test)", request=request)
        return super().handle_request(request)


@pytest.mark.one_backend
def test_the_heartbeat_goes_on_while_done_is_retried(server: Server, key: str) -> None:
    rec = FailsDonesWhileBeating()
    with server.client(transport=rec, retries=10) as worker:
        with worker.claim(key, ttl=2) as c:
            c.result = "kept"
        assert rec.beats_during_done >= 2
        assert not c.lost
        record = worker.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "kept")


@pytest.mark.one_backend
def test_a_done_that_keeps_failing_raises_done_failed_with_the_value(
    server: Server, key: str
) -> None:
    rec = Recorder()
    with server.client(transport=rec, retries=1) as worker:

        @worker.once(key=lambda: key)
        def work() -> dict[str, str]:
            rec.cut_dones = True
            return {"charged": "ch_1"}

        original = rec.handle_request

        def handle(request: httpx.Request) -> httpx.Response:
            if getattr(rec, "cut_dones", False) and request.url.raw_path.endswith(b"/done"):
                raise httpx.ReadError("connection reset (the test)", request=request)
            return original(request)

        rec.handle_request = handle  # type: ignore[method-assign]
        with pytest.raises(dedupd.DoneFailed) as e:
            work()
        assert e.value.value == {"charged": "ch_1"}
        assert isinstance(e.value.__cause__, dedupd.NetworkError)
        assert isinstance(e.value, dedupd.DedupdError)
        # Not released: the work ran. The claim holds until its TTL lapses, and
        # the done can be sent again.
        record = worker.get(key)
        assert record is not None
        assert record.state == "processing"
        # Raised in a pool's worker process, it reaches the parent whole:
        # its value and fields, but not the claim (it holds its client).
        again = pickle.loads(pickle.dumps(e.value))
        assert type(again) is dedupd.DoneFailed
        assert (again.value, again.key, again.claim) == ({"charged": "ch_1"}, key, None)
        # A value that does not pickle: the error still crosses, without it.
        odd = dedupd.DoneFailed("done failed", value=threading.Lock(), claim=None, key=key)
        crossed = pickle.loads(pickle.dumps(odd))
        assert (type(crossed), crossed.value, crossed.key) == (dedupd.DoneFailed, None, key)
        assert "does not pickle" in str(crossed)
        assert str(again) == str(e.value)
        assert str(e.value).count(repr(key)) == 1, str(e.value)
        rec.cut_dones = False
        e.value.claim.done(e.value.value)
        record = worker.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", {"charged": "ch_1"})


def test_a_release_in_the_block_is_final(server: Server, key: str) -> None:
    rec = Recorder()
    with server.client(transport=rec) as worker:
        with worker.claim(key, ttl=30) as c:
            c.release()
        assert worker.get(key) is None
        assert rec.count("POST", "/done") == 0
        assert not c.lost


@pytest.mark.one_backend
def test_a_done_in_the_block_is_final(server: Server, key: str) -> None:
    rec = Recorder()
    with server.client(transport=rec) as worker:
        with worker.claim(key, ttl=0.6) as c:
            c.done("by hand")
            c.result = "not this"
            beats = rec.count("POST", "/extend")
            time.sleep(0.5)  # past the next beat's time: no beat comes to find it done
        assert not c.lost
        assert rec.count("POST", "/extend") == beats
        record = worker.get(key)
        assert record is not None
        assert (record.state, record.result) == ("done", "by hand")

        # An exception after the done goes on, and nothing releases the done key.
        def done_then_raise() -> None:
            with worker.claim(f"{key}/2", ttl=30) as c:
                c.done(2)
                raise KeyError("after the done")

        with pytest.raises(KeyError):
            done_then_raise()
        assert rec.count("DELETE") == 0
        record = worker.get(f"{key}/2")
    assert record is not None
    assert (record.state, record.result) == ("done", 2)


@pytest.mark.one_backend
def test_an_extend_in_the_block_sets_the_heartbeats_ttl(server: Server, key: str) -> None:
    rec = Recorder()
    with server.client(transport=rec) as worker, worker.claim(key, ttl=1) as c:
        wait_until(lambda: rec.count("POST", "/extend") >= 1, "a beat")
        c.extend(3600)
        beats = rec.count("POST", "/extend")
        time.sleep(0.7)  # two of the old periods: no beat comes to cut it back to 1 s
        assert rec.count("POST", "/extend") == beats
        record = worker.get(key)
        assert record is not None
        assert record.expires_at_ms > time.time() * 1000 + 3000_000
        # A shorter TTL: the heartbeat follows it at once.
        c.extend(1.5)
        wait_until(lambda: rec.count("POST", "/extend") >= beats + 3, "beats every 0.5 s")
        record = worker.get(key)
        assert record is not None
        assert record.expires_at_ms <= time.time() * 1000 + 1600
        c.result = "done"
    assert not c.lost


def test_work_that_would_run_later_is_refused(client: dedupd.Client, key: str) -> None:
    with pytest.raises(TypeError, match="generator function"):

        @client.once(key=str)
        def generator(x: str) -> Any:
            yield x

    async def coroutine() -> int:
        return 1

    deferred = client.once(key=lambda: key)(lambda: coroutine())
    with pytest.raises(TypeError, match="runs later"):
        deferred()
    lazy = client.once(key=lambda: f"{key}/lazy")(lambda: (n for n in range(3)))
    with pytest.raises(TypeError, match="runs later"):
        lazy()
    # Released, not done: the work never ran.
    assert client.get(key) is None
    assert client.get(f"{key}/lazy") is None


@pytest.mark.one_backend
def test_a_block_left_in_another_context_still_ends(server: Server, key: str) -> None:
    rec = Recorder()
    with server.client(transport=rec) as worker:
        c = worker.claim(key, ttl=1)
        contextvars.copy_context().run(c.__enter__)
        wait_until(lambda: rec.count("POST", "/extend") >= 1, "a beat")
        c.result = "r"
        c.__exit__(None, None, None)
        record = worker.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "r")


class StallsExtends(Recorder):
    """The extends of one key get no answer: each waits out its read timeout."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.timeouts: list[float] = []
        self.unblock = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path  # decoded
        if path.endswith("/extend") and self.key in path:
            timeout = request.extensions["timeout"]["read"]
            self.timeouts.append(timeout)
            self.unblock.wait(timeout)
            raise httpx.ReadTimeout("no answer (the test)", request=request)
        return super().handle_request(request)


@pytest.mark.one_backend
def test_an_extend_without_an_answer_does_not_starve_the_other_claims(
    server: Server, key: str
) -> None:
    """One heartbeat thread beats for both claims. A's extends get no answer:
    each waits at most half A's period (not the client's 10 s timeout), is
    not retried inside the call, and B's beats go on between them. A is lost
    once its TTL has passed; B is held throughout."""
    stalled, kept = f"{key}/stalled", f"{key}/kept"
    rec = StallsExtends(stalled)
    with server.client(transport=rec) as worker, server.client() as other:
        outcome: list[BaseException] = []

        def hold_stalled() -> None:
            try:
                with worker.claim(stalled, ttl=3) as a:
                    wait_until(lambda: a.lost, "the stalled claim to be lost", timeout=20)
            except BaseException as e:
                outcome.append(e)

        t = threading.Thread(target=hold_stalled)
        try:
            with worker.claim(kept, ttl=2) as b:
                t.start()
                t.join()
                assert not b.lost
                with pytest.raises(dedupd.Busy):
                    other.claim(kept)
                b.result = "kept"
        finally:
            rec.unblock.set()
            t.join()
        assert len(outcome) == 1
        assert isinstance(outcome[0], dedupd.ClaimLost)
        assert isinstance(outcome[0].__cause__, dedupd.NetworkError)
        assert len(rec.timeouts) >= 2
        assert max(rec.timeouts) <= 0.5
        record = other.get(kept)
    assert record is not None
    assert (record.state, record.result) == ("done", "kept")


def test_a_call_that_claims_its_own_key_again_fails_at_once(server: Server, key: str) -> None:
    """A decorated function that calls itself with the same key would wait
    for its own claim (then raise Busy): it is refused before any request,
    and the outer call releases the key."""
    rec = Recorder()
    with server.client(transport=rec) as client:

        @client.once(key=lambda order, retry=False: order, wait=5)
        def ship(order: str, retry: bool = False) -> str:
            if not retry:
                return ship(order, retry=True)
            return "shipped"

        with pytest.raises(RuntimeError, match="would wait for itself"):
            ship(key)
        assert rec.count("POST", key.split("/")[-1]) == 1  # the outer claim only
        assert client.get(key) is None  # released by the outer call

        # Another key inside, the same key from another thread (Busy: held
        # elsewhere), and the same key again once the block is left, are claims.
        with client.claim(key) as outer:
            with client.claim(f"{key}/inner") as inner:
                inner.result = "inner"
            busy: list[BaseException] = []

            def elsewhere() -> None:
                try:
                    client.claim(key)
                except BaseException as e:  # handed to the test
                    busy.append(e)

            t = threading.Thread(target=elsewhere)
            t.start()
            t.join()
            assert isinstance(busy[0], dedupd.Busy), repr(busy[0])
            outer.release()
        assert ship(key, retry=True) == "shipped"


@pytest.mark.one_backend
def test_a_client_dropped_without_close_leaves_nothing_behind(server: Server, key: str) -> None:
    """A client made per request and never closed (as many apps do): once
    dropped it is collected (its connections with it), and its heartbeat
    thread ends."""
    refs = []
    for i in range(20):
        c = server.client()
        refs.append(weakref.ref(c))

        @c.once(key=lambda k: k, ttl=300)
        def work(k: str) -> str:
            return k

        assert work(f"{key}/{i}") == f"{key}/{i}"
        del c, work
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    wait_until(lambda: heartbeats() == [], "the dropped clients' heartbeat threads to end")


@pytest.mark.one_backend
def test_the_heartbeat_thread_ends_when_idle_and_starts_again_for_the_next_claim(
    server: Server, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sync, "IDLE_SECONDS", 0.05)
    rec = Recorder()
    with server.client(transport=rec) as client:
        with client.claim(f"{key}/1", ttl=30):
            assert len(heartbeats()) == 1
        wait_until(lambda: heartbeats() == [], "the idle heartbeat thread to end")
        with client.claim(f"{key}/2", ttl=0.3) as claim:
            assert len(heartbeats()) == 1
            wait_until(lambda: rec.count("POST", "/extend") >= 3, "the new thread's extends")
            assert not claim.lost
        record = client.get(f"{key}/2")
    assert record is not None
    assert record.state == "done"


@pytest.mark.one_backend
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_heartbeats_its_own_claims(server: Server, key: str) -> None:
    """A child forked after the parent's heartbeat thread started holds a
    1 s claim through 3 s of work: its client has a heartbeat thread (and
    connections) of its own."""
    with server.client() as client, client.claim(f"{key}/parent", ttl=30):
        assert len(heartbeats()) == 1  # the parent's heartbeat thread runs
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(r)
                with client.claim(key, ttl=1) as c:
                    time.sleep(3)  # the work
                    record = client.get(key)
                    if record is None or (record.state, record.fence) != ("processing", c.fence):
                        os.write(w, f"the claim lapsed: {record!r}".encode())
                        status = 2
                    c.result = "child"
                if status == 1:
                    status = 0
            except BaseException as e:
                os.write(w, repr(e).encode())
                status = 3
            finally:
                os._exit(status)
        os.close(w)
        _, code = os.waitpid(pid, 0)
        with os.fdopen(r, "rb") as pipe:
            why = pipe.read().decode(errors="replace")
        assert os.waitstatus_to_exitcode(code) == 0, why
        record = client.get(key)
    assert record is not None
    assert (record.state, record.result) == ("done", "child")
