"""Capture what the server logs while a test runs (uvicorn's loggers and bargein's).

The live server runs in a thread of the test process, so its log records can
be read here. uvicorn's own loggers do not propagate to the root logger
(uvicorn's default logging config), so pytest's ``caplog`` misses them: this
helper puts a handler on each logger named.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

SERVER_LOGGERS = ("uvicorn.error", "bargein")


class Records(logging.Handler):
    """A handler that keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at_least(self, level: int) -> list[logging.LogRecord]:
        """The records at ``level`` or above."""
        return [r for r in self.records if r.levelno >= level]

    def with_traceback(self) -> list[logging.LogRecord]:
        """The records that carry an exception (a traceback in the log)."""
        return [r for r in self.records if r.exc_info or r.exc_text]

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@contextlib.contextmanager
def server_log(*names: str, level: int = logging.DEBUG) -> Iterator[Records]:
    """Records of the loggers ``names`` (default: uvicorn's errors and bargein's)
    at ``level`` and above, logged inside the ``with`` block."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in names or SERVER_LOGGERS]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(level)
    try:
        yield handler
    finally:
        for lg, old in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(old)
