"""The voice loop end to end: real models, a real socket, speech made by espeak-ng.

A voice turn is speech synthesized here by Debian's espeak-ng, sent as
``input_audio.append`` in 40 ms chunks (faster than real time: every offset
is counted from samples, so the server's turns do not depend on the pace);
the server finds the turn with its VAD, transcribes it, answers in text and
audio, and cuts a barge-in's turn at the audio the client says it heard.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from loadtests.bare_client import Conn
from loadtests.speech import noise_pcm16, silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import CHUNK_MS, RATE, metrics_text, send_audio, until, voice_session
from tests.speech import espeak_pcm16
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MAX_TOKENS = 48
QUESTION = "What is the capital of France?"


def turn(text: str) -> bytes:
    return silence_pcm16(500, RATE) + espeak_pcm16(text, RATE) + silence_pcm16(1200, RATE)


async def test_a_spoken_question_is_heard_transcribed_and_answered_in_speech(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        updated = await voice_session(conn, max_tokens=MAX_TOKENS)
        assert updated["session"]["audio"]["output"]["sample_rate"] == 24000
        assert conn.created["limits"]["max_input_audio_ms"] > 0
        await send_audio(conn, turn(QUESTION))
        events: list[dict[str, Any]] = []
        done = await until(conn, "response.done", events)
        kinds = [e["type"] for e in events]
        started = events[kinds.index("input_audio.speech_started")]
        stopped = events[kinds.index("input_audio.speech_stopped")]
        committed = events[kinds.index("input_audio.committed")]
        transcript = events[kinds.index("input_audio.transcript")]
        created = events[kinds.index("response.created")]
        # the speech starts after the 500 ms of silence, minus the prefix padding
        assert 0 <= started["audio_start_ms"] <= 500
        assert stopped["audio_end_ms"] > started["audio_start_ms"] + 500
        assert committed["audio_end_ms"] == stopped["audio_end_ms"]
        words = transcript["text"].lower()
        assert "capital" in words and "france" in words, transcript
        assert transcript["final"] is True and transcript["item_id"] == committed["item_id"]
        assert created["input_item_id"] == committed["item_id"]
        text = "".join(e["text"] for e in events if e["type"] == "response.delta")
        audio = [e for e in events if e["type"] == "response.audio.delta"]
        assert text and audio
        # audio of the text, in order, never ahead of the text sent
        sent = 0
        last_end, last_text_end = 0, 0
        for event in events:
            if event["type"] == "response.delta":
                sent += len(event["text"])
            elif event["type"] == "response.audio.delta":
                assert event["start_ms"] == last_end
                assert event["end_ms"] > event["start_ms"]
                assert last_text_end <= event["text_end"] <= sent
                # 24 kHz PCM16: 48 bytes a millisecond (each end rounded down to a ms)
                assert (
                    abs(len(base64.b64decode(event["audio"])) / 48 - (event["end_ms"] - event["start_ms"]))
                    < 1
                )
                last_end, last_text_end = event["end_ms"], event["text_end"]
        assert last_text_end >= len(text.rstrip()) - 1  # the whole answer was spoken
        audio_done = events[kinds.index("response.audio.done")]
        assert kinds.index("response.audio.done") > max(
            i for i, k in enumerate(kinds) if k == "response.audio.delta"
        )
        assert audio_done["end_ms"] == last_end
        assert done["finish_reason"] in ("stop", "length")
    finally:
        await conn.close()


async def test_speaking_over_the_answer_interrupts_it_and_cuts_the_turn_at_what_was_heard(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        # immediate: speech interrupts at once (confirm mode: test_voice_interruptions.py)
        await voice_session(conn, max_tokens=MAX_TOKENS, interruption={"mode": "immediate"})
        await conn.send(
            type="response.create",
            response_id="story",
            modalities=["text", "audio"],
            max_tokens=64,
            input=[{"role": "user", "content": "Tell me a long story about a dragon and a knight."}],
        )
        events: list[dict[str, Any]] = []
        await until(conn, "response.audio.delta", events)
        # the user talks over it
        await send_audio(conn, espeak_pcm16("Stop, stop please.", RATE))
        await until(conn, "input_audio.speech_started", events)
        barge_at = len(events)
        done = await until(conn, "response.done", events)
        assert done["finish_reason"] == "interrupted"
        after = events[barge_at:]
        assert not [e for e in after if e["type"] == "response.audio.delta"], "audio after the barge-in"
        assert [e["type"] for e in after if e["type"].startswith("response.audio")] == ["response.audio.done"]
        stats = await voice_server.wait_idle()
        assert stats.num_running == 0
        # The client played 1.2 s of the answer: the turn is cut there, at a word.
        text = "".join(e["text"] for e in events if e["type"] == "response.delta")
        audio = [e for e in events if e["type"] == "response.audio.delta"]
        heard_ms = min(1200, audio[-1]["end_ms"])
        await conn.send(type="response.cancel", response_id="story", audio_end_ms=heard_ms)
        await until(conn, "response.done", events)
        # let the spoken "stop" turn end; its answer's prompt holds the cut turn
        await send_audio(conn, silence_pcm16(1500, RATE))
        await until(conn, "response.created", events)
        prompt = voice_server.tokenizer.decode(voice_server.recent_requests()[-1].prompt_token_ids)
        kept = prompt.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0]
        spoken_by = max([e["text_end"] for e in audio if e["end_ms"] <= heard_ms], default=0)
        spoken_through = next((e["text_end"] for e in audio if e["end_ms"] > heard_ms), audio[-1]["text_end"])
        assert text.startswith(kept)
        assert len(kept) < len(text)  # cut, not all that was generated
        assert len(kept.rstrip()) >= len(text[:spoken_by].rstrip())
        # at a word boundary at most one word past what was spoken by heard_ms
        assert len(kept.split()) <= len(text[:spoken_through].split()) + 1
        # the words of "stop" made it a real barge-in, not a false one (a cough)
        metrics = (await asyncio.to_thread(metrics_text, voice_server)).splitlines()
        real = next(m for m in metrics if m.startswith('bargein_voice_barge_ins_total{outcome="real"}'))
        assert float(real.split()[-1]) >= 1
        await until(conn, "response.done", events)
    finally:
        await conn.close()


@pytest.mark.parametrize("sound", ["silence", "noise"])
async def test_silence_and_quiet_noise_do_not_barge_in(voice_server: LiveServer, sound: str) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        await voice_session(conn, max_tokens=MAX_TOKENS)
        await conn.send(
            type="response.create",
            modalities=["text", "audio"],
            max_tokens=24,
            input=[{"role": "user", "content": "Say something about the sea."}],
        )
        events: list[dict[str, Any]] = []
        await until(conn, "response.created", events)
        pcm = silence_pcm16(2000, RATE) if sound == "silence" else noise_pcm16(2000, RATE, dbfs=-40.0)
        await send_audio(conn, pcm)
        done = await until(conn, "response.done", events)
        assert done["finish_reason"] in ("stop", "length")
        assert not [e for e in events if e["type"].startswith("input_audio.")]
    finally:
        await conn.close()


async def test_bad_audio_is_refused_and_the_connection_goes_on(voice_server: LiveServer) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        await conn.send(type="input_audio.append", audio=base64.b64encode(b"\x00\x01\x02").decode())
        error = await conn.expect("error")
        assert error["code"] == "invalid_parameter"
        # without server VAD nothing ends a turn: the buffer stops at its bound
        await conn.send(
            type="session.update", session={"audio": {"input": {"sample_rate": RATE, "turn_detection": None}}}
        )
        await conn.expect("session.updated")
        limit_ms = conn.created["limits"]["max_input_audio_ms"]
        second = silence_pcm16(1000, RATE)
        refused = None
        for _ in range(limit_ms // 1000 + 2):
            await conn.send(type="input_audio.append", audio=base64.b64encode(second).decode(), event_id="a")
            await asyncio.sleep(0.25)  # 4x real time: the pace a connection's input audio may keep
        await conn.send(type="ping")
        while (event := await conn.recv())["type"] != "pong":
            if event["type"] == "error":
                refused = event
        assert refused is not None and refused["code"] == "invalid_parameter"
        assert str(limit_ms) in refused["message"]
        await conn.send(type="input_audio.clear")
        await conn.send(type="input_audio.append", audio=base64.b64encode(second).decode())
        await conn.send(type="ping")
        assert (await conn.recv())["type"] == "pong"  # accepted again after the clear
    finally:
        await conn.close()


async def test_push_to_talk_commit_and_a_resume_re_derives_the_same_audio(voice_server: LiveServer) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        await voice_session(conn, max_tokens=MAX_TOKENS)
        await conn.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        await conn.expect("session.updated")
        await send_audio(conn, espeak_pcm16("Tell me about the moon.", RATE))
        await conn.send(type="input_audio.commit")
        events: list[dict[str, Any]] = []
        transcript = await until(conn, "input_audio.transcript", events)
        assert "moon" in transcript["text"].lower()
        # push to talk: the client asks for the answer
        await conn.send(type="response.create", modalities=["text", "audio"])
        created = await until(conn, "response.created", events)
        await until(conn, "response.done", events)
        audio = [e for e in events if e["type"] == "response.audio.delta"]
        assert audio
    finally:
        await conn.close()
    again = await Conn.open(voice_server.ws_url)
    try:
        from_ms = audio[len(audio) // 2]["start_ms"]
        await again.send(
            type="stream.resume",
            stream_id=created["stream_id"],
            resume_token=created["resume_token"],
            audio_from_ms=from_ms,
            **{"from": 0},
        )
        replay: list[dict[str, Any]] = []
        await until(again, "response.done", replay)
        replayed = [e for e in replay if e["type"] == "response.audio.delta"]
        assert replayed[0]["start_ms"] == from_ms
        # the same timeline and alignment from there on
        original = [(e["start_ms"], e["end_ms"], e["text_end"]) for e in audio if e["start_ms"] >= from_ms]
        assert [(e["start_ms"], e["end_ms"], e["text_end"]) for e in replayed] == original
    finally:
        await again.close()


def test_speech_helpers_make_what_they_say() -> None:
    pcm = espeak_pcm16("hello there", RATE)
    x = np.frombuffer(pcm, dtype=np.int16)
    assert 0.3 * RATE < len(x) < 3 * RATE and np.abs(x).max() > 1000
    noise = np.frombuffer(noise_pcm16(1000, RATE, dbfs=-40.0), dtype=np.int16).astype(np.float64) / 32768
    assert abs(20 * np.log10(np.sqrt(np.mean(noise**2))) + 40) < 1.0


async def test_an_answer_started_at_a_pause_is_dropped_unseen_when_the_user_goes_on(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        # a long silence window, so the pause outlasts transcription and submit
        await voice_session(conn, max_tokens=MAX_TOKENS, silence_duration_ms=6000)
        # by id: recent_requests keeps the last 256 only, so its length stops growing
        before = {r.request_id for r in voice_server.recent_requests()}
        await send_audio(conn, espeak_pcm16("Tell me about", RATE))
        # A pause: well past pause_ms (200 ms) of silence, far short of the 6 s
        # window. The turn's silence is counted in audio, not on a clock: with no
        # more audio sent meanwhile, it stays a pause however long the answer takes.
        await send_audio(conn, silence_pcm16(1000, RATE), pace_s=CHUNK_MS / 1000)
        speculative = await wait_until(
            lambda: [r for r in voice_server.recent_requests() if r.request_id not in before],
            "an answer started at the pause",
        )
        assert len(speculative) == 1  # answered at the pause, out of the client's sight
        await send_audio(conn, espeak_pcm16("the planet Mars.", RATE) + silence_pcm16(6200, RATE))
        events: list[dict[str, Any]] = []
        await until(conn, "response.done", events)
        kinds = [e["type"] for e in events]
        assert kinds.count("response.created") == 1 and kinds.count("input_audio.committed") == 1
        transcripts = [e for e in events if e["type"] == "input_audio.transcript"]
        # the pause's transcript was shown as a partial; the final one holds the whole turn
        assert [t["final"] for t in transcripts][-1] is True and "mars" in transcripts[-1]["text"].lower()
        final = voice_server.recent_requests()[-1]
        assert final.request_id != speculative[0].request_id
        prompt = voice_server.tokenizer.decode(final.prompt_token_ids)
        assert prompt.count("<|im_start|>user") == 1  # the dropped turn left the conversation
        stats = await voice_server.wait_idle()
        assert stats.num_running == 0  # the speculative request was aborted, its blocks freed
        metrics = (await asyncio.to_thread(metrics_text, voice_server)).splitlines()
        assert any(
            line.startswith('bargein_voice_speculations_total{outcome="dropped"}')
            and float(line.split()[-1]) >= 1
            for line in metrics
        )
    finally:
        await conn.close()


async def test_a_resumed_voice_session_gets_its_audio_settings_back(voice_server: LiveServer) -> None:
    """A voice session that reconnects comes back with its rate, voice and
    turn detection: session.resumed, then session.updated with the audio
    settings it had (a new connection starts with the server's defaults)."""
    first = await Conn.open(voice_server.ws_url)
    updated = await voice_session(first, max_tokens=MAX_TOKENS, silence_duration_ms=700)
    await first.create("Hi.", temperature=0, max_tokens=2)
    await until(first, "response.done", [])
    await first.close()
    conn = await Conn.open(voice_server.ws_url)
    try:
        session = {"session_id": first.created["session_id"], "session_token": first.created["session_token"]}
        await conn.send(type="session.resume", **session)
        assert (await conn.expect("session.resumed"))["turns"] == 2
        restored = await conn.expect("session.updated")
        assert restored["session"]["audio"] == updated["session"]["audio"]
        assert restored["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 700
        await conn.send(type="ping")
        assert (await conn.recv())["type"] == "pong"  # nothing else came
    finally:
        await conn.close()
