"""Structured logs: one JSON object or one logfmt line per record.

Every line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``msg``,
then the ids bound in the current context (:func:`bind`): ``request_id``
(the response id the client knows), ``session_id`` and ``stream_id``, then
the record's ``extra`` fields. asyncio copies the context into each task it
creates, so ids bound in a connection's handler follow the tasks it starts.

What must not leak never does: fields that carry conversation text
(``prompt``, ``text``, ``messages``, ...) are replaced by ``"[redacted]"``
unless ``--log-prompts`` (a debugging flag) is on, and fields that carry
secrets (``api_key``, ``authorization``, tokens) always are, as is a
``Bearer ...`` credential, a ``?api_key=...`` query parameter (uvicorn's
access lines carry the query string) or the password of a URL's user info
(``redis://user:[redacted]@host``: a ``--redis-url`` in a start-up
traceback) anywhere in a message or a traceback.

Faults of one client are not the operator's errors: a hostile client must
not be able to flood the log with tracebacks. :func:`quiet_client_faults`
turns uvicorn's lines about them (an invalid UTF-8 text frame: ERROR with a
traceback; an unparsable HTTP request: WARNING) into one INFO line on the
``bargein.client`` logger without a traceback, or drops them where the app
logs the fault itself, once per connection, with the connection's ids.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any, Literal, TextIO

LogFormat = Literal["json", "logfmt"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "logfmt")
REDACTED = "[redacted]"

CONTEXT_IDS: dict[str, contextvars.ContextVar[str | None]] = {
    name: contextvars.ContextVar(f"bargein_{name}", default=None)
    for name in ("request_id", "session_id", "stream_id")
}
# Conversation text: logged only with --log-prompts.
CONTENT_FIELDS = frozenset(
    {"prompt", "prompts", "text", "messages", "content", "input", "instructions", "output", "completion"}
)
# Credentials: never logged.
SECRET_FIELDS = frozenset(
    {"api_key", "authorization", "secret", "token", "resume_token", "session_token", "password"}
)
_BEARER = re.compile(r"(?i)\b(bearer[ .])\S+")
_QUERY_SECRET = re.compile(
    r"(?i)([?&](?:api[_-]?key|key|access_token|token|authorization"
    r"|password|secret)=)[^&\s\"]*"
)
# scheme://user:password@ anywhere in a line: the password, up to the host's "@".
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@?#'\"]*:)[^\s/?#'\"]*@")
# uvicorn.error's lines about one client's fault -> bargein's line (None: the app
# logs that fault itself, see bargein.app.server.realtime).
CLIENT_FAULT_LINES: dict[str, str | None] = {
    "Invalid UTF-8 sequence received from client.": None,
    "Invalid HTTP request received.": "client sent an invalid HTTP request",
}
client_logger = logging.getLogger("bargein.client")
# Attributes every LogRecord has; anything else on a record came from ``extra``.
# uvicorn's ``color_message`` repeats ``msg`` with terminal colours.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


@contextlib.contextmanager
def bind(**ids: str | None) -> Iterator[None]:
    """Put ids (``request_id``, ``session_id``, ``stream_id``) on every line
    logged inside the ``with`` block (and in tasks created there).

    Raises:
        KeyError: an id name that is not one of those three.
    """
    tokens = [(CONTEXT_IDS[name], CONTEXT_IDS[name].set(value)) for name, value in ids.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def set_ids(**ids: str | None) -> None:
    """Bind ids for the rest of the current task (a connection handler's own
    task: the ids go away with it).

    Raises:
        KeyError: an unknown id name.
    """
    for name, value in ids.items():
        CONTEXT_IDS[name].set(value)


def current_ids() -> dict[str, str]:
    """The ids bound in the current context."""
    return {name: value for name, var in CONTEXT_IDS.items() if (value := var.get())}


class StructuredFormatter(logging.Formatter):
    """Formats a record as one JSON object or one logfmt line (no newline inside).

    Args:
        fmt: ``"json"`` or ``"logfmt"``.
        log_prompts: keep conversation-text fields (debugging only).
    """

    def __init__(self, fmt: LogFormat = "logfmt", *, log_prompts: bool = False) -> None:
        super().__init__()
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r} must be one of {LOG_FORMATS}")
        self.fmt = fmt
        self.log_prompts = log_prompts

    def format(self, record: logging.LogRecord) -> str:
        fields = self.fields(record)
        if self.fmt == "json":
            return json.dumps(fields, ensure_ascii=False, default=str)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The record as an ordered mapping, ids bound and secrets redacted."""
        fields: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _scrub(record.getMessage()),
        }
        fields.update(current_ids())
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                fields[key] = self._redact(key, value)
        if record.exc_info:
            fields["exc"] = _scrub(self.formatException(record.exc_info))
        return fields

    def _redact(self, key: str, value: Any) -> Any:
        name = key.lower()
        if name in SECRET_FIELDS or name.endswith(("_key", "_token", "_secret")):
            return REDACTED
        if name in CONTENT_FIELDS and not self.log_prompts:
            return REDACTED
        return _scrub(value) if isinstance(value, str) else value


def _scrub(text: str) -> str:
    """Hide a bearer credential (header or ``bearer.<key>`` subprotocol), a
    credential in a query string and the password in a URL's user info."""
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, text)


class ClientFaultFilter(logging.Filter):
    """On ``uvicorn.error``: one client's fault becomes an INFO line without a
    traceback on ``bargein.client`` (or nothing: the app logs it), instead of
    uvicorn's ERROR with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message not in CLIENT_FAULT_LINES:
            return True
        replacement = CLIENT_FAULT_LINES[message]
        if replacement is not None:
            client_logger.info(replacement)
        return False


def quiet_client_faults() -> None:
    """Install :class:`ClientFaultFilter` on uvicorn's error logger (once)."""
    uvicorn_error = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientFaultFilter) for f in uvicorn_error.filters):
        uvicorn_error.addFilter(ClientFaultFilter())


def _logfmt_value(value: Any) -> str:
    """A logfmt value: bare when it can be, else a quoted, escaped string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not re.search(r'[\s="\\]', text):
        return text
    return json.dumps(text, ensure_ascii=False)


def configure_logging(
    *, fmt: LogFormat, level: str, log_prompts: bool = False, stream: TextIO = sys.stderr
) -> logging.Handler:
    """Send every logger's records (uvicorn's included) to one structured handler.

    Returns the handler. Call once at startup, before uvicorn runs, and run
    uvicorn with ``log_config=None`` so it keeps this setup.

    Raises:
        ValueError: an unknown format or level.
    """
    handler = logging.StreamHandler(stream)
    handler.setFormatter(StructuredFormatter(fmt, log_prompts=log_prompts))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.setLevel(logging.NOTSET)  # the root's level (uvicorn.run may set it)
        uvicorn_logger.propagate = True
    return handler
