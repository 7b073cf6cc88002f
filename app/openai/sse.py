"""Server-sent events (SSE) framing and the event ids of resumable streams (sans-I/O).

An event id names a position in a token stream: ``<stream_id>:<end>``, where
``end`` is the offset just past the last token the client has received.
Resuming from an id replays the stream from ``end`` (docs/protocol.md, "Offsets and
streams"); the id of a stream's first event, sent before any token, is
``<stream_id>:0``.

Framing follows the WHATWG HTML "Server-sent events" section: ``id:`` and
``data:`` fields, one ``data:`` line per line of the payload, a blank line
ends the event. An event without an ``id:`` field keeps the last id the client
saw (its ``lastEventId``), which is how the closing events of a stream (they
add no token) say that they sit at the stream's final position.
"""

from __future__ import annotations

import re

from bargein.protocol.events import MAX_OFFSET

MAX_STREAM_ID_CHARS = 128
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the only line ends SSE knows (not str.splitlines')


def event_id(stream_id: str, end: int) -> str:
    """The SSE id of the position ``end`` (tokens ``[0, end)`` received) of a stream."""
    return f"{stream_id}:{end}"


def parse_event_id(value: str) -> tuple[str, int]:
    """``(stream_id, end)`` of an id made by :func:`event_id`.

    Raises:
        ValueError: not ``<stream_id>:<end>`` with a non-empty stream id (at
            most 128 characters) and a decimal ``end``, or ``end`` outside
            ``[0, MAX_OFFSET]``.
    """
    stream_id, sep, end = value.strip().rpartition(":")
    if not sep or not stream_id or len(stream_id) > MAX_STREAM_ID_CHARS:
        raise ValueError(f"event id {value[:160]!r} is not '<stream_id>:<end>'")
    return stream_id, parse_offset(end, "the event id's end")


def parse_offset(text: str, name: str) -> int:
    """A token offset written in decimal, in ``[0, MAX_OFFSET]``.

    The length is checked before ``int()`` runs: Python refuses to parse more
    than 4,300 digits (a ValueError of its own, with its own message), and a
    number of 2**64 and more must never reach the token log (Redis stream ids).

    Raises:
        ValueError: not ASCII decimal digits, or past ``MAX_OFFSET``; the
            message names ``name``.
    """
    if not text.isascii() or not text.isdecimal():
        raise ValueError(f"{name} must be a token offset >= 0, got {text[:40]!r}")
    if len(text.lstrip("0")) > len(str(MAX_OFFSET)) or int(text) > MAX_OFFSET:
        raise ValueError(f"{name} must be at most {MAX_OFFSET}, got {text[:40]!r}")
    return int(text)


def format_event(data: str, *, event_id: str | None = None) -> bytes:
    """One SSE event as UTF-8 bytes: an optional ``id:`` line, ``data:`` lines, a blank line.

    Raises:
        ValueError: ``event_id`` holds a line break or NUL (the spec would
            split or ignore it).
    """
    lines = []
    if event_id is not None:
        if any(c in event_id for c in "\r\n\0"):
            raise ValueError("an SSE id must not hold CR, LF or NUL")
        lines.append(f"id: {event_id}")
    lines += [f"data: {line}" for line in _LINE_BREAK.split(data)]
    return ("\n".join(lines) + "\n\n").encode("utf-8")
