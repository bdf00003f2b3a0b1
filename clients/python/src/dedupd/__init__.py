"""Python client for dedupd: claims that make webhook processing happen once in effect.

    import dedupd

    client = dedupd.Client("http://127.0.0.1:8080", token="...")

    @client.once(key=lambda event: event["request_id"], ttl=300)
    def handle(event: dict) -> dict:
        ...  # runs once per request_id; a repeat gets this call's result

See the package's README for the context manager, the async client,
current_claim() and its fence, and verify_delivery().
"""

from ._async import AsyncClaim, AsyncClient, PendingClaim
from ._context import current_claim
from ._errors import (
    AlreadyDone,
    Busy,
    ClaimLost,
    Conflict,
    DedupdError,
    DoneFailed,
    FingerprintMismatch,
    Forbidden,
    InvalidRequest,
    InvalidSignature,
    Lost,
    NetworkError,
    NotFound,
    NotOwner,
    ResultTooLarge,
    ServerError,
    Unauthorized,
    Unavailable,
)
from ._models import Applied, BaseClaim, Head, Record
from ._sync import Claim, Client
from ._webhooks import verify_delivery

__version__ = "0.1.0"

__all__ = [
    "AlreadyDone",
    "Applied",
    "AsyncClaim",
    "AsyncClient",
    "BaseClaim",
    "Busy",
    "Claim",
    "ClaimLost",
    "Client",
    "Conflict",
    "DedupdError",
    "DoneFailed",
    "FingerprintMismatch",
    "Forbidden",
    "Head",
    "InvalidRequest",
    "InvalidSignature",
    "Lost",
    "NetworkError",
    "NotFound",
    "NotOwner",
    "PendingClaim",
    "Record",
    "ResultTooLarge",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "current_claim",
    "verify_delivery",
]
