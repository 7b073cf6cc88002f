"""The bounds of a connection's voice turns (issue 36, items 2 and 4), with
stand-in models and engine (``tests/session/voice_fakes.py``) in a real
Connection and Service.

- a connection's share of the voice threads: at most ``max_turns`` turns
  being transcribed; a turn past it is refused with ``rate_limited`` (a
  commit keeps its audio), and an answer started at a pause that is dropped
  takes its transcription out of the threads' queue;
- a turn's audio seconds count against its principal's audio rate limit;
- a transcription that fails is a final transcript with an ``error``, logged,
  and the session goes on;
- the transcribed turns waiting for a ``response.create`` are bounded, so a
  ``response.create`` always takes them (no session can be wedged).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import Admission, AdmissionConfig
from bargein.session.voice_runtime.channel import TRANSCRIPTION_FAILED
from bargein.session.voice_runtime.config import VoiceConfig
from tests.session.test_voice_channel import client, conversation, done
from tests.session.voice_fakes import Client, silence, speech

PUSH_TO_TALK = {"audio": {"input": {"turn_detection": None}}}


async def push_to_talk(c: Client) -> None:
    await c.voice_session(output=False)
    await c.send(type="session.update", session=PUSH_TO_TALK)


@pytest.fixture
async def task_exceptions() -> Any:
    """What asyncio reports of tasks whose exception nobody retrieved."""
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    yield reported
    loop.set_exception_handler(None)


# ---- a connection's share of the voice threads (p03) ------------------------------------


async def test_the_share_is_announced_in_session_created() -> None:
    c = await client(VoiceConfig(speculate=False, max_turns=3))
    try:
        assert c.conn.created_event().limits.max_voice_turns == 3
    finally:
        await done(c)


async def test_commits_past_the_connections_share_are_refused_and_keep_their_audio() -> None:
    c = await client(texts=["One.", "Two.", "Three."])
    try:
        await push_to_talk(c)
        c.models.transcriber.gate.clear()  # both turns stay in the voice threads
        for n in range(3):
            await c.audio(speech(320))
            await c.send(type="input_audio.commit", event_id=f"commit-{n}")
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.RATE_LIMITED and error.retryable and error.event_id == "commit-2"
        assert error.retry_after_ms is not None and error.retry_after_ms >= 100
        assert "max_voice_turns" in error.message
        assert len(c.of(pe.InputAudioCommitted)) == 2
        c.models.transcriber.gate.set()
        await c.wait_for(pe.InputAudioTranscript, 2)
        await c.send(type="input_audio.commit")  # the same commit, once a turn is transcribed
        third = (await c.wait_for(pe.InputAudioCommitted, 3))[2]
        assert (third.audio_start_ms, third.audio_end_ms) == (640, 960)  # the refused commit's audio
        await c.wait_for(pe.InputAudioTranscript, 3)
        assert len(c.models.transcriber.heard) == 3
    finally:
        c.models.transcriber.gate.set()
        await done(c)


async def test_commits_of_nothing_take_no_share() -> None:
    c = await client()
    try:
        await push_to_talk(c)
        c.models.transcriber.gate.clear()  # nothing reaches it: no audio, no transcription
        for _ in range(4):
            await c.send(type="input_audio.commit")
        transcripts = await c.wait_for(pe.InputAudioTranscript, 4)
        assert [t.text for t in transcripts] == [""] * 4 and not c.of(pe.ErrorEvent)
        assert c.models.transcriber.heard == []
    finally:
        c.models.transcriber.gate.set()
        await done(c)


async def test_a_voice_turn_past_the_share_is_dropped_with_an_error() -> None:
    c = await client()
    try:
        await c.voice_session(output=False)
        c.models.transcriber.gate.clear()
        for _ in range(3):
            await c.audio(silence(320) + speech(640) + silence(800))
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.RATE_LIMITED and "was dropped" in error.message
        assert len(c.of(pe.InputAudioSpeechStopped)) == 3 and len(c.of(pe.InputAudioCommitted)) == 2
        c.models.transcriber.gate.set()
        await c.wait_for(pe.InputAudioTranscript, 2)
        await c.audio(silence(320) + speech(640) + silence(800))  # the next turn is heard
        await c.wait_for(pe.InputAudioTranscript, 3)
    finally:
        c.models.transcriber.gate.set()
        await done(c)


async def test_a_dropped_answer_at_a_pause_takes_its_transcription_out_of_the_queue() -> None:
    c = await client(VoiceConfig(speculate=True, workers=1), texts=["First.", "Second turn."])
    try:
        await c.voice_session(output=False)
        c.models.transcriber.gate.clear()
        await c.audio(silence(320) + speech(640) + silence(800))  # turn 1 holds the one thread
        await c.wait_for(pe.InputAudioCommitted)
        await c.audio(speech(640) + silence(256))  # turn 2 pauses: its speculation's job queues
        await c.audio(speech(320))  # the user goes on: the speculation is dropped
        await c.audio(silence(800))  # turn 2 ends
        await c.wait_for(pe.InputAudioCommitted, 2)
        c.models.transcriber.gate.set()
        # one voice thread takes the jobs in order: the dropped one, queued before
        # turn 2's, would have run before turn 2's transcript came
        await c.wait_for(pe.InputAudioTranscript, 2)
        assert len(c.models.transcriber.heard) == 2  # turn 1, turn 2: never the dropped job
    finally:
        c.models.transcriber.gate.set()
        await done(c)


async def test_a_turns_audio_counts_against_its_principals_audio_rate() -> None:
    c = await client()
    # 0.1 s of audio a second, 1 s held: a 1.5 s turn empties it for 15 s
    c.service.admission = Admission(AdmissionConfig(max_waiting=0, rate_limit_audio_s=0.1, burst_s=10))
    try:
        await push_to_talk(c)
        await c.audio(speech(1500))
        await c.send(type="input_audio.commit")  # more than the bucket holds, from a full one
        await c.wait_for(pe.InputAudioTranscript)
        await c.audio(speech(500))
        await c.send(type="input_audio.commit", event_id="over")
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.RATE_LIMITED and error.event_id == "over"
        assert "audio rate limit" in error.message and error.retry_after_ms is not None
        assert error.retry_after_ms > 1000
        assert len(c.of(pe.InputAudioCommitted)) == 1
    finally:
        await done(c)


# ---- a failed transcription (p09) -----------------------------------------------------


async def test_a_failed_transcription_is_reported_and_logged_and_the_session_goes_on(
    caplog: pytest.LogCaptureFixture, task_exceptions: list[dict[str, Any]]
) -> None:
    c = await client(texts=["Tell me about the moon."])
    try:
        await push_to_talk(c)
        c.models.transcriber.failures = 1
        with caplog.at_level(logging.ERROR, logger="bargein.session.voice_runtime.channel"):
            await c.audio(speech(500))
            await c.send(type="input_audio.commit")
            (failed,) = await c.wait_for(pe.InputAudioTranscript)
        committed = c.of(pe.InputAudioCommitted)[0]
        assert (failed.item_id, failed.text, failed.final) == (committed.item_id, "", True)
        assert failed.error == pe.TranscriptionError(
            code=pe.ErrorCode.INTERNAL_ERROR, message=TRANSCRIPTION_FAILED
        )
        assert [r.getMessage() for r in caplog.records] == [
            f"transcribing voice turn {committed.item_id} failed"
        ]
        await c.audio(speech(500))  # the next turn is heard and answered
        await c.send(type="input_audio.commit")
        await c.wait_for(pe.InputAudioTranscript, 2)
        await c.send(type="response.create")
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.input_item_id == c.of(pe.InputAudioCommitted)[1].item_id
        assert conversation(c) == [{"role": "user", "content": "Tell me about the moon."}]
    finally:
        await done(c)
    assert not task_exceptions


async def test_a_failed_transcription_at_a_pause_is_reported_when_the_turn_ends_there(
    task_exceptions: list[dict[str, Any]],
) -> None:
    c = await client(VoiceConfig(speculate=True))
    try:
        await c.voice_session(output=False)
        c.models.transcriber.failures = 1
        await c.audio(silence(320) + speech(640) + silence(800))
        (failed,) = await c.wait_for(pe.InputAudioTranscript)
        assert failed.error is not None and failed.item_id == c.of(pe.InputAudioCommitted)[0].item_id
        assert len(c.models.transcriber.heard) == 1  # the pause's transcription, adopted
        assert not c.engine.requests and c.conn.conversation.turns == []
        await c.audio(silence(320) + speech(640) + silence(800))
        await c.wait_for(pe.ResponseCreated)
    finally:
        await done(c)
    assert not task_exceptions


# ---- turns waiting for a response.create (p10) -------------------------------------------


async def test_waiting_turns_are_bounded_so_a_response_create_always_takes_them() -> None:
    c = await client(session=SessionConfig(max_input_items=3), texts=[f"Turn {n}." for n in range(5)])
    try:
        await push_to_talk(c)
        for n in range(5):
            await c.audio(speech(320))
            await c.send(type="input_audio.commit")
            await c.wait_for(pe.InputAudioTranscript, n + 1)
        committed = c.of(pe.InputAudioCommitted)
        dropped = await c.wait_for(pe.ErrorEvent, 2)
        assert [e.code for e in dropped] == [pe.ErrorCode.CONFLICT] * 2
        assert committed[0].item_id in dropped[0].message and committed[1].item_id in dropped[1].message
        # with input the turns would not fit: refused, saying how to go on
        await c.send(type="response.create", input=[{"role": "user", "content": "Sum up."}], event_id="in")
        (refused,) = await c.wait_for(pe.ErrorEvent, 1, lambda e: e.event_id == "in")
        assert refused.code is pe.ErrorCode.INVALID_PARAMETER and "without input" in refused.message
        await c.send(type="response.create")
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.input_item_id == committed[4].item_id
        assert conversation(c) == [{"role": "user", "content": f"Turn {n}."} for n in (2, 3, 4)]
    finally:
        await done(c)
