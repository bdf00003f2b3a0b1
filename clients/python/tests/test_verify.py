"""verify_delivery: Standard Webhooks signatures as dedupd's gateway makes
them (signed here with the standardwebhooks library itself; the receiver
example's test has deliveries signed by a real dedupd)."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone

import pytest
from standardwebhooks.webhooks import Webhook

import dedupd

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()
BODY = json.dumps({"request_id": "req_1", "amount": 5}).encode()


def signed(body: bytes = BODY, *secrets: str, at: float | None = None) -> dict[str, str]:
    when = datetime.fromtimestamp(time.time() if at is None else at, tz=timezone.utc)
    # Signed as text: older standardwebhooks releases (the last for Python 3.9) sign only str.
    text = body.decode()
    sigs = " ".join(Webhook(s).sign("req_1", when, text) for s in (secrets or (SECRET,)))
    return {
        "Webhook-Id": "req_1",
        "Webhook-Timestamp": str(int(when.timestamp())),
        "Webhook-Signature": sigs,
        "dedupd-attempt": "1",
    }


def test_a_genuine_delivery_gives_its_payload() -> None:
    assert dedupd.verify_delivery(signed(), BODY, SECRET) == {"request_id": "req_1", "amount": 5}
    assert dedupd.verify_delivery(signed(), BODY.decode(), SECRET)["amount"] == 5


def test_during_a_rotation_either_secret_verifies() -> None:
    both = signed(BODY, OTHER, SECRET)
    assert dedupd.verify_delivery(both, BODY, SECRET)["request_id"] == "req_1"
    assert dedupd.verify_delivery(signed(BODY, OTHER), BODY, [SECRET, OTHER])["amount"] == 5


@pytest.mark.parametrize(
    ("headers", "body", "why"),
    [
        (signed(), BODY.replace(b"5", b"6"), "No matching signature"),
        (signed(BODY, OTHER), BODY, "No matching signature"),
        ({k: v for k, v in signed().items() if k != "Webhook-Signature"}, BODY, "Missing"),
        (signed(at=time.time() - 3600), BODY, "too old"),
    ],
    ids=["changed-body", "other-secret", "unsigned", "stale"],
)
def test_a_forged_or_stale_delivery_is_refused(
    headers: dict[str, str], body: bytes, why: str
) -> None:
    with pytest.raises(dedupd.InvalidSignature, match=why):
        dedupd.verify_delivery(headers, body, SECRET)


def test_no_secret_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="secret"):
        dedupd.verify_delivery(signed(), BODY, [])


def test_a_signed_body_that_is_not_json_is_there_as_bytes() -> None:
    # A provider's form-encoded webhook, which the gateway forwards as it came.
    form = b"payload=%7B%22action%22%3A%22opened%22%7D"
    headers = signed(form)
    assert dedupd.verify_delivery(headers, form, SECRET, json=False) == form
    assert dedupd.verify_delivery(signed(), BODY, SECRET, json=False) == BODY
    with pytest.raises(ValueError, match="json=False") as e:
        dedupd.verify_delivery(headers, form, SECRET)
    assert not isinstance(e.value, dedupd.InvalidSignature), "it is signed"
    with pytest.raises(dedupd.InvalidSignature):
        dedupd.verify_delivery(headers, form + b"&x=1", SECRET, json=False)


def test_a_secret_that_is_not_one_is_named_by_its_place_never_shown() -> None:
    with pytest.raises(ValueError, match="secret 0 is not a destination secret") as e:
        dedupd.verify_delivery(signed(), BODY, ["whsec_not*base64!", SECRET])
    assert "not*base64" not in str(e.value)
