"""``verify_delivery``: checks a delivery that dedupd's gateway forwarded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ._errors import InvalidSignature


class Headers(Protocol):
    """Anything with ``items()``: a dict, Flask's (Werkzeug's) or Starlette's headers."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def verify_delivery(headers: Headers, body: bytes | str, secret: str | Sequence[str]) -> Any:
    """Verifies a webhook that dedupd forwarded (Standard Webhooks:
    ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``) and returns
    its JSON payload.

    ``body`` is the raw body exactly as received; ``secret`` the source's
    ``destination_secret`` (``whsec_...``), or several of them while a
    rotation is under way (any one matching verifies). Raises
    :class:`dedupd.InvalidSignature` when a header is missing, the timestamp
    is over 5 minutes off, or no signature matches.

    Needs the ``standardwebhooks`` package: ``pip install 'dedupd[webhooks]'``.
    """
    try:
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "dedupd.verify_delivery needs the standardwebhooks package: "
            "pip install 'dedupd[webhooks]'"
        ) from e
    secrets = [secret] if isinstance(secret, str) else list(secret)
    if not secrets or not all(isinstance(s, str) and s for s in secrets):
        raise ValueError("secret must be a destination secret (whsec_...) or a list of them")
    plain = {k: v for k, v in headers.items()}
    failure: WebhookVerificationError | None = None
    for s in secrets:
        try:
            return Webhook(s).verify(body, plain)
        except WebhookVerificationError as e:
            failure = e
    raise InvalidSignature(f"the delivery is refused: {failure}") from failure
