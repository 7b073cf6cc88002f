"""``semantic_vad`` end to end: the real VAD, Smart Turn and Whisper, a real socket, speech made here.

Every check is on the input timeline, not a clock: the server decides where
a turn ends from the audio alone (it scores a pause before it reads the audio
after it), so what matters is how much audio it had been sent when it ended
the turn, and where it says the speech ended (``audio_end_ms``).

- A complete question ends its turn with less silence sent after its last
  voiced sample than ``server_vad``'s 500 ms window needs: the client sends
  400 ms and nothing more.
- A sentence with a long pause in the middle ("My favorite color is" ...
  "dark green", the project's Piper voice with 900 ms cut in after "is") is
  one turn under ``semantic_vad``, two under ``server_vad`` with 500 ms.
- The OpenAI endpoint takes ``semantic_vad`` through the official SDK, whose
  types parse its ``session.updated``.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import openai
import pytest

from bargein.voice.interruption import DEFAULT_BACKCHANNELS
from loadtests.bare_client import Conn
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import RATE, send_audio, until
from tests.speech import espeak_pcm16
from tests.voice.speech import piper_speech
from tests.waiting import HANG_GUARD_S

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
# Smart Turn hears a pause after "is" as unfinished; after "I'd like to book a table for" it
# hears Piper's voice as done (a false cut-off, which loadtests/voice_bench.py counts on its set)
PAUSED, PAUSED_AFTER = "My favorite color is dark green.", "is"
LEAD_MS = 500  # silence before the speech
VOICED_DBFS = -40.0  # a sample this loud is voiced (espeak-ng's silence is digital zero)


def spoken(text: str) -> bytes:
    """``text`` spoken, without the silence espeak-ng adds around it: the
    audio ends at its last voiced sample."""
    pcm = np.frombuffer(espeak_pcm16(text, RATE), dtype="<i2")
    voiced = np.nonzero(np.abs(pcm) > 32768 * 10 ** (VOICED_DBFS / 20))[0]
    return pcm[voiced[0] : voiced[-1] + 1].tobytes()


def ms(pcm: bytes) -> int:
    return len(pcm) * 1000 // (2 * RATE)


async def session(conn: Conn, turn_detection: dict[str, Any]) -> dict[str, Any]:
    """Text answers (none created: the tests read turns only), 16 kHz in."""
    await conn.send(
        type="session.update",
        session={"audio": {"input": {"sample_rate": RATE, "turn_detection": turn_detection}, "output": None}},
    )
    return await conn.expect("session.updated")


async def all_processed(conn: Conn, events: list[dict[str, Any]]) -> None:
    """Until the server handled every append sent so far: it answers a ping
    after the events before it (collecting what came meanwhile)."""
    await conn.send(type="ping")
    await until(conn, "pong", events)


async def test_a_complete_question_ends_its_turn_before_server_vads_window_could(
    voice_server: LiveServer,
) -> None:
    question = spoken(QUESTION)
    voiced_end_ms = LEAD_MS + ms(question)
    sent_after_ms = 400  # less than server_vad's 500 ms: only the model can end the turn here
    audio = silence_pcm16(LEAD_MS, RATE) + question + silence_pcm16(sent_after_ms, RATE)
    conn = await Conn.open(voice_server.ws_url)
    try:
        updated = await session(conn, {"type": "semantic_vad", "create_response": False})
        assert updated["session"]["audio"]["input"]["turn_detection"] == {
            "type": "semantic_vad",
            "eagerness": "auto",
            "interrupt_response": True,
            "create_response": False,
            "interruption": {
                "mode": "confirm",
                "min_words": 2,
                "backchannels": list(DEFAULT_BACKCHANNELS),
                "max_pause_ms": 500,
            },
        }
        await send_audio(conn, audio)
        events: list[dict[str, Any]] = []
        # no more audio is sent: the turn ends on the 400 ms already sent, or never
        stopped = await until(conn, "input_audio.speech_stopped", events)
        # where the speech ended is where the question's voice ends (the VAD's frames are 32 ms)
        assert voiced_end_ms - 200 <= stopped["audio_end_ms"] <= voiced_end_ms + 32, (stopped, voiced_end_ms)
        assert LEAD_MS + ms(question) + sent_after_ms - stopped["audio_end_ms"] < 500
        transcript = await until(conn, "input_audio.transcript", events)
        assert "capital" in transcript["text"].lower() and "france" in transcript["text"].lower()

        # the same audio under server_vad (500 ms): the turn is still open when all of it is handled
        await session(conn, {"type": "server_vad", "silence_duration_ms": 500, "create_response": False})
        await send_audio(conn, audio)
        events = []
        await all_processed(conn, events)
        assert "input_audio.speech_started" in [e["type"] for e in events]
        assert "input_audio.speech_stopped" not in [e["type"] for e in events]
    finally:
        await conn.close()


async def turns_of(conn: Conn, audio: bytes) -> list[dict[str, Any]]:
    """The final transcripts of the turns found in ``audio`` (all of it handled)."""
    await send_audio(conn, audio)
    events: list[dict[str, Any]] = []
    await all_processed(conn, events)
    committed = [e for e in events if e["type"] == "input_audio.committed"]
    finals: list[dict[str, Any]] = [e for e in events if e["type"] == "input_audio.transcript" and e["final"]]
    while len(finals) < len(committed):  # each committed turn gets its final transcript
        event = await conn.recv()
        if event["type"] == "input_audio.transcript" and event["final"]:
            finals.append(event)
    return finals


async def test_a_long_pause_mid_sentence_is_not_cut_under_semantic_vad_but_is_under_server_vad(
    voice_server: LiveServer,
) -> None:
    pause_s = 0.9
    speech = piper_speech(
        voice_server.state.voice.models.synthesizer, PAUSED, pause_after=PAUSED_AFTER, pause_s=pause_s
    )
    audio = (
        silence_pcm16(LEAD_MS, RATE)
        + (np.clip(speech, -1, 1) * 32767).astype("<i2").tobytes()
        + silence_pcm16(4500, RATE)  # past auto's longest wait (4 s): the turn surely ends
    )
    # one connection each: both runs on one would pass the input pace's burst (10 s of audio)
    for detection, num_turns in (("semantic_vad", 1), ("server_vad", 2)):
        conn = await Conn.open(voice_server.ws_url)
        try:
            fields = {"silence_duration_ms": 500} if detection == "server_vad" else {}
            await session(conn, {"type": detection, "create_response": False, **fields})
            turns = await turns_of(conn, audio)
            assert len(turns) == num_turns, (detection, turns)  # server_vad: the pause ended a turn
            assert "color" in turns[0]["text"].lower(), turns
            assert "green" in turns[-1]["text"].lower(), turns  # semantic_vad: both halves in one transcript
        finally:
            await conn.close()


async def test_the_openai_endpoint_takes_semantic_vad_through_the_sdk(voice_server: LiveServer) -> None:
    client = openai.AsyncOpenAI(base_url=voice_server.http_url + "/v1", api_key="sk-semantic", max_retries=0)
    rate = 24000
    pcm = silence_pcm16(LEAD_MS, rate) + espeak_pcm16(QUESTION, rate) + silence_pcm16(400, rate)
    async with client.realtime.connect(model="bargein") as conn:
        created = await conn.recv()
        assert created.session.audio.input.turn_detection.type == "server_vad"  # OpenAI's default
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
            }
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        # the SDK parsed it into its own SemanticVad model
        detection = updated.session.audio.input.turn_detection
        assert type(detection).__name__ == "SemanticVad", type(detection)
        assert (detection.type, detection.eagerness) == ("semantic_vad", "high")
        assert detection.create_response is True and detection.interrupt_response is True
        # bad values are refused naming the field
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "x"}}},
            }  # type: ignore[typeddict-item]
        )
        error = await conn.recv()
        assert error.type == "error" and error.error.param == "session.audio.input.turn_detection.eagerness"
        # and a spoken question ends its turn on 400 ms of silence
        step = rate * 2 * 40 // 1000
        for lo in range(0, len(pcm), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[lo : lo + step]).decode())
        async with asyncio.timeout(HANG_GUARD_S):
            kinds = []
            async for event in conn:
                kinds.append(event.type)
                if event.type == "conversation.item.input_audio_transcription.completed":
                    assert "capital" in event.transcript.lower()
                    break
        assert "input_audio_buffer.speech_stopped" in kinds
