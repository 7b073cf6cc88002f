"""One tokenization in flight per connection: a client cannot queue up many (tokenizing is CPU-bound)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class OneAtATime:
    """At most one holder per key (a connection): later ones wait their turn.

    Keys without a holder or a waiter are forgotten, so the table holds only
    the connections tokenizing now.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key`` for the ``async with`` block (waiting for it first)."""
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)
