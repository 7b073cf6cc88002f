"""Whether a token log read fails at once, before a caller commits to an answer.

An SSE resume answers with an HTTP status before its first event: a log that
lost the offsets asked for must be a 410, not a 200 followed by an error
event. Where a lost log shows (the read's replay phase) the read needs log
round trips only, so the status may wait a bounded time for the read's first
item. The probe read is then closed; the response reads again from the same
offset (the log's replay is cheap, and nothing is generated twice).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from bargein.session.errors import TokenLogError
from bargein.session.streams.log.contract import TokenLog


async def read_error_soon(
    log: TokenLog, stream_id: str, from_offset: int, timeout_s: float
) -> TokenLogError | None:
    """The error a read from ``from_offset`` raises before its first item, if it
    does within ``timeout_s``; None when an item came first, or nothing yet
    (a live stream waiting for its next token).

    Raises nothing of the read's own (a read that failed otherwise fails the
    same way again when read for real); CancelledError when cancelled.
    """
    async with aclosing(log.read(stream_id, from_offset)) as items:
        first = asyncio.ensure_future(anext(items))
        try:
            await asyncio.wait({first}, timeout=timeout_s)
        finally:
            first.cancel()
            await asyncio.wait({first})  # an async generator closes only once nothing runs in it
    if first.cancelled():
        return None
    error = first.exception()
    return error if isinstance(error, TokenLogError) else None
