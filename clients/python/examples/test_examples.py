"""The examples, run as their READMEs say, against a real dedupd on each
backend: the article's worker rewritten with the client (as docs/claims.md
shows it), and the Flask receiver behind dedupd's gateway."""

from __future__ import annotations

import base64
import os
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from conftest import BACKENDS, REPO, Server, binary, dedupd_env, free_port, serve, wait_until

HERE = Path(__file__).resolve().parent


def run(script: Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, str(script)], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_docs_show_the_articles_worker_and_its_rewrite_verbatim() -> None:
    doc = (REPO / "docs" / "claims.md").read_text()
    assert (REPO / "tests" / "service" / "resp" / "article.py").read_text() in doc
    assert (HERE / "article_worker.py").read_text() in doc


def test_the_articles_worker_rewritten_processes_once(server: Server) -> None:
    env = {"DEDUPD_URL": server.url, "DEDUPD_TOKEN": server.token}
    worker = HERE / "article_worker.py"
    first = run(worker, env)
    assert first == "processing req_demo\n{'charged': 42} {'charged': 42}\n"
    # Run again, as a redelivery would: done already, the stored result.
    assert run(worker, env) == "{'charged': 42} {'charged': 42}\n"


@pytest.fixture(params=BACKENDS)
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[Server, int, str]]:
    """A dedupd with a Sume source forwarding to a receiver's port."""
    port = free_port()
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    source = (
        "[sources.sume]\n"
        'scheme = "sume"\n'
        f'secrets = ["{secrets.token_hex(24)}"]\n'
        'event_id = "body:/request_id"\n'
        'created_at = "body:/created_at"\n'
        'stream = "body:/run_id"\n'
        f'forward_to = "http://127.0.0.1:{port}/hooks"\n'
        f'destination_secret = "{secret}"\n'
    )
    for server in serve(request.param, source):
        yield server, port, secret


def test_the_flask_receiver_verifies_and_processes_once(
    gateway: tuple[Server, int, str], tmp_path: Path
) -> None:
    server, port, secret = gateway
    db = tmp_path / "runs.db"
    env = {
        **os.environ,
        "DEDUPD_URL": server.url,
        "DEDUPD_TOKEN": server.token,
        "DESTINATION_SECRET": secret,
        "DB": str(db),
        "PORT": str(port),
    }
    log = open(tmp_path / "receiver.log", "wb")  # noqa: SIM115 - the process keeps it
    receiver = subprocess.Popen(
        [sys.executable, str(HERE / "receiver.py")], env=env, stdout=log, stderr=log
    )
    try:
        hooks = f"http://127.0.0.1:{port}/hooks"
        wait_until(lambda: _listening(port), "the receiver to listen", timeout=20)

        # The provider sends an event twice: the gateway takes it once and
        # forwards it, signed with the destination secret.
        trigger = subprocess.run(
            [binary(), "trigger", "sume", "--duplicate", "--config", str(server.config)],
            capture_output=True,
            text=True,
            env=dedupd_env(),
        )
        assert trigger.returncode == 0, trigger.stderr
        assert '"status":"duplicate"' in trigger.stdout

        def rows() -> list[tuple[str, str, str, str, int]]:
            with sqlite3.connect(db) as c:
                query = "SELECT key, run_id, status, event_id, fence FROM events"
                return c.execute(query).fetchall()

        wait_until(lambda: len(rows()) == 1, "the delivery to be processed")
        ((claim_key, run_id, status, event_id, fence),) = rows()
        assert status == "run.completed"
        # The row is the event's, keyed by its claim's key: fences compare within one key.
        assert claim_key == f"sume:{event_id}"
        # The row carries the fence of the claim that processed it.
        with server.client() as client:
            record = client.get(claim_key)
        assert record is not None
        assert (record.state, record.fence) == ("done", fence)

        # The gateway delivers again (the receiver's 2xx was lost): the
        # receiver answers with the first result and does not write again.
        with httpx.Client(
            base_url=server.url, headers={"authorization": f"Bearer {server.token}"}
        ) as api:
            body = api.get(f"/v1/sources/sume/events/{event_id}").json()["body"].encode()
        now = datetime.now(tz=timezone.utc)
        headers = {
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(secret).sign(event_id, now, body.decode()),
            "content-type": "application/json",
        }
        again = httpx.post(hooks, content=body, headers=headers)
        assert again.status_code == 200
        assert again.json() == {"event_id": event_id, "run_id": run_id, "written": True}
        assert rows() == [(claim_key, run_id, status, event_id, fence)]

        # A forgery is refused before anything is claimed.
        forged = httpx.post(hooks, content=body.replace(b"succeeded", b"failed"), headers=headers)
        assert forged.status_code == 401
        assert rows() == [(claim_key, run_id, status, event_id, fence)]
    finally:
        receiver.terminate()
        receiver.wait(10)
        log.close()


def _listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.TransportError:
        return False
    return True
