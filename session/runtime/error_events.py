"""The ``error`` events a connection answers a client event with."""

from __future__ import annotations

from bargein.protocol import events as pe
from bargein.session.errors import StreamNotFound, TokenLogError


def error_for(
    code: pe.ErrorCode, message: str, event: object, *, retry_after_ms: int | None = None
) -> pe.ErrorEvent:
    """The ``error`` refusing ``event``, echoing its ``event_id``; retryable as ``code`` is."""
    return pe.ErrorEvent(
        code=code,
        message=message,
        retryable=code.retryable,
        retry_after_ms=retry_after_ms,
        event_id=getattr(event, "event_id", None),
    )


def log_failed(event: object, exc: TokenLogError) -> pe.ErrorEvent:
    """The ``error`` answering ``event`` when the token log failed it with
    ``exc``, echoing its ``event_id`` and ``response_id`` (no internals: the
    log line has them)."""
    if isinstance(exc, StreamNotFound):
        code, message = pe.ErrorCode.NOT_FOUND, "stream not found"
    else:
        code, message = pe.ErrorCode.INTERNAL_ERROR, "the token log is unavailable; retry later"
    return pe.ErrorEvent(
        code=code,
        message=message,
        retryable=code.retryable,
        event_id=getattr(event, "event_id", None),
        response_id=getattr(event, "response_id", None),
    )
