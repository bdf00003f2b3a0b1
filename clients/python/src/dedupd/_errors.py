"""The exceptions: one class per kind of refusal, chosen by the problem's `code`.

Every error answer of dedupd is an RFC 9457 problem document with a stable
`code`; :func:`from_problem` turns it into the exception named for that code,
so no caller parses JSON errors.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any


class DedupdError(Exception):
    """Base of every error this package raises.

    For an error answer of the server, ``status`` is its HTTP status, ``code``
    its problem code (``"busy"``, ``"invalid_ttl"``, ...), ``detail`` its
    explanation and ``problem`` the whole problem document; ``key`` is the
    claim key (or stream) the call named.
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        problem: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code
        self.problem: Mapping[str, Any] = problem or {}
        self.key = key

    def reason(self) -> str:
        """The message without the key: ``"400 invalid_ttl: ..."``."""
        prefix = f"{self.status} {self.code}: " if self.code else ""
        return f"{prefix}{self.detail}"

    def __str__(self) -> str:
        where = f" (key {self.key!r})" if self.key is not None else ""
        return f"{self.reason()}{where}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a multiprocessing pool's worker raising it) with every
        # field, not only the message: Exception's own would call the class
        # with the message alone.
        return (_rebuild, (type(self), self.detail), self._picklable_state())

    def _picklable_state(self) -> dict[str, Any]:
        return dict(self.__dict__)


class NetworkError(DedupdError):
    """No answer came: the connection failed or timed out (``__cause__`` is
    httpx's error). A write that timed out may or may not have been applied."""


class ServerError(DedupdError):
    """``500 internal`` (nothing was changed), or an answer this client does not
    understand."""


class InvalidRequest(DedupdError):
    """The request is refused as malformed (400, 405, 413, 415): a key, token,
    TTL, fingerprint or timestamp out of its rules. ``field`` names the field."""

    @property
    def field(self) -> str | None:
        value = self.problem.get("field")
        return value if isinstance(value, str) else None


class ResultTooLarge(InvalidRequest):
    """``413 result_too_large``: a done's result is over the server's
    ``claims.max_result_bytes``; nothing was changed."""


class Unauthorized(DedupdError):
    """``401 unauthorized``: the server has API tokens and this client's is
    missing or wrong."""


class Forbidden(DedupdError):
    """The token may not do this (``read_only_token``), or the server refuses
    this client's route to it (``cross_origin``, ``host_not_allowed``,
    ``proxy_needs_tokens``)."""


class NotFound(DedupdError):
    """``404 not_found``: no live record."""


class Lost(DedupdError):
    """``404 lost``: an extend of a claim that expired. Claim the key again."""


class Conflict(DedupdError):
    """The key's state refuses the operation. ``state`` is the key's state
    (``"processing"`` or ``"done"``), ``expires_at_ms`` when it ends."""

    @property
    def state(self) -> str | None:
        value = self.problem.get("state")
        return value if isinstance(value, str) else None

    @property
    def expires_at_ms(self) -> int | None:
        value = self.problem.get("expires_at_ms")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def expires_at(self) -> datetime | None:
        """``expires_at_ms`` as an aware UTC datetime."""
        ms = self.expires_at_ms
        return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


class Busy(Conflict):
    """``409 busy``: another worker holds the key until ``expires_at``."""


class AlreadyDone(Conflict):
    """``409 done``: the work for the key is done. ``result`` is the result the
    first worker stored with it (``None`` when it stored none)."""

    @property
    def result(self) -> Any:
        return self.problem.get("result")


class NotOwner(Conflict):
    """``409 not_owner``: the token does not hold the key (the claim lapsed and
    someone else claimed it)."""


class FingerprintMismatch(Conflict):
    """``422 fingerprint_mismatch``: the key is held (or done) with another
    payload fingerprint: same id, different body."""


