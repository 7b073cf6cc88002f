"""The voice loop of a connection (VoiceChannel in a real Connection and Service)
with stand-in models and engine (``tests/session/voice_fakes.py``).

The VAD hears the loud frames of ``speech()`` as speech, the transcriber
returns scripted text (when its gate opens), the synthesizer speaks 20 ms a
character; the engine is stepped by the test. What is checked is what a
client sees and what the engine is asked for: the order of events, the cut
of a barge-in, speculative answers that are adopted or leave no trace. The
real models run end to end in ``tests/app/test_voice.py``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pytest

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message, State
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.voice.audio import pcm16_to_float
from tests.session.voice_fakes import Client as VoiceClient
from tests.session.voice_fakes import (
    FakeModels,
    FakeSynth,
    FakeTranscriber,
    FakeVad,
    done,
    silence,
    speech,
    stop,
    voice_service,
)
from tests.waiting import HANG_GUARD_S, wait_until_async

NO_SPECULATION = VoiceConfig(speculate=False)
STORY = ["Once", " upon", " a", " time,", " a", " dragon", " slept.", " It", " dreamt", " of", " gold."]


async def client(config: VoiceConfig = NO_SPECULATION, **kwargs: Any) -> VoiceClient:
    models = FakeModels(
        vad=FakeVad(),
        transcriber=FakeTranscriber(*kwargs.pop("texts", ())),
        synthesizer=FakeSynth(),
    )
    service, engine, models = await voice_service(models, config=config, **kwargs)
    return VoiceClient(service, engine, models)


def kinds(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


def index(events: list[Any], kind: type, where: Any = lambda e: True) -> int:
    return next(i for i, e in enumerate(events) if isinstance(e, kind) and where(e))


def text_of(c: VoiceClient, response_id: str = "story") -> str:
    return "".join(e.text for e in c.of(pe.ResponseDelta) if e.response_id == response_id)


def conversation(c: VoiceClient, n: int = -1) -> list[dict[str, str]]:
    """The messages of the ``n``-th prompt the engine was given."""
    return c.engine.tokenizer.conversations[n]  # type: ignore[attr-defined, no-any-return]


def check_spoken_order(events: list[Any], response_id: str) -> None:
    """Audio deltas then one audio.done, all before the response's done; text_end
    never beyond the text sent."""
    mine = [e for e in events if getattr(e, "response_id", None) == response_id]
    names = kinds(mine)
    assert names.count("ResponseAudioDone") == 1, names
    audio_done = names.index("ResponseAudioDone")
    assert "ResponseAudioDelta" not in names[audio_done:], names
    assert audio_done < names.index("ResponseDone"), names
    sent, last = 0, 0
    for e in mine:
        if isinstance(e, pe.ResponseDelta):
            sent += len(e.text)
        elif isinstance(e, pe.ResponseAudioDelta):
            assert last <= e.text_end <= sent
            last = e.text_end


TURN = silence(320) + speech(640) + silence(800)


# ---- a voice turn --------------------------------------------------------------


async def test_a_voice_turn_is_committed_transcribed_then_answered_in_speech() -> None:
    c = await client(texts=["What is the capital of France?"])
    try:
        await c.voice_session()
        await c.audio(TURN)
        (created,) = await c.wait_for(pe.ResponseCreated)
        started, stopped = c.of(pe.InputAudioSpeechStarted)[0], c.of(pe.InputAudioSpeechStopped)[0]
        committed, transcript = c.of(pe.InputAudioCommitted)[0], c.of(pe.InputAudioTranscript)[0]
        assert started.audio_start_ms == 320 - 300  # the onset minus the prefix padding
        assert stopped.audio_end_ms == committed.audio_end_ms == 960
        assert committed.audio_start_ms == started.audio_start_ms
        assert transcript.item_id == committed.item_id == created.input_item_id and transcript.final
        names = kinds(c.events)
        assert (
            names.index("InputAudioSpeechStopped")
            < names.index("InputAudioCommitted")
            < names.index("InputAudioTranscript")
            < names.index("ResponseCreated")
        )
        # the turn's audio was transcribed: 640 ms of speech and the padding, at 16 kHz
        assert c.models.transcriber.heard == [16 * (960 - 20)]
        assert conversation(c)[-1] == {"role": "user", "content": "What is the capital of France?"}
        c.generate(created.stream_id, "Paris", " is", " the", " capital.", finish=FinishReason.STOP)
        await c.wait_for(pe.ResponseDone)
        check_spoken_order(c.events, created.response_id)
        audio = c.of(pe.ResponseAudioDelta)
        assert audio[-1].text_end == len("Paris is the capital.")
    finally:
        await done(c)


async def test_commit_with_detection_off_leaves_an_item_for_the_next_response_create() -> None:
    c = await client(texts=["Tell me about the moon."])
    try:
        await c.voice_session(output=False)
        await c.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        await c.audio(speech(500))
        await c.send(type="input_audio.commit")
        (transcript,) = await c.wait_for(pe.InputAudioTranscript)
        committed = c.of(pe.InputAudioCommitted)[0]
        assert (committed.audio_start_ms, committed.audio_end_ms) == (0, 500)
        assert not c.engine.requests  # push to talk: no response of its own
        await c.send(type="response.create")
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.input_item_id == committed.item_id == transcript.item_id
        assert conversation(c) == [{"role": "user", "content": "Tell me about the moon."}]
    finally:
        await done(c)


async def test_an_item_waits_for_a_response_create_that_is_accepted() -> None:
    c = await client(texts=["Tell me about the moon."])
    try:
        await c.voice_session(output=False)
        await c.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        await c.audio(speech(500))
        await c.send(type="input_audio.commit")
        await c.wait_for(pe.InputAudioTranscript)
        # refused: the item must still wait for the next one
        await c.send(type="response.create", max_tokens=10**6, event_id="big")
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.event_id == "big" and error.code is pe.ErrorCode.INVALID_PARAMETER
        await c.send(type="response.create")
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.input_item_id == c.of(pe.InputAudioCommitted)[0].item_id
        assert conversation(c) == [{"role": "user", "content": "Tell me about the moon."}]
    finally:
        await done(c)


async def test_a_commit_of_nothing_is_an_empty_transcript_and_no_item() -> None:
    c = await client(texts=[""])
    try:
        await c.voice_session(output=False)
        await c.send(type="input_audio.commit")
        (transcript,) = await c.wait_for(pe.InputAudioTranscript)
        committed = c.of(pe.InputAudioCommitted)[0]
        assert (committed.audio_start_ms, committed.audio_end_ms) == (0, 0)
        assert transcript.text == "" and transcript.item_id == committed.item_id
        await c.send(type="response.create")  # nothing to answer
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.INVALID_PARAMETER and not c.engine.requests
    finally:
        await done(c)


# ---- settings --------------------------------------------------------------------


async def test_a_refused_session_update_changes_nothing() -> None:
    c = await client()
    try:
        await c.voice_session(output=False)
        (before,) = await c.wait_for(pe.SessionUpdated)
        # audio fine, but the defaults are refused: nothing applies
        await c.send(
            type="session.update",
            event_id="u1",
            session={
                "instructions": "Be brief.",
                "defaults": {"max_tokens": 10**6},
                "audio": {"output": {}, "input": {"turn_detection": {"silence_duration_ms": 900}}},
            },
        )
        # defaults fine, but the audio is refused: nothing applies either
        await c.send(
            type="session.update",
            event_id="u2",
            session={"instructions": "Be brief.", "audio": {"output": {"voice": "nobody"}}},
        )
        errors = await c.wait_for(pe.ErrorEvent, 2)
        assert [(e.event_id, e.code) for e in errors] == [
            ("u1", pe.ErrorCode.INVALID_PARAMETER),
            ("u2", pe.ErrorCode.INVALID_PARAMETER),
        ]
        await c.send(type="session.update", session={})
        after = (await c.wait_for(pe.SessionUpdated, 2))[-1]
        assert after == before
    finally:
        await done(c)


async def test_a_rate_change_with_audio_held_is_a_conflict_until_a_clear() -> None:
    c = await client()
    try:
        await c.voice_session(output=False)
        await c.audio(silence(400))
        await c.send(
            type="session.update", event_id="r", session={"audio": {"input": {"sample_rate": 24000}}}
        )
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.CONFLICT and error.event_id == "r"
        await c.send(type="input_audio.clear")
        await c.send(type="session.update", session={"audio": {"input": {"sample_rate": 24000}}})
        updated = (await c.wait_for(pe.SessionUpdated, 2))[-1]
        assert updated.session.audio.input.sample_rate == 24000
    finally:
        await done(c)


@pytest.mark.parametrize("silence_ms", [0, 100, 200, 10000])
async def test_every_silence_duration_the_protocol_allows_is_accepted(silence_ms: int) -> None:
    c = await client(VoiceConfig(speculate=True), texts=["Hi there."])
    try:
        await c.voice_session(output=False, silence_duration_ms=silence_ms)
        assert not c.of(pe.ErrorEvent), c.of(pe.ErrorEvent)
        (updated,) = await c.wait_for(pe.SessionUpdated)
        assert updated.session.audio.input.turn_detection.silence_duration_ms == silence_ms
        if silence_ms < 800:  # TURN's silence ends the turn: answered once
            await c.audio(TURN)
            (created,) = await c.wait_for(pe.ResponseCreated)
            assert len(c.engine.requests) == 1
            assert c.of(pe.InputAudioSpeechStopped)[0].audio_end_ms == 960
    finally:
        await done(c)


async def test_the_input_bound_refuses_an_append_whole_and_the_connection_goes_on() -> None:
    c = await client(config=VoiceConfig(speculate=False, max_input_audio_ms=1000))
    try:
        await c.voice_session(output=False)
        await c.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        await c.audio(speech(600), chunk_ms=600)
        await c.conn.handle(pe.InputAudioAppend(audio=speech(600), event_id="over"))
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.INVALID_PARAMETER and error.event_id == "over"
        assert "max_input_audio_ms=1000" in error.message
        await c.send(type="ping")
        await c.wait_for(pe.Pong)
        await c.audio(speech(400), chunk_ms=400)  # up to the bound: accepted
        await c.send(type="input_audio.commit")
        (committed,) = await c.wait_for(pe.InputAudioCommitted)
        # the refused audio is not on the input timeline
        assert (committed.audio_start_ms, committed.audio_end_ms) == (0, 1000)
    finally:
        await done(c)


async def test_positions_at_24_khz_count_every_sample_appended() -> None:
    c = await client(texts=["One.", "Two."])
    try:
        await c.voice_session(output=False)
        await c.send(
            type="session.update",
            session={"audio": {"input": {"sample_rate": 24000, "turn_detection": None}}},
        )
        pcm = speech(1500)  # 24,000 samples: 1000 ms at 24 kHz, sent 40 ms at a time
        for lo in range(0, len(pcm), 1920):
            await c.conn.handle(pe.InputAudioAppend(audio=pcm[lo : lo + 1920]))
        await c.send(type="input_audio.commit")
        await c.conn.handle(pe.InputAudioAppend(audio=pcm[: 2 * 2400]))  # 100 ms, then cleared
        await c.send(type="input_audio.clear")
        await c.send(type="session.update", session={"audio": {"input": {"sample_rate": 16000}}})
        await c.audio(speech(500))
        await c.send(type="input_audio.commit")
        first, second = await c.wait_for(pe.InputAudioCommitted, 2)
        # 8.2: the position after n samples at r Hz is floor(n * 1000 / r)
        assert (first.audio_start_ms, first.audio_end_ms) == (0, 1000)
        assert (second.audio_start_ms, second.audio_end_ms) == (1100, 1600)
        assert c.models.transcriber.heard[0] == 16000  # the whole second, resampled to 16 kHz
    finally:
        await done(c)


# ---- barge-in ----------------------------------------------------------------------


async def spoken_story(c: VoiceClient, **create: Any) -> pe.ResponseCreated:
    """A spoken response with some of STORY generated and spoken."""
    await c.send(type="response.create", response_id="story", input=[{"role": "user", "content": "A story."}])
    (created,) = await c.wait_for(pe.ResponseCreated)
    c.generate(created.stream_id, *STORY[:8])
    # "Once" is spoken alone (the first word: 80 ms, one delta), then " upon a
    # time, a dragon slept." (580 ms: three deltas); " It" waits for a sentence end
    await c.wait_for(pe.ResponseAudioDelta, 4)
    return created


async def test_speech_over_a_spoken_answer_cancels_it_cut_at_the_audio_sent() -> None:
    c = await client()
    try:
        await c.voice_session(interruption={"mode": "immediate"})
        created = await spoken_story(c)
        c.models.synthesizer.gate.clear()  # the rest of the text is not spoken yet
        c.generate(created.stream_id, *STORY[8:10])
        await c.wait_until(lambda: text_of(c) == "".join(STORY[:10]), "delivered")
        await c.audio(speech(200))
        await c.wait_for(pe.InputAudioSpeechStarted)
        barge_at = index(c.events, pe.InputAudioSpeechStarted)
        assert c.engine.aborted == [(created.stream_id, FinishReason.INTERRUPTED)]
        audio = c.of(pe.ResponseAudioDelta)
        text = "".join(e.text for e in c.of(pe.ResponseDelta))
        kept = c.conn.conversation.turns[-1]
        assert kept.role == "assistant"
        # cut at the audio sent, at a word: not all the text delivered
        assert text.startswith(kept.content) and len(kept.content) < len(text)
        assert audio[-1].text_end <= len(kept.content)
        assert re.fullmatch(r"(\S+\s+)*\S+", kept.content)
        c.models.synthesizer.gate.set()
        c.generate(created.stream_id, finish=FinishReason.INTERRUPTED)
        (response_done,) = await c.wait_for(pe.ResponseDone)
        assert response_done.finish_reason == "interrupted"
        after = c.events[barge_at:]
        assert not [e for e in after if isinstance(e, pe.ResponseAudioDelta)], "audio after the barge-in"
        check_spoken_order(c.events, "story")
        # the client played less than was sent: its cancel re-cuts the turn at a word
        await c.send(type="response.cancel", response_id="story", audio_end_ms=190)
        await c.wait_for(pe.ResponseDone, 2)
        assert c.conn.conversation.turns[-1] == Message(role="assistant", content="Once upon a")
    finally:
        await done(c)


async def test_speech_too_short_to_be_a_turn_does_not_barge_in() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        # the VAD hears clicks of one 32 ms frame each: under min_speech_ms (64)
        c.models.vad.script.extend([0.9, 0.02, 0.9, 0.02, 0.02, 0.9, 0.02])
        await c.audio(silence(32 * 8))
        await c.send(type="ping")
        await c.wait_for(pe.Pong)
        assert not c.engine.aborted and not c.of(pe.InputAudioSpeechStarted)
        # probabilities hovering between the stop threshold (0.35) and the start one (0.5)
        # keep a turn going: one turn, not two
        c.models.vad.script.extend([0.9] * 5 + [0.4] * 20 + [0.9] * 5 + [0.02] * 20)
        await c.audio(silence(32 * 50))
        assert len(c.of(pe.InputAudioSpeechStarted)) == 1
        await c.wait_for(pe.InputAudioCommitted)
        assert len(c.of(pe.InputAudioSpeechStopped)) == 1
        assert c.engine.aborted == [(created.stream_id, FinishReason.INTERRUPTED)]
    finally:
        await done(c)


async def test_a_cancel_with_audio_end_ms_cuts_at_the_word_being_spoken() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        # 20 ms a character: "Once upon" ends at 180 ms, " a" is spoken at 190 ms
        await c.send(type="response.cancel", response_id="story", audio_end_ms=190)
        c.generate(created.stream_id, finish=FinishReason.INTERRUPTED)
        await c.wait_for(pe.ResponseDone)
        assert c.conn.conversation.turns[-1] == Message(role="assistant", content="Once upon a")
        # heard_chars too: the shorter cut wins
        await c.send(type="response.cancel", response_id="story", audio_end_ms=10**6, heard_chars=4)
        await c.wait_for(pe.ResponseDone, 2)
        assert c.conn.conversation.turns[-1] == Message(role="assistant", content="Once")
        check_spoken_order(c.events, "story")
    finally:
        await done(c)


async def test_a_cancel_naming_an_unknown_response_is_not_found_and_changes_nothing() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        c.generate(created.stream_id, finish=FinishReason.STOP)
        await c.wait_for(pe.ResponseDone)
        turns = list(c.conn.conversation.turns)
        await c.send(type="response.cancel", response_id="nope", audio_end_ms=2**31 - 1, event_id="x")
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.NOT_FOUND and error.event_id == "x"
        assert c.conn.conversation.turns == turns
    finally:
        await done(c)


async def test_interrupting_a_spoken_answer_with_a_response_create_keeps_what_was_spoken() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        c.models.synthesizer.gate.clear()
        c.generate(created.stream_id, *STORY[8:])
        await c.wait_until(lambda: text_of(c) == "".join(STORY), "delivered")
        spoken = c.of(pe.ResponseAudioDelta)[-1].text_end
        shorter = asyncio.create_task(
            c.send(
                type="response.create", interrupt_active=True, input=[{"role": "user", "content": "Shorter."}]
            )
        )
        await c.wait_until(lambda: c.engine.aborted, "interrupted")
        c.generate(created.stream_id, finish=FinishReason.INTERRUPTED)  # the engine's next step
        # not held up by the synthesis of the rest (whose gate outlasts this guard)
        await asyncio.wait_for(shorter, HANG_GUARD_S)
        c.models.synthesizer.gate.set()
        await c.wait_for(pe.ResponseCreated, 2)
        assistant = conversation(c)[-2]
        assert assistant["role"] == "assistant"
        text = "".join(STORY)
        # what its audio spoke (8.6), at a word: not all the text delivered
        assert spoken <= len(assistant["content"]) < len(text)
        second = index(c.events, pe.ResponseCreated, lambda e: e.response_id != "story")
        assert not [e for e in c.events[second:] if getattr(e, "response_id", None) == "story"]
        check_spoken_order(c.events, "story")
    finally:
        await done(c)


# ---- speculative answers ---------------------------------------------------------------

SPECULATE = VoiceConfig(speculate=True)


async def paused(c: VoiceClient) -> str:
    """Speech, then a pause long enough for a speculative answer; its stream id."""
    await c.audio(silence(320) + speech(640) + silence(256))
    await c.wait_until(lambda: len(c.engine.requests) == 1, "answered at the pause")
    return c.engine.requests[0].request_id


def shows(events: list[Any], stream_id: str) -> list[Any]:
    return [e for e in events if getattr(e, "stream_id", None) == stream_id]


async def after_the_lock(c: VoiceClient) -> None:
    """A ping, answered: its pong comes after all the connection did under its
    lock before it (where a speculative answer is held or shown)."""
    pongs = len(c.of(pe.Pong))
    await c.send(type="ping")
    await c.wait_for(pe.Pong, pongs + 1)


async def test_an_answer_started_at_a_pause_is_shown_when_the_turn_ends_there() -> None:
    c = await client(SPECULATE, texts=["Tell me a joke."])
    try:
        await c.voice_session()
        stream_id = await paused(c)
        c.generate(stream_id, "Why", " not?")
        await after_the_lock(c)
        assert not shows(c.events, stream_id)  # held: the turn may go on
        assert not c.of(pe.InputAudioCommitted)
        await c.audio(silence(320))  # the turn ends where the pause began
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.stream_id == stream_id
        names = kinds(c.events)
        final = index(c.events, pe.InputAudioTranscript, lambda e: e.final)
        assert (
            names.index("InputAudioSpeechStopped")
            < names.index("InputAudioCommitted")
            < final
            < names.index("ResponseCreated")
            < names.index("ResponseDelta")
        )
        # the pause's transcript was shown as a partial while the turn went on
        partial = c.of(pe.InputAudioTranscript)[0]
        assert (partial.text, partial.final) == ("Tell me a joke", False)
        assert names.index("InputAudioTranscript") < names.index("InputAudioSpeechStopped")
        committed = c.of(pe.InputAudioCommitted)[0]
        assert created.input_item_id == committed.item_id == c.events[final].item_id == partial.item_id
        c.generate(stream_id, finish=FinishReason.STOP)
        await c.wait_for(pe.ResponseDone)
        assert "".join(e.text for e in c.of(pe.ResponseDelta)) == "Why not?"
        check_spoken_order(c.events, created.response_id)
        assert len(c.engine.requests) == 1  # nothing was generated twice
    finally:
        await done(c)


async def test_a_slow_transcript_of_an_adopted_answer_still_comes_before_its_response() -> None:
    c = await client(SPECULATE, texts=["Tell me a joke."])
    try:
        await c.voice_session()
        c.models.transcriber.gate.clear()
        await c.audio(silence(320) + speech(640) + silence(600))  # pause, then the turn ends
        await c.wait_for(pe.InputAudioCommitted)
        assert not c.of(pe.InputAudioTranscript)
        c.models.transcriber.gate.set()
        await c.wait_for(pe.ResponseCreated)
        names = kinds(c.events)
        assert (
            names.index("InputAudioCommitted")
            < names.index("InputAudioTranscript")
            < names.index("ResponseCreated")
        )
        assert len(c.engine.requests) == 1 and c.models.transcriber.heard[0] > 0
    finally:
        await done(c)


@pytest.mark.parametrize("finished", [False, True])
async def test_an_answer_started_at_a_pause_leaves_no_trace_when_the_user_goes_on(finished: bool) -> None:
    c = await client(SPECULATE, texts=["Tell me", "Tell me a joke."])
    try:
        await c.voice_session()
        speculative = await paused(c)
        c.generate(speculative, "Sure", finish=FinishReason.STOP if finished else None)

        async def generated() -> bool:
            info = await c.service.log.info(speculative)
            return info is not None and info.end == 1 and (info.finish is not None) == finished

        await wait_until_async(generated, "the answer's token (and end) in the log")
        if finished:
            await c.wait_until(
                lambda: c.conn.conversation.state is not State.GENERATING, "its end to reach the session"
            )
        await c.audio(speech(320))  # the user goes on
        if not finished:
            assert c.engine.aborted == [(speculative, FinishReason.CANCELLED)]
            assert c.engine.kept_tokens == [3]  # the prompt's KV alone; nothing of its text
            c.generate(speculative, finish=FinishReason.CANCELLED)
        assert c.conn.conversation.turns == []  # its user item left the conversation
        await c.audio(silence(600))
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert created.stream_id != speculative
        assert conversation(c) == [{"role": "user", "content": "Tell me a joke."}]
        await after_the_lock(c)
        assert not shows(c.events, speculative)  # no event of it ever reached the client
        assert len(c.of(pe.InputAudioCommitted)) == 1
    finally:
        await done(c)


@pytest.mark.parametrize("ending", ["clear", "commit", "detection off"])
async def test_a_turn_ended_by_the_client_during_a_pause_drops_the_answer_started_there(ending: str) -> None:
    c = await client(SPECULATE, texts=["Tell me", "Tell me more."])
    try:
        await c.voice_session()
        speculative = await paused(c)
        if ending == "clear":  # the turn in progress is dropped
            await c.send(type="input_audio.clear")
        elif ending == "commit":  # the turn ends now, with all its audio
            await c.send(type="input_audio.commit")
        else:  # the detector that found the turn is gone
            await c.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        assert c.engine.aborted == [(speculative, FinishReason.CANCELLED)]
        c.generate(speculative, "Sure", finish=FinishReason.CANCELLED)
        await c.audio(silence(600))
        await c.send(type="ping")
        await c.wait_for(pe.Pong)
        assert not shows(c.events, speculative)
        if ending == "commit":
            (created,) = await c.wait_for(pe.ResponseCreated)
            assert conversation(c) == [{"role": "user", "content": "Tell me more."}]
            assert created.input_item_id == c.of(pe.InputAudioCommitted)[0].item_id
            return
        assert c.conn.conversation.turns == [] and not c.of(pe.InputAudioCommitted)
        # the next response is not refused over an answer the client never saw
        await c.send(type="response.create", input=[{"role": "user", "content": "Hi."}])
        await c.wait_for(pe.ResponseCreated)
        assert conversation(c) == [{"role": "user", "content": "Hi."}]
    finally:
        await done(c)


async def test_a_disconnect_during_a_pause_cancels_the_answer_started_there() -> None:
    c = await client(SPECULATE, texts=["Tell me"])
    try:
        await c.voice_session()
        speculative = await paused(c)
        await c.close()  # on_disconnect "continue" keeps the answers the client saw, not this one
        assert c.engine.aborted == [(speculative, FinishReason.CANCELLED)]
    finally:
        await stop(c.service)


async def test_a_disconnect_while_the_answer_at_a_pause_is_submitted_closes_cleanly() -> None:
    c = await client(SPECULATE, texts=["Tell me"])
    template = c.engine.tokenizer
    try:
        await c.voice_session()
        template.gate.clear()  # type: ignore[attr-defined]
        await c.audio(silence(320) + speech(640) + silence(256))
        await c.wait_until(lambda: template.conversations, "submitting")  # type: ignore[attr-defined]
        await asyncio.wait_for(c.close(), HANG_GUARD_S)
        # close() waited for the connection's voice tasks: none is left to go on submitting
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("speculate-", "turn-"))]
        template.gate.set()  # type: ignore[attr-defined]
        await c.wait_until(lambda: template.rendered, "the render to return")  # type: ignore[attr-defined]
        assert not c.engine.requests and not c.engine.aborted  # nothing reached the engine
    finally:
        template.gate.set()  # type: ignore[attr-defined]
        await stop(c.service)


# ---- the lock between a voice turn and the client's events -----------------------------


async def test_a_client_response_create_does_not_take_a_voice_turns_item_id() -> None:
    c = await client(texts=["Tell me a joke."])
    try:
        await c.voice_session(output=False, interrupt_response=False)
        c.models.transcriber.gate.clear()
        await c.audio(TURN)
        await c.wait_for(pe.InputAudioCommitted)
        async with c.conn._lock:  # an event being handled: both wait behind it
            typed = asyncio.create_task(
                c.conn.handle(
                    pe.ResponseCreate(response_id="typed", input=(pe.InputItem(role="user", content="Hi."),))
                )
            )
            await c.wait_until(
                lambda: waiting_for(c.conn._lock) == 1, "the typed create to wait for the lock"
            )
            c.models.transcriber.gate.set()
            await c.wait_for(pe.InputAudioTranscript)
            await c.wait_until(lambda: waiting_for(c.conn._lock) == 2, "the voice turn to wait behind it")
        await typed
        created = {e.response_id: e for e in await c.wait_for(pe.ResponseCreated)}
        assert created["typed"].input_item_id is None
    finally:
        await done(c)


def waiting_for(lock: asyncio.Lock) -> int:
    """How many tasks wait to take ``lock`` (asyncio keeps them in ``_waiters``)."""
    return len(lock._waiters or ())  # type: ignore[attr-defined]


# ---- resume and disconnects ------------------------------------------------------------


def audio_events(events: list[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, (pe.ResponseAudioDelta, pe.ResponseAudioDone))]


async def resume(c: VoiceClient, created: pe.ResponseCreated, **fields: Any) -> list[Any]:
    """The events of a stream.resume of ``created`` from 0, until its response.done."""
    before = len(c.events)
    await c.send(
        type="stream.resume",
        stream_id=created.stream_id,
        resume_token=created.resume_token,
        **{"from": 0},
        **fields,
    )
    await c.wait_until(lambda: any(isinstance(e, pe.ResponseDone) for e in c.events[before:]), "resumed")
    return c.events[before:]


async def test_a_resume_with_audio_from_ms_of_a_text_stream_has_no_audio() -> None:
    c = await client()
    try:
        await c.voice_session()
        await c.send(
            type="response.create",
            modalities=["text"],
            response_id="t",
            input=[{"role": "user", "content": "Hi."}],
        )
        (created,) = await c.wait_for(pe.ResponseCreated)
        c.generate(created.stream_id, "Hello", " there.", finish=FinishReason.STOP)
        await c.wait_for(pe.ResponseDone)
        assert not audio_events(c.events)
        for from_ms in (0, 500):  # 8.8: ignored for a stream that was not spoken
            assert not audio_events(await resume(c, created, audio_from_ms=from_ms))
        other = VoiceClient(c.service, c.engine, c.models)  # a text-only connection
        replay = await resume(other, created, audio_from_ms=0)
        assert "".join(e.text for e in replay if isinstance(e, pe.ResponseDelta)) == "Hello there."
        await other.close()
    finally:
        await done(c)


async def test_an_interrupted_answer_the_engine_does_not_end_in_time_ends_with_an_error() -> None:
    """A loaded engine that has not ended the interrupted answer when the next
    one's announcement can wait no longer: that answer's delivery stops, and
    its client is told so (an ``error`` naming it) instead of waiting for a
    ``response.done`` that will not come (issue 38's turn without an end)."""
    c = await client(session=SessionConfig(drain_timeout_s=0.05))  # the wait itself is what is tested
    try:
        await c.voice_session()
        await spoken_story(c)
        create = {"type": "response.create", "response_id": "next", "interrupt_active": True}
        sending = asyncio.create_task(c.send(**create, input=[{"role": "user", "content": "Shorter."}]))
        # the engine never ends "story" (its next step does not come)
        (created,) = await c.wait_for(pe.ResponseCreated, where=lambda e: e.response_id == "next")
        await asyncio.wait_for(sending, HANG_GUARD_S)
        (error,) = c.of(pe.ErrorEvent) or [None]
        assert error is not None, "the stopped answer ended in silence"
        error_at = c.events.index(error)
        assert error.code is pe.ErrorCode.OVERLOADED and error.retryable and error.response_id == "story"
        assert error_at < c.events.index(created)
        after = c.events[error_at + 1 :]
        assert not [e for e in after if getattr(e, "response_id", None) == "story"], "story after its error"
    finally:
        await done(c)


async def test_a_resume_without_audio_from_ms_has_no_audio_events() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        c.generate(created.stream_id, finish=FinishReason.STOP)
        await c.wait_for(pe.ResponseDone)
        spoken = [(e.start_ms, e.end_ms, e.text_end) for e in c.of(pe.ResponseAudioDelta)]
        assert not audio_events(await resume(c, created))  # as an older client expects
        other = VoiceClient(c.service, c.engine, c.models)
        await other.voice_session()  # even where the session speaks
        assert not audio_events(await resume(other, created))
        again = [
            e for e in await resume(other, created, audio_from_ms=0) if isinstance(e, pe.ResponseAudioDelta)
        ]
        assert [(e.start_ms, e.end_ms, e.text_end) for e in again] == spoken
        await other.close()
    finally:
        await done(c)


async def test_a_disconnect_while_a_turn_is_transcribed_submits_nothing() -> None:
    c = await client()
    try:
        await c.voice_session()
        c.models.transcriber.gate.clear()
        await c.audio(TURN)
        await c.wait_for(pe.InputAudioCommitted)
        await asyncio.wait_for(c.conn.close(), HANG_GUARD_S)
        # close() waited for the connection's voice tasks: none is left to submit or send
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("turn-", "speak-"))]
        sent = len(c.events)
        c.models.transcriber.gate.set()
        await c.wait_until(lambda: c.models.transcriber.finished, "the transcription to return")
        assert not c.engine.requests and len(c.events) == sent
    finally:
        await stop(c.service)


