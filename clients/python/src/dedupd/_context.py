"""``current_claim()``: the claim of the decorated call or ``with`` block
running in this context (thread, or asyncio task)."""

from __future__ import annotations

from contextvars import ContextVar

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
