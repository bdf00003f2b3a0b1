"""``verify_delivery``: checks a delivery that dedupd's gateway forwarded."""

from __future__ import annotations

import json as json_module
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ._errors import InvalidSignature


class Headers(Protocol):
    """Anything with ``items()``: a dict, Flask's (Werkzeug's) or Starlette's headers."""

    def items(self) -> Iterable[tuple[str, str]]: ...


def verify_delivery(
    headers: Headers, body: bytes | str, secret: str | Sequence[str], *, json: bool = True
) -> Any:
    """Verifies a webhook that dedupd forwarded (Standard Webhooks:
    ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``) and returns
    its JSON payload, or with ``json=False`` its body as bytes (a provider
    that sends form-encoded or other bodies).

    ``body`` is the raw body exactly as received; ``secret`` the source's
    ``destination_secret`` (``whsec_...``), or several of them while a
    rotation is under way (any one matching verifies). Raises
    :class:`dedupd.InvalidSignature` when a header is missing, the timestamp
    is over 5 minutes off, or no signature matches; ``ValueError`` when a
    secret is not a destination secret, or when a delivery that verifies has
    a body that is not JSON (``json=False`` takes it as it is).

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
    hooks = []
    for n, s in enumerate(secrets):
        try:
            hooks.append(Webhook(s))
        except ValueError:  # not base64 (binascii.Error); never quoted: it is a secret
            raise ValueError(
                f"secret {n} is not a destination secret (whsec_ and base64)"
            ) from None
    plain = {k: v for k, v in headers.items()}
    failure: WebhookVerificationError | None = None
    for hook in hooks:
        try:
            hook.verify(body, plain, json_parse=False)
        except WebhookVerificationError as e:
            failure = e
            continue
        raw = body.encode() if isinstance(body, str) else bytes(body)
        if not json:
            return raw
        try:
            return json_module.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ValueError(
                "the delivery is signed, but its body is not JSON: "
                "verify_delivery(..., json=False) returns it as bytes"
            ) from e
    raise InvalidSignature(f"the delivery is refused: {failure}") from failure
