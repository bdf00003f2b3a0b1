"""Fixtures: a real dedupd release binary, on the embedded redb store and on
Redis (a redis-server started here), with an API token.

The binary is ``$DEDUPD_BIN``, else the repository's
``target/release/dedupd``; the Redis backend needs it built with
``--features redis``. ``redis-server`` must be on the PATH.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dedupd
from dedupd import _deadline

REPO = Path(__file__).resolve().parents[2]
# DEDUPD_TEST_BACKENDS=redb runs one backend only (a binary built without Redis support).
BACKENDS = os.environ.get("DEDUPD_TEST_BACKENDS", "redb,redis").split(",")
# Up to the large result a done may carry (`claims.max_result_bytes`, 64 KiB by default), and more.
MAX_BODY_BYTES = 256 * 1024

# The servers here listen on 127.0.0.1: no proxy of the environment between
# them and the clients (httpx honours HTTP_PROXY and the like), those of the
# examples' subprocesses included.
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, [os.environ.get(_var), "127.0.0.1", "localhost"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def binary() -> str:
    path = os.environ.get("DEDUPD_BIN") or str(REPO / "target" / "release" / "dedupd")
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"no dedupd binary at {path}: build it (cargo build --release --features redis) "
            "or set DEDUPD_BIN"
        )
    return path


def dedupd_env() -> dict[str, str]:
    """The environment without DEDUPD_ variables, which dedupd reads as settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DEDUPD_")}


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


class RedisServer:
    """A redis-server on a free port, in its own directory, without persistence."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not on the PATH (Debian: apt-get install redis-server)")
        self.dir = workdir / "redis"
        self.dir.mkdir(exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--save", "", "--appendonly", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited: {_tail(self.dir / 'redis.log')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        pytest.fail("redis-server did not answer PING within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


class Server:
    """A dedupd serving on a free port with a temporary config and data."""

    def __init__(self, backend: str, workdir: Path, redis: RedisServer | None) -> None:
        self.backend = backend
        self.dir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(32)
        self.read_token = secrets.token_hex(32)
        self.redis = redis
        self.log = workdir / "dedupd.log"
        self.config = workdir / "dedupd.toml"
        self.proc: subprocess.Popen[bytes] | None = None
        self.write_config()

    def write_config(self, extra: str = "") -> None:
        text = (
            f'listen = "127.0.0.1:{self.port}"\n'
            f'data_path = "{self.dir / "dedupd.redb"}"\n'
            "[api]\n"
            f'tokens = ["{self.token}"]\n'
            f'read_tokens = ["{self.read_token}"]\n'
            "[http]\n"
            f"max_body_bytes = {MAX_BODY_BYTES}\n"
        )
        if self.redis is not None:
            text += f'[storage]\nbackend = "redis"\n[storage.redis]\nurl = "{self.redis.url}"\n'
        self.config.write_text(text + extra)
        self.config.chmod(0o600)

    def start(self) -> None:
        log = open(self.log, "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            [binary(), "serve", "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, env=dedupd_env(), cwd=self.dir,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"dedupd exited with {self.proc.returncode}: {_tail(self.log)}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        pytest.fail(f"dedupd was not ready within 20 s: {_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, **kw: Any) -> dedupd.Client:
        return dedupd.Client(self.url, token=self.token, **kw)

    def async_client(self, **kw: Any) -> dedupd.AsyncClient:
        return dedupd.AsyncClient(self.url, token=self.token, **kw)


def serve(backend: str, extra: str = "") -> Iterator[Server]:
    workdir = Path(tempfile.mkdtemp(prefix=f"dedupd-py-{backend}-"))
    redis = RedisServer(workdir) if backend == "redis" else None
    try:
        if redis is not None:
            redis.start()
        server = Server(backend, workdir, redis)
        if extra:
            server.write_config(extra)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        if redis is not None:
            redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "one_backend: the client's own behaviour, whatever the store: run against the first "
        "backend only",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the ``one_backend`` tests' runs on the other backends."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("server", BACKENDS[0]) if callspec else BACKENDS[0]
        other = item.get_closest_marker("one_backend") is not None and backend != BACKENDS[0]
        (drop if other else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", params=BACKENDS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """One server per backend for the session: tests use keys of their own."""
    yield from serve(request.param)


@pytest.fixture(params=BACKENDS)
def own_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server for one test, which may restart it (or its Redis)."""
    yield from serve(request.param)


@pytest.fixture
def client(server: Server) -> Iterator[dedupd.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A key no other test uses."""
    return f"{request.node.name}/{secrets.token_hex(4)}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder(httpx.HTTPTransport):
    """A transport that records each request's method, path and status, and
    can cut this client off from the server's ``/extend`` (a partition that
    starves its heartbeat), or hold each extend until ``hold_extends`` is set
    (a worker paused with its extend unsent)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int | None]] = []
        self.cut_extends = False
        self.hold_extends: threading.Event | None = None
        self.held = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        if self.cut_extends and path.endswith("/extend"):
            self.calls.append((request.method, path, None))
            raise httpx.ConnectError("partitioned by the test", request=request)
        hold = self.hold_extends
        if hold is not None and path.endswith("/extend"):
            self.held += 1
            hold.wait(30)
            # Held as if the worker paused before it began the request: sent
            # late, within a timeout of its own.
            with _deadline.within(10):
                resp = super().handle_request(request)
        else:
            resp = super().handle_request(request)
        self.calls.append((request.method, path, resp.status_code))
        return resp

    def count(self, method: str, suffix: str = "") -> int:
        return sum(1 for m, p, _ in self.calls if m == method and p.endswith(suffix))


class AsyncRecorder(httpx.AsyncHTTPTransport):
    """:class:`Recorder` for the async client."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int | None]] = []
        self.cut_extends = False
        self.hold_extends: asyncio.Event | None = None
        self.held = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        if self.cut_extends and path.endswith("/extend"):
            self.calls.append((request.method, path, None))
            raise httpx.ConnectError("partitioned by the test", request=request)
        hold = self.hold_extends
        if hold is not None and path.endswith("/extend"):
            self.held += 1
            await asyncio.wait_for(hold.wait(), 30)
            with _deadline.within(10):  # as Recorder's
                resp = await super().handle_async_request(request)
        else:
            resp = await super().handle_async_request(request)
        self.calls.append((request.method, path, resp.status_code))
        return resp

    def count(self, method: str, suffix: str = "") -> int:
        return sum(1 for m, p, _ in self.calls if m == method and p.endswith(suffix))


def wait_until(predicate: Any, what: str, timeout: float = 10.0) -> None:
    """Polls ``predicate`` until it is true; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)
