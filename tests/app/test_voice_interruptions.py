"""Confirmed interruptions end to end: real models, a real socket, speech from espeak-ng.

In ``confirm`` mode (bargein's default) speech over a spoken answer pauses
its audio; a backchannel resumes it with nothing lost or repeated (the audio
and text delivered equal an uninterrupted run of the same request), a real
interruption cuts it as an ``immediate`` barge-in does (docs/protocol.md 8.7).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from loadtests.bare_client import Conn
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import RATE, send_audio, until, voice_session
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

MAX_TOKENS = 48
STORY = [{"role": "user", "content": "Tell me a story about a dragon and a knight."}]


async def answer(conn: Conn, events: list[dict[str, Any]], response_id: str) -> None:
    await conn.send(
        type="response.create",
        response_id=response_id,
        modalities=["text", "audio"],
        max_tokens=MAX_TOKENS,
        input=STORY,
    )
    await until(conn, "response.audio.delta", events)


def delivered(events: list[dict[str, Any]], response_id: str) -> tuple[str, bytes, list[int]]:
    """The response's text, its audio bytes, and its deltas' start_ms in order."""
    mine = [e for e in events if e.get("response_id") == response_id]
    text = "".join(e["text"] for e in mine if e["type"] == "response.delta")
    deltas = [e for e in mine if e["type"] == "response.audio.delta"]
    return text, b"".join(base64.b64decode(e["audio"]) for e in deltas), [e["start_ms"] for e in deltas]


async def uninterrupted(voice_server: LiveServer) -> tuple[str, bytes]:
    conn = await Conn.open(voice_server.ws_url)
    try:
        await voice_session(conn, max_tokens=MAX_TOKENS)
        events: list[dict[str, Any]] = []
        await answer(conn, events, "ref")
        await until(conn, "response.done", events)
        text, audio, _ = delivered(events, "ref")
        return text, audio
    finally:
        await conn.close()


@pytest.mark.parametrize("said", ["Mm-hmm.", "Yeah."])
async def test_a_backchannel_over_the_answer_pauses_it_and_it_resumes_with_nothing_lost(
    voice_server: LiveServer, said: str
) -> None:
    ref_text, ref_audio = await uninterrupted(voice_server)
    conn = await Conn.open(voice_server.ws_url)
    try:
        updated = await voice_session(conn, max_tokens=MAX_TOKENS)
        interruption = updated["session"]["audio"]["input"]["turn_detection"]["interruption"]
        assert interruption["mode"] == "confirm" and interruption["min_words"] == 2
        events: list[dict[str, Any]] = []
        await answer(conn, events, "story")
        await send_audio(conn, espeak_pcm16(said, RATE) + silence_pcm16(1200, RATE))
        started = await until(conn, "input_audio.speech_started", events)
        paused = await until(conn, "response.audio.paused", events)
        at = len(events)
        resumed = await until(conn, "response.audio.resumed", events)
        # no audio of the answer while paused
        assert not [e for e in events[at:] if e["type"] == "response.audio.delta"]
        assert resumed["from_ms"] == paused["end_ms"]
        done = await until(conn, "response.done", events)
        if not any(e["type"] == "input_audio.discarded" for e in events):
            await until(conn, "input_audio.discarded", events)
        discarded = next(e for e in events if e["type"] == "input_audio.discarded")
        assert discarded["item_id"] == started["item_id"]
        # Whisper hears espeak-ng's hum as nothing at all, or as the word
        assert discarded["reason"] in ("backchannel", "no_words"), discarded
        assert done["finish_reason"] in ("stop", "length")
        # nothing lost, nothing repeated: what was delivered is the uninterrupted answer
        text, audio, starts = delivered(events, "story")
        assert text == ref_text
        assert audio == ref_audio
        assert starts == sorted(set(starts))
        # the backchannel is no turn
        kinds = [e["type"] for e in events if e.get("item_id") == started["item_id"]]
        assert "input_audio.committed" not in kinds
        assert not [e for e in events if e["type"] == "input_audio.transcript" and e["final"]]
    finally:
        await conn.close()


async def test_a_real_interruption_in_confirm_mode_cuts_the_answer_and_becomes_the_turn(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        await voice_session(conn, max_tokens=MAX_TOKENS)
        events: list[dict[str, Any]] = []
        await answer(conn, events, "story")
        await send_audio(
            conn, espeak_pcm16("Stop, tell me about dogs instead.", RATE) + silence_pcm16(1200, RATE)
        )
        started = await until(conn, "input_audio.speech_started", events)
        await until(conn, "response.audio.paused", events)
        at = len(events)
        done = await until(conn, "response.done", events)
        assert done["response_id"] == "story" and done["finish_reason"] == "interrupted"
        assert not [e for e in events[at:] if e["type"] in ("response.audio.delta", "response.audio.resumed")]
        committed = await until(conn, "input_audio.committed", events)
        assert committed["item_id"] == started["item_id"]
        transcript = await until(conn, "input_audio.transcript", events)
        assert "dog" in transcript["text"].lower(), transcript
        created = await until(conn, "response.created", events)
        assert created["input_item_id"] == started["item_id"]
        await until(conn, "response.done", events)
        stats = await voice_server.wait_idle()
        assert stats.num_running == 0
    finally:
        await conn.close()


async def test_interruption_settings_are_validated_and_echoed(voice_server: LiveServer) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        updated = await voice_session(
            conn,
            max_tokens=MAX_TOKENS,
            interruption={
                "mode": "immediate",
                "min_words": 3,
                "backchannels": ["uh huh"],
                "max_pause_ms": 800,
            },
        )
        got = updated["session"]["audio"]["input"]["turn_detection"]["interruption"]
        assert got == {"mode": "immediate", "min_words": 3, "backchannels": ["uh huh"], "max_pause_ms": 800}
        # a change of type keeps it
        await conn.send(
            type="session.update", session={"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
        )
        updated = await conn.expect("session.updated")
        assert updated["session"]["audio"]["input"]["turn_detection"]["interruption"]["min_words"] == 3
        for bad in ({"min_words": 0}, {"max_pause_ms": 50}, {"mode": "later"}, {"backchannels": [""]}):
            await conn.send(
                type="session.update",
                event_id="bad",
                session={"audio": {"input": {"turn_detection": {"interruption": bad}}}},
            )
            error = await conn.expect("error")
            assert error["event_id"] == "bad" and error["code"] in ("invalid_value", "invalid_parameter"), (
                error
            )
        await conn.send(type="ping")
        await conn.expect("pong")
    finally:
        await conn.close()
