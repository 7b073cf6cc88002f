"""The bargein v1 wire contract (docs/protocol.md), sans-I/O: frames in, events out.

Public API:
    events: every client and server event (frozen dataclasses), ``ErrorCode``,
        ``CloseCode``, ``ClientEvent`` / ``ServerEvent`` unions.
    codec: ``Decoder(fmt=..., max_frame_bytes=...).decode(frame)``,
        ``encode(event, fmt)``, ``decode_server_event(frame)``,
        ``select_subprotocol(offered)``.
    errors: ``ProtocolError`` (answer with an ``error`` event),
        ``FrameTooLarge`` (close with 1009).
"""

from bargein.protocol.codec import (
    SUBPROTOCOL_JSON,
    SUBPROTOCOL_MSGPACK,
    Decoder,
    Format,
    decode_server_event,
    encode,
    select_subprotocol,
)
from bargein.protocol.errors import FrameTooLarge, ProtocolError, ProtocolException
from bargein.protocol.events import *  # noqa: F403 - the event types are the package's vocabulary
from bargein.protocol.events import __all__ as _events_all

__all__ = [
    "SUBPROTOCOL_JSON",
    "SUBPROTOCOL_MSGPACK",
    "Decoder",
    "Format",
    "FrameTooLarge",
    "ProtocolError",
    "ProtocolException",
    "decode_server_event",
    "encode",
    "select_subprotocol",
    *_events_all,
]