async def test_a_disconnect_while_an_answer_is_spoken_stops_its_delivery() -> None:
    c = await client()
    try:
        await c.voice_session()
        created = await spoken_story(c)
        c.models.synthesizer.gate.clear()
        c.generate(created.stream_id, *STORY[8:], finish=FinishReason.STOP)
        await c.wait_until(lambda: text_of(c) == "".join(STORY), "delivered")
        # used to wait for the synthesis (whose gate outlasts this guard)
        await asyncio.wait_for(c.conn.close(), HANG_GUARD_S)
        # close() waited for the connection's tasks: none is left to send
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("deliver-", "speak-"))]
        sent = len(c.events)
        c.models.synthesizer.gate.set()
        await c.wait_until(lambda: c.models.synthesizer.finished, "the synthesis to return")
        assert len(c.events) == sent
    finally:
        await stop(c.service)


def test_fakes_are_what_the_tests_say() -> None:
    vad = FakeVad().stream()
    assert vad.probability(pcm16_to_float(speech(32))) > 0.5 > vad.probability(pcm16_to_float(silence(32)))
    assert SessionConfig().max_tokens >= 64
    s = FakeSynth().synthesize("ab cd")
    assert len(s.audio) == 5 * 480 and [w.char_end for w in s.words] == [2, 5]
    assert np.all(s.audio != 0)