class Unavailable(DedupdError):
    """The server cannot take the request now and changed nothing: ``503
    store_unavailable``, ``507 insufficient_storage`` or
    ``keys_in_memory_full``, ``429``. ``retry_after`` is the server's
    ``Retry-After`` in seconds, when it sent one."""

    def __init__(self, detail: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.retry_after = retry_after


class ClaimLost(DedupdError):
    """The worker no longer owns its claim: a heartbeat's extend (or the final
    done) was answered ``lost``, ``not_owner`` or ``done``, or another
    refusal that retrying cannot change (``unauthorized``, ``read_only_token``,
    ...); or extends failed (no answer, 5xx) until the claim's TTL had passed
    since the last one that went through; or the heartbeat stopped on an
    unexpected error (a closed client). The work was not marked done;
    ``__cause__`` is the answer or the error."""


class DoneFailed(DedupdError):
    """The work finished but marking its key done failed (no answer after
    the retries, a 503 that outlasted them, ...): ``__cause__`` is the error.
    ``value`` is what the decorated function returned (or the block's
    ``result``); ``claim`` is the claim, to send the done again with
    ``claim.done(value)`` (``claim.done()`` for a value that is not JSON;
    ``None`` once pickled to another process). The key stays claimed until its TTL lapses (the
    heartbeat has stopped); it was not released, so no retry can run the work
    again while the claim lasts."""

    def __init__(self, detail: str, *, value: Any, claim: Any, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.value = value
        self.claim = claim

    def _picklable_state(self) -> dict[str, Any]:
        # The claim holds its client (connections, locks, a thread), which
        # cannot cross to another process: there it is None. A value that
        # does not pickle is None there too, the message saying so, rather
        # than the whole error lost to the pool's own.
        state = {**self.__dict__, "claim": None}
        try:
            pickle.dumps(self.value)
        except Exception:  # any failure to pickle: a lock, a lambda, a socket
            state["value"] = None
            state["detail"] = (
                f"{self.detail} (its value, a {type(self.value).__name__}, does not pickle: "
                "None in this process)"
            )
        return state


class InvalidSignature(DedupdError):
    """:func:`dedupd.verify_delivery` refused a delivery: a header is missing,
    the timestamp is out of tolerance, or no signature matches."""


def _rebuild(cls: type[DedupdError], detail: str) -> DedupdError:
    """An exception of ``cls`` with ``detail``, its fields set by pickle after."""
    e = cls.__new__(cls)
    Exception.__init__(e, detail)
    return e


_BY_CODE: dict[str, type[DedupdError]] = {
    "busy": Busy,
    "done": AlreadyDone,
    "not_owner": NotOwner,
    "lost": Lost,
    "fingerprint_mismatch": FingerprintMismatch,
    "result_too_large": ResultTooLarge,
    "malformed_body": InvalidRequest,
    "body_too_large": InvalidRequest,
    "unsupported_media_type": InvalidRequest,
    "method_not_allowed": InvalidRequest,
    "missing_event_id": InvalidRequest,
    "unauthorized": Unauthorized,
    "read_only_token": Forbidden,
    "cross_origin": Forbidden,
    "host_not_allowed": Forbidden,
    "proxy_needs_tokens": Forbidden,
    "not_found": NotFound,
    "unknown_source": NotFound,
    "unknown_event": NotFound,
    "store_unavailable": Unavailable,
    "insufficient_storage": Unavailable,
    "keys_in_memory_full": Unavailable,
    "disk_low": Unavailable,
    "auth_throttled": Unavailable,
    "too_many_scans": Unavailable,
    "body_timeout": Unavailable,
    "internal": ServerError,
}

_BY_STATUS: dict[int, type[DedupdError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: InvalidRequest,
    408: Unavailable,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    421: Forbidden,
    422: Conflict,
    429: Unavailable,
    503: Unavailable,
    507: Unavailable,
}


def error_class(status: int, code: str | None) -> type[DedupdError]:
    """The exception class for a problem's status and code."""
    if code is not None:
        if code in _BY_CODE:
            return _BY_CODE[code]
        if code.startswith("invalid_"):
            return InvalidRequest
    return _BY_STATUS.get(status, ServerError)


def from_problem(
    status: int,
    problem: Mapping[str, Any],
    *,
    retry_after: float | None,
    key: str | None,
) -> DedupdError:
    """The exception for an error answer (``problem`` is its decoded body,
    empty when it had none)."""
    raw_code = problem.get("code")
    code = raw_code if isinstance(raw_code, str) else None
    raw_detail = problem.get("detail")
    if isinstance(raw_detail, str):
        detail = raw_detail
    elif code is None:
        detail = f"HTTP {status} without dedupd's problem document (a proxy's answer?)"
    else:
        detail = f"HTTP {status}"
    cls = error_class(status, code)
    if issubclass(cls, Unavailable):
        return cls(
            detail,
            retry_after=retry_after,
            status=status,
            code=code,
            problem=problem,
            key=key,
        )
    return cls(detail, status=status, code=code, problem=problem, key=key)
