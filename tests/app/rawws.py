"""A WebSocket client on a plain socket, for clients that misbehave on purpose.

Enough of RFC 6455 to open a connection and send small text frames; it never
reads unless asked, never answers pings and never sends a close frame: what a
client that vanished, or one that stopped reading, looks like to the server.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any

TEXT, CLOSE = 0x1, 0x8  # frame opcodes


def raw_upgrade(port: int, *, key: str | None = None, rcvbuf: int | None = None) -> socket.socket:
    """Open ``/v1/realtime`` on ``127.0.0.1:port``; return the socket after the 101.

    ``rcvbuf``: ``SO_RCVBUF`` bytes, set before connecting (a small window).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    nonce = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(
        (
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\n"
            f"{auth}\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)  # byte by byte: leave the first frame unread
    assert head.startswith(b"HTTP/1.1 101"), head[:80]
    return sock


def masked_text(payload: bytes) -> bytes:
    """One masked client text frame (any length: 7-, 16- or 64-bit length field)."""
    mask = os.urandom(4)
    # XOR through one big integer: a per-byte loop is slow on frames of 100s of KB
    repeated = (mask * (len(payload) // 4 + 1))[: len(payload)]
    body = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")
    if len(payload) < 126:
        return bytes([0x81, 0x80 | len(payload)]) + mask + body
    if len(payload) < 65536:
        return bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + body
    return bytes([0x81, 0x80 | 127]) + len(payload).to_bytes(8, "big") + mask + body


class ServerFrames:
    """The server's frames off a raw socket, in order (unmasked, unfragmented:
    what bargein sends). Reads only when asked, so a test decides when the
    client drains its receive buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def frame(self) -> tuple[int, bytes]:
        """The next frame as ``(opcode, payload)``.

        Raises EOFError when the server closed the socket first.
        """
        while (frame := self._parse()) is None:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the server closed the socket")
            self._buf += chunk
        return frame

    def event(self) -> dict[str, Any]:
        """The next text frame, decoded (pings skipped).

        Raises ConnectionError naming the code of a close frame; EOFError at EOF.
        """
        while True:
            opcode, payload = self.frame()
            if opcode == TEXT:
                event: dict[str, Any] = json.loads(payload)
                return event
            if opcode == CLOSE:
                raise ConnectionError(f"closed with {int.from_bytes(payload[:2], 'big')}")

    def _parse(self) -> tuple[int, bytes] | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        opcode, length, start = buf[0] & 0x0F, buf[1] & 0x7F, 2
        if length >= 126:
            start = 4 if length == 126 else 10
            if len(buf) < start:
                return None
            length = int.from_bytes(buf[2:start], "big")
        if len(buf) < start + length:
            return None
        payload = bytes(buf[start : start + length])
        del buf[: start + length]
        return opcode, payload
