"""Transcribing and prefilling while the user speaks, end to end: real models,
a real socket, speech made by espeak-ng.

A turn with two pauses inside it (700 ms of silence each, inside a 3 s
silence window): at each pause the server transcribes the turn so far and
shows it as a partial transcript, and prefills the conversation plus that
text into the prefix cache; the turn's response then hits those blocks.
On bargein's protocol the partials are ``input_audio.transcript`` with
``final: false``, each extending the last, before the final one; on
OpenAI's endpoint they are ``conversation.item.input_audio_transcription.delta``
events that validate against the official SDK's types and concatenate to the
last partial, with ``.completed`` carrying the final text.

The server here answers at a turn's end only (no speculative answer at a
pause: ``speculate=False``), so every pause takes the partial path.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from bargein.app.embedded import EmbeddedServer
from bargein.session.voice_runtime.config import VoiceConfig
from loadtests.bare_client import Conn
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import RATE, send_audio, until, voice_server, voice_session, voice_threads_idle
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

PARTS = (
    "I would like to book a table for four people at the Italian restaurant near the old bridge",
    "on Friday evening",
    "around half past seven please.",
)
PAUSE_MS = 700  # past pause_ms (200 ms), far short of the silence window
SILENCE_MS = 3000
SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)


@pytest.fixture(scope="module")
def server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    with voice_server(live_server, VoiceConfig(speculate=False)) as plain:
        yield plain


def speech(rate: int) -> list[bytes]:
    """The turn in three parts, each ending in a pause (the last in the silence that ends it)."""
    parts = [espeak_pcm16(text, rate) + silence_pcm16(PAUSE_MS, rate) for text in PARTS[:-1]]
    return [*parts, espeak_pcm16(PARTS[-1], rate) + silence_pcm16(SILENCE_MS + 500, rate)]


async def test_partial_transcripts_extend_one_another_before_the_final_and_prefill_the_answer(
    live_server: LiveServer, server: EmbeddedServer
) -> None:
    runtime = server.state.voice
    before = live_server.stats()
    conn = await Conn.open(server.ws_url)
    try:
        await voice_session(conn, max_tokens=8, output=False, silence_duration_ms=SILENCE_MS)
        first, second, last = speech(RATE)
        events: list[dict[str, Any]] = []
        await send_audio(conn, first)
        # the turn stays open at its pause (no more audio: no more silence
        # counted) until the pause's partial transcript arrives
        partial = await until(conn, "input_audio.transcript", events)
        assert partial["final"] is False and "table" in partial["text"].lower(), partial
        await send_audio(conn, second)
        await voice_threads_idle(runtime)  # the second pause's transcription is done
        await send_audio(conn, last)
        await until(conn, "response.done", events)
    finally:
        await conn.close()
    kinds = [e["type"] for e in events]
    transcripts = [e for e in events if e["type"] == "input_audio.transcript"]
    partials, final = transcripts[:-1], transcripts[-1]
    assert final["final"] is True and partials and not any(p["final"] for p in partials)
    committed = events[kinds.index("input_audio.committed")]
    assert {t["item_id"] for t in transcripts} == {committed["item_id"]}
    # in order, each extending the last, all before the final one
    for earlier, later in zip(partials, partials[1:], strict=False):
        assert later["text"].startswith(earlier["text"]) and len(later["text"]) > len(earlier["text"])
    assert kinds.index("input_audio.transcript") < kinds.index("input_audio.committed")
    assert "seven" in final["text"].lower() and "friday" in final["text"].lower(), final
    # the pauses prefilled the turn so far; the answer's request hit those blocks
    after = await live_server.wait_idle()
    prefilled = after.num_speculative_prefill_tokens - before.num_speculative_prefill_tokens
    used = after.num_speculative_prefill_hits - before.num_speculative_prefill_hits
    assert prefilled >= 16 and used >= 16, (prefilled, used)


async def test_the_openai_endpoint_sends_partials_as_deltas_the_sdk_validates(
    live_server: LiveServer, server: EmbeddedServer
) -> None:
    runtime = server.state.voice
    client = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="sk-test", max_retries=0)
    events: list[Any] = []

    async def read_until(kind: str) -> Any:
        while True:
            raw = await conn.recv_bytes()
            event = SERVER_EVENT.validate_json(raw)  # every event, by the SDK's own types
            events.append(event)
            if event.type == kind:
                return event

    async with client.realtime.connect(model="bargein") as conn:
        await read_until("session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "max_output_tokens": 8,
                "audio": {
                    "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": SILENCE_MS}}
                },
            }
        )
        await read_until("session.updated")
        first, second, last = speech(24000)
        step = 24000 * 2 * 40 // 1000  # 40 ms chunks
        for pcm in (first, second, last):
            for lo in range(0, len(pcm), step):
                await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[lo : lo + step]).decode())
            if pcm is first:
                delta = await read_until("conversation.item.input_audio_transcription.delta")
                assert "table" in delta.delta.lower()
            elif pcm is second:
                await voice_threads_idle(runtime)
        await read_until("response.done")
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    completed = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
    assert {d.item_id for d in deltas} == {completed.item_id}
    assert kinds.index("conversation.item.input_audio_transcription.delta") < kinds.index(
        "conversation.item.input_audio_transcription.completed"
    )
    # deltas never restate text: joined, they are the last partial, which the
    # final transcript extends unless it revised it (then .completed's text wins)
    joined = "".join(d.delta for d in deltas)
    assert all(d.delta for d in deltas) and joined.strip()
    assert "table" in joined.lower() and "seven" in completed.transcript.lower()
    words = completed.transcript.lower().split()
    assert joined.lower().split()[:3] == words[:3], (joined, completed.transcript)
