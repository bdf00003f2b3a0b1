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


def enter(claim: BaseClaim, client: object, here: object) -> Token[BaseClaim]:
    """Makes ``claim`` (of ``client``) current, held by ``here`` (a
    thread's ident, or an asyncio task)."""
    claim._outer = CURRENT.get(None)
    claim._held = (client, here)
    return CURRENT.set(claim)


def leave(claim: BaseClaim, token: Token[Any] | None) -> None:
    """Ends what :func:`enter` began."""
    claim._held = None
    claim._outer = None
    reset(token)


def held_here(client: object, key: str, here: object) -> bool:
    """Whether a block or decorated call of ``client`` that the code running
    here (thread ``here``, or asyncio task) is inside of holds ``key``:
    claiming it again would wait for itself. (Another client's claim of the
    key is as another worker's: Busy.)"""
    claim = CURRENT.get(None)
    while claim is not None:
        held = claim._held
        if claim.key == key and held is not None and held[0] is client and held[1] == here:
            return True
        claim = claim._outer
    return False


def reentry(key: str) -> RuntimeError:
    return RuntimeError(
        f"{key!r} is claimed already by a block or decorated call that this claim runs inside "
        "of (a decorated function calling itself with the same key?): it would wait for itself"
    )


def reset(token: Token[Any] | None) -> None:
    """Puts back the claim that was current before ``CURRENT.set`` gave
    ``token``; nothing when the block is left in another context than the
    one that entered it (an async generator finalized by another task, say),
    where that context's claim is not this one's to undo."""
    if token is not None:
        with contextlib.suppress(ValueError):
            CURRENT.reset(token)
