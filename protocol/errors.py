"""Exceptions of the protocol package.

Two siblings under one base, because the app answers them differently:
:class:`ProtocolError` becomes an ``error`` event and the connection stays
open; :class:`FrameTooLarge` closes the connection with 1009. Catching
``ProtocolError`` never swallows ``FrameTooLarge``.
"""

from __future__ import annotations

from bargein.protocol.events import ErrorCode, ErrorEvent


class ProtocolException(Exception):
    """Base of every exception the protocol package raises on purpose."""


class ProtocolError(ProtocolException):
    """A frame that breaks the v1 contract; answered with an ``error`` event.

    Attributes:
        code: the error code sent to the client.
        message: human-readable, safe to send (no internals).
        event_id: the offending event's ``event_id`` when it could be read.
    """

    def __init__(self, code: ErrorCode, message: str, event_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.event_id = event_id

    def to_event(self) -> ErrorEvent:
        """The ``error`` event answering this error (``retryable`` from the code)."""
        return ErrorEvent(
            code=self.code, message=self.message, retryable=self.code.retryable, event_id=self.event_id
        )


class FrameTooLarge(ProtocolException):
    """A frame over ``max_frame_bytes``; the app closes with 1009.

    Attributes:
        size: the frame's size in bytes (UTF-8 bytes for a text frame).
        limit: the limit in force.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds max_frame_bytes={limit}")
        self.size = size
        self.limit = limit
