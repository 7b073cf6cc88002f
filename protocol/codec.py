"""Frames <-> events for the v1 protocol, sans-I/O: no sockets, no asyncio, no clock.

Server side::

    fmt, subprotocol, bearer_key = select_subprotocol(scope["subprotocols"])
    decoder = Decoder(fmt=fmt, max_frame_bytes=limits.max_frame_bytes)
    try:
        event = decoder.decode(frame)        # str for a text frame, bytes for binary
    except FrameTooLarge:
        ...close with CloseCode.MESSAGE_TOO_BIG
    except ProtocolError as e:
        ...send encode(e.to_event(), fmt); the connection stays open
    ...send encode(server_event, fmt)

Client side: ``encode(client_event, fmt)`` and ``decode_server_event(frame)``.

Frame kinds. The subprotocol fixes the encoding: on ``bargein.v1.json`` every
frame is a text frame (``str``), on ``bargein.v1.msgpack`` a binary frame
(``bytes``). A frame of the other kind is ``invalid_message``, also when a
binary frame happens to hold UTF-8 JSON. Invalid UTF-8 in a text frame never
reaches the codec: the WebSocket layer (websockets, uvicorn) closes with 1007
before the app sees a ``str``. Strings that cannot be UTF-8 encoded (lone
surrogates written as JSON escapes) are ``invalid_message``.

Audio bytes (``input_audio.append.audio``, ``response.audio.delta.audio``) are
a base64 string in JSON frames (standard alphabet, padded, canonical: 4/3 of
the bytes, so a 1 MiB frame carries about 786 KB of audio, 16 s of 24 kHz
pcm16) and ``bin`` in msgpack frames. Anything else in their place, a
base64 string in a msgpack frame included, is ``invalid_message``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import msgpack

from bargein.protocol import _rules, _wire
from bargein.protocol.errors import FrameTooLarge, ProtocolError
from bargein.protocol.events import CLIENT_EVENTS, SERVER_EVENTS, ClientEvent, ErrorCode, ServerEvent

Format: TypeAlias = Literal["json", "msgpack"]

SUBPROTOCOL_JSON = "bargein.v1.json"
SUBPROTOCOL_MSGPACK = "bargein.v1.msgpack"
BEARER_PREFIX = "bearer."
DEFAULT_MAX_FRAME_BYTES = 1 << 20

_SUBPROTOCOL_FORMATS: dict[str, Format] = {SUBPROTOCOL_JSON: "json", SUBPROTOCOL_MSGPACK: "msgpack"}


def select_subprotocol(offered: Sequence[str]) -> tuple[Format, str | None, str | None]:
    """Pick the encoding from the subprotocols a client offered.

    The first bargein subprotocol in the client's order wins; with none, JSON
    and no subprotocol echoed. An offered ``bearer.<key>`` carries an API key
    for browsers that cannot set headers; it is returned, never chosen (so
    never echoed). Other offers are ignored.

    Args:
        offered: the ``Sec-WebSocket-Protocol`` values, in the client's order.

    Returns:
        ``(fmt, subprotocol to echo or None, bearer key or None)``; the key is
        the text after ``bearer.`` of the first such offer (possibly empty).
    """
    chosen = next((p for p in offered if p in _SUBPROTOCOL_FORMATS), None)
    key = next((p[len(BEARER_PREFIX) :] for p in offered if p.startswith(BEARER_PREFIX)), None)
    return (_SUBPROTOCOL_FORMATS[chosen] if chosen else "json"), chosen, key


def encode(event: ClientEvent | ServerEvent, fmt: Format) -> str | bytes:
    """The frame of an event: JSON text (``str``) or msgpack binary (``bytes``).

    ``type`` comes first, then the fields in declaration order; optional
    fields that are ``None`` are left out.

    Raises:
        ValueError: an unknown ``fmt``; or, in JSON, a float field holding
            NaN or infinity (the decoder refuses those in both encodings).
    """
    wire = _wire.to_wire(event, bytes_as_base64=fmt == "json")
    if fmt == "json":
        return json.dumps(wire, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if fmt == "msgpack":
        return msgpack.packb(wire, use_bin_type=True)
    raise ValueError(f"{fmt=} must be 'json' or 'msgpack'")


class Decoder:
    """Turns one client frame into a validated client event.

    Args:
        fmt: the encoding negotiated for the connection.
        max_frame_bytes: largest frame accepted, in bytes (UTF-8 bytes for
            text), as announced in ``session.created``.
    """

    def __init__(self, *, fmt: Format = "json", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if fmt not in ("json", "msgpack"):
            raise ValueError(f"{fmt=} must be 'json' or 'msgpack'")
        if max_frame_bytes < 1:
            raise ValueError(f"{max_frame_bytes=} must be >= 1")
        self.fmt = fmt
        self.max_frame_bytes = max_frame_bytes

    def decode(self, frame: bytes | str) -> ClientEvent:
        """Decode and validate one frame.

        Raises:
            FrameTooLarge: the frame is over ``max_frame_bytes`` (close 1009).
            ProtocolError: ``invalid_message`` (wrong frame kind, undecodable,
                not a map, missing or mistyped field), ``unknown_type``, or
                ``invalid_parameter`` (a value breaks a rule); ``event_id`` is
                set when the frame's own ``event_id`` could be read.
        """
        size = _frame_size(frame, self.max_frame_bytes)
        if size > self.max_frame_bytes:
            raise FrameTooLarge(size, self.max_frame_bytes)
        obj = _parse(frame, self.fmt)
        event_id = _read_event_id(obj)
        try:
            cls = CLIENT_EVENTS.get(_read_type(obj))
            if cls is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown event type {obj['type']!r}")
            event = _wire.from_wire(cls, obj, bytes_as_base64=self.fmt == "json")
            _rules.check_rules(event)
        except ProtocolError as e:
            e.event_id = event_id
            raise
        return event


def decode_server_event(frame: bytes | str) -> ServerEvent:
    """Decode one server frame (for clients and tests); types are checked.

    The frame kind gives the encoding: ``str`` is JSON, ``bytes`` msgpack.

    Raises:
        ProtocolError: ``invalid_message`` or ``unknown_type`` (a client may
            skip events of types newer than it knows).
    """
    fmt: Format = "json" if isinstance(frame, str) else "msgpack"
    obj = _parse(frame, fmt)
    cls = SERVER_EVENTS.get(_read_type(obj))
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown event type {obj['type']!r}")
    return _wire.from_wire(cls, obj, bytes_as_base64=fmt == "json")


def _frame_size(frame: bytes | str, limit: int) -> int:
    if isinstance(frame, bytes | bytearray | memoryview):
        return len(frame)
    if len(frame) * 4 <= limit:  # UTF-8 takes at most 4 bytes a character
        return len(frame)
    return len(frame.encode("utf-8", "surrogatepass"))


def _parse(frame: Any, fmt: Format) -> dict[Any, Any]:
    """The top-level map of a frame; ``invalid_message`` otherwise."""
    if fmt == "json":
        if not isinstance(frame, str):
            raise _invalid("binary frame on a JSON connection: send JSON as text frames")
        obj = _load_json(frame)
    else:
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise _invalid("text frame on a msgpack connection: send msgpack as binary frames")
        obj = _load_msgpack(bytes(frame))
    if not isinstance(obj, dict):
        raise _invalid("an event must be a map")
    return obj


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise _invalid("frame is not valid JSON") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _load_msgpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException):
        raise _invalid("frame is not valid msgpack") from None


def _read_type(obj: dict[Any, Any]) -> str:
    event_type = obj.get("type")
    if not isinstance(event_type, str):
        raise _invalid("missing field 'type' (a string)")
    return event_type


def _read_event_id(obj: dict[Any, Any]) -> str | None:
    """The frame's ``event_id`` if valid (to echo in errors); raises if it is not."""
    event_id = obj.get("event_id")
    if event_id is None:
        return None
    _wire.convert(str, event_id, "event_id", bytes_as_base64=False)
    _rules.check_event_id(event_id)
    return event_id


def _invalid(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_MESSAGE, message)
