"""What the server answers, as typed values."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

State = Literal["processing", "done"]
Outcome = Literal["applied", "stale", "duplicate"]


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class Record:
    """A key's state: what ``get``, ``done`` and ``extend`` answer.

    ``fence`` is set by ``get`` only; ``result`` is the result stored with a
    done key (``None`` when none was).
    """

    key: str
    state: State
    expires_at_ms: int
    fence: int | None = None
    result: Any = None

    @property
    def expires_at(self) -> datetime:
        """``expires_at_ms`` as an aware UTC datetime."""
        return _utc(self.expires_at_ms)


@dataclass(frozen=True)
class Head:
    """The newest applied event of a stream; ``created_at`` is RFC 3339 in UTC."""

    event_id: str
    created_at: str


@dataclass(frozen=True)
class Applied:
    """What an apply did: ``applied`` (do the write: it is the newest),
    ``stale`` (skip it: newer state is in place) or ``duplicate`` (skip it:
    applied before). ``head`` is the stream's head after the apply."""

    stream: str
    outcome: Outcome
    head: Head | None

    @property
    def applied(self) -> bool:
        """Whether the caller should apply the event's write."""
        return self.outcome == "applied"


@dataclass
class BaseClaim:
    """A claim this process holds: its ``key``, owner ``token`` and ``fence``.

    The fence grows with every claim: pass it to downstream writes and have
    them refuse a fence smaller than the last they saw, so a late worker whose
    claim was taken over cannot overwrite the new owner's write.
    ``expires_at_ms`` moves with each extend.
    """

    key: str
    token: str = field(repr=False)
    fence: int
    expires_at_ms: int
    # Why a heartbeat found the claim lost (set by the heartbeat).
    _lost: Exception | None = field(default=None, init=False, repr=False, compare=False)
    # While a block or decorated call is inside it: its client, and the
    # thread (ident) or asyncio task inside (see _context.held_here).
    _held: tuple[object, object] | None = field(default=None, init=False, repr=False, compare=False)
    # The claim current when this one was entered.
    _outer: BaseClaim | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def lost(self) -> bool:
        """Whether a heartbeat found the claim lost (an extend was answered
        ``lost``, ``not_owner`` or ``done``, or the heartbeat stopped on an
        unexpected error): long work may check it and stop early. Leaving the
        call or block then raises ClaimLost."""
        return self._lost is not None

    @property
    def expires_at(self) -> datetime:
        """``expires_at_ms`` as an aware UTC datetime."""
        return _utc(self.expires_at_ms)
