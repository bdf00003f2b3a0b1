"""A webhook receiver behind dedupd's gateway, in Flask.

dedupd verifies the provider's signature, stores the event and delivers it
here signed with the source's destination secret, retrying until it gets a
2xx. A retry can repeat an event this receiver already processed (its 2xx
was lost on the way back), so the receiver checks the signature, then
processes each event once with the decorator: a repeat gets the first
result without running again.

    DEDUPD_URL=http://127.0.0.1:8080 DEDUPD_TOKEN=... \\
    DESTINATION_SECRET=whsec_... python receiver.py     # listens on :3000/hooks

The write is fenced: the claim's fence is stored with each run's row, and a
write with a smaller fence than the row's is refused, so a worker whose
claim lapsed and was taken over cannot overwrite the newer worker's write.
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
            "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, status TEXT, "
            "event_id TEXT, fence INTEGER)"
        )

    @client.once(key=lambda event_id, event: f"sume:{event_id}", ttl=60)
    def process(event_id: str, event: dict[str, Any]) -> dict[str, Any]:
        fence = dedupd.current_claim().fence
        with sqlite3.connect(db_path) as db:
            written = db.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
                "status = excluded.status, event_id = excluded.event_id, fence = excluded.fence "
                "WHERE excluded.fence > runs.fence",
                (event["run_id"], event["type"], event_id, fence),
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
