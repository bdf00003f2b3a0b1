"""``current_claim()``: the claim of the decorated call or ``with`` block
running in this context (thread, or asyncio task)."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar, Token
from typing import Any

from ._models import BaseClaim

CURRENT: ContextVar[BaseClaim] = ContextVar("dedupd_current_claim")


def current_claim() -> BaseClaim:
    """The claim held by the innermost ``@client.once`` call or ``with
    client.claim(...)`` block running here: its ``key``, ``token`` and
    ``fence``.

    Pass the fence to downstream writes that refuse a fence smaller than the
    last they saw. Raises :class:`RuntimeError` outside such a call.
    """
    try:
        return CURRENT.get()
    except LookupError:
        raise RuntimeError(
            "dedupd.current_claim() is called outside a claim: call it inside a function "
            "decorated with client.once(...) or a `with client.claim(...)` block"
        ) from None


def reset(token: Token[Any] | None) -> None:
    """Puts back the claim that was current before ``CURRENT.set`` gave
    ``token``; nothing when the block is left in another context than the
    one that entered it (an async generator finalized by another task, say),
    where that context's claim is not this one's to undo."""
    if token is not None:
        with contextlib.suppress(ValueError):
            CURRENT.reset(token)
