"""What the voice tests over a real socket share: audio in chunks, a voice
session's settings, reading events up to a kind, the metrics page."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.session.voice_runtime.runtime import VoiceRuntime
from loadtests.bare_client import Conn
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer
from tests.waiting import HANG_GUARD_S

RATE = 16000
CHUNK_MS = 40


@contextlib.contextmanager
def voice_server(
    live_server: LiveServer,
    config: VoiceConfig,
    admission: AdmissionConfig | None = None,
    *,
    max_tokens: int = 64,
) -> Iterator[EmbeddedServer]:
    """A second server on live_server's engine and voice models with voice
    settings ``config``, answers of at most ``max_tokens`` (short by default)
    and ``admission`` (default: the library's); the test is skipped (failed
    in CI) without the voice stack."""
    if live_server.state.voice is None:
        from tests.needs import missing

        missing("the voice stack is not installed (make install)")
    voice = VoiceRuntime(live_server.state.voice.models, config)
    server = EmbeddedServer(
        Settings(
            session=SessionConfig(
                max_tokens=max_tokens, default_max_tokens=32, max_frame_bytes=MAX_FRAME_BYTES
            ),
            # debug endpoints: the service keeps its recent requests for the tests to read
            server=ServerConfig(port=0, log_level="warning", debug_endpoints=True),
            admission=admission or AdmissionConfig(),
        ),
        runner=live_server.state.runner,
        voice=voice,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        voice.close()


async def voice_threads_idle(runtime: VoiceRuntime) -> None:
    """Until every voice thread finished what it was running (a transcription
    whose connection is gone, say): each thread takes one of as many jobs as
    there are threads, and the jobs wait for one another, so they all run only
    once every thread is free; what those threads finished reached the loop first."""
    barrier = threading.Barrier(runtime.config.workers)
    await asyncio.gather(
        *(runtime.run(lambda: barrier.wait(HANG_GUARD_S)) for _ in range(runtime.config.workers))
    )


async def send_audio(conn: Conn, pcm: bytes, *, rate: int = RATE, pace_s: float = 0.0) -> None:
    """``pcm`` (PCM16 at ``rate``) as ``input_audio.append`` events of CHUNK_MS
    each, ``pace_s`` apart (0: as fast as the socket takes them)."""
    step = rate * 2 * CHUNK_MS // 1000
    for lo in range(0, len(pcm), step):
        await conn.send(type="input_audio.append", audio=base64.b64encode(pcm[lo : lo + step]).decode())
        if pace_s:
            await asyncio.sleep(pace_s)


async def voice_session(
    conn: Conn, *, max_tokens: int, output: bool = True, **turn_detection: Any
) -> dict[str, Any]:
    """Greedy answers of ``max_tokens``, server VAD (with ``turn_detection``'s
    fields) at RATE, spoken at 24 kHz unless ``output`` is False; returns
    the ``session.updated``."""
    await conn.send(
        type="session.update",
        session={
            "defaults": {"temperature": 0, "max_tokens": max_tokens},
            "audio": {
                "input": {"sample_rate": RATE, "turn_detection": {"type": "server_vad", **turn_detection}},
                "output": {"sample_rate": 24000} if output else None,
            },
        },
    )
    return await conn.expect("session.updated")


async def until(conn: Conn, kind: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Read events into ``events`` up to the first of ``kind``; return that one."""
    while True:
        event = await conn.recv()
        events.append(event)
        if event["type"] == kind:
            return event


def metrics_text(server: LiveServer) -> str:
    """The server's ``/metrics`` page (blocking: call it in a thread)."""
    return httpx.get(f"{server.http_url}/metrics", timeout=10).text
