"""Builders shared by the token log tests: infos, entries, steps, collecting reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from bargein.session.streams.log import LogEntry, StreamEnd, StreamInfo, StreamWrite


class FakeClock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def live_info(stream_id: str, *, principal: str = "alice", node: str = "node-a") -> StreamInfo:
    """A StreamInfo as create_stream takes it."""
    return StreamInfo(
        stream_id=stream_id,
        response_id=f"resp-{stream_id}",
        principal=principal,
        session_id=f"sess-{stream_id}",
        owner_node=node,
        status="live",
        end=0,
        finish=None,
    )


def entry(start: int, end: int, text: str | None = None) -> LogEntry:
    """Entry [start, end) with ids 1000+offset and text "<start-end>" unless given."""
    return LogEntry(
        start=start,
        end=end,
        text=f"<{start}-{end}>" if text is None else text,
        token_ids=tuple(1000 + i for i in range(start, end)),
    )


def finish(end: int, reason: str = "stop") -> StreamEnd:
    """A StreamEnd with a fixed usage: prompt 7, completion ``end``, cached 3."""
    return StreamEnd(end=end, finish_reason=reason, prompt_tokens=7, completion_tokens=end, cached_tokens=3)


def write(stream_id: str, e: LogEntry | None = None, f: StreamEnd | None = None) -> StreamWrite:
    """One stream's part of a step."""
    return StreamWrite(stream_id=stream_id, entry=e, finish=f)


def chunks(bounds: Sequence[int]) -> list[LogEntry]:
    """Contiguous entries between consecutive bounds, e.g. [0, 2, 5] -> [0,2), [2,5)."""
    return [entry(a, b) for a, b in zip(bounds, bounds[1:])]


async def collect(events: AsyncIterator[LogEntry | StreamEnd]) -> list[LogEntry | StreamEnd]:
    """Read a stream to its end."""
    return [event async for event in events]


class Follower:
    """Reads a stream to its end in a task of its own; :attr:`received` holds
    what came so far, so a test can wait until a reader got to a point."""

    def __init__(self, events: AsyncIterator[LogEntry | StreamEnd]) -> None:
        self.received: list[LogEntry | StreamEnd] = []
        self.task = asyncio.create_task(self._read(events))

    async def _read(self, events: AsyncIterator[LogEntry | StreamEnd]) -> list[LogEntry | StreamEnd]:
        async for event in events:
            self.received.append(event)
        return self.received
