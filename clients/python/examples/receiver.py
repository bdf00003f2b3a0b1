"""A webhook receiver behind dedupd's gateway, in Flask.

dedupd verifies the provider's signature, stores the event and delivers it
here signed with the source's destination secret, retrying until it gets a
2xx. A retry can repeat an event this receiver already processed (its 2xx
was lost on the way back), so the receiver checks the signature, then
processes each event once with the decorator: a repeat gets the first
result without running again.

    DEDUPD_URL=http://127.0.0.1:8080 DEDUPD_TOKEN=... \\
    DESTINATION_SECRET=whsec_... python receiver.py     # listens on :3000/hooks

The write is fenced: each event's row is keyed by its claim's key and
stores that claim's fence, and a write whose fence is not above the row's is
refused, so a worker whose claim lapsed and was taken over cannot overwrite
the newer worker's write. Fences are compared within one key only (on a
Redis Cluster each key's fences grow on their own, docs/claims.md): to order
the writes of different events to one run, use apply and the stream's head.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from flask import Flask, request

import dedupd


def create_app(client: dedupd.Client, secret: str, db_path: str) -> Flask:
    app = Flask(__name__)
    with sqlite3.connect(db_path) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS events (key TEXT PRIMARY KEY, run_id TEXT, "
            "status TEXT, event_id TEXT, fence INTEGER)"
        )

    @client.once(key=lambda event_id, event: f"sume:{event_id}", ttl=60)
    def process(event_id: str, event: dict[str, Any]) -> dict[str, Any]:
        claim = dedupd.current_claim()
        with sqlite3.connect(db_path) as db:
            # One row per claim key: its fences are comparable, those of two keys are not.
            written = db.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "run_id = excluded.run_id, status = excluded.status, "
                "event_id = excluded.event_id, fence = excluded.fence "
                "WHERE excluded.fence > events.fence",
                (claim.key, event["run_id"], event["type"], event_id, claim.fence),
            ).rowcount
        return {"event_id": event_id, "run_id": event["run_id"], "written": written == 1}

    @app.post("/hooks")
    def hooks() -> tuple[dict[str, Any], int]:
        try:
            event = dedupd.verify_delivery(request.headers, request.get_data(), secret)
        except dedupd.InvalidSignature as e:
            return {"error": str(e)}, 401
        return process(request.headers["webhook-id"], event), 200

    return app


if __name__ == "__main__":
    client = dedupd.Client(
        os.environ.get("DEDUPD_URL", "http://127.0.0.1:8080"), token=os.environ.get("DEDUPD_TOKEN")
    )
    app = create_app(client, os.environ["DESTINATION_SECRET"], os.environ.get("DB", "runs.db"))
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "3000")))
