"""``semantic_vad`` in a connection (VoiceChannel in a real Connection and
Service) with stand-in models (``tests/session/voice_fakes.py``): the
end-of-turn model's scripted scores decide where the turn ends, on the input
timeline; the settings merge, echo and refusals of ``session.update``.

The real Smart Turn model over a real socket: ``tests/app/test_voice_semantic.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from bargein.protocol import events as pe
from bargein.protocol.errors import ProtocolError
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.voice.interruption import DEFAULT_BACKCHANNELS
from tests.session.voice_fakes import (
    Client,
    FakeEndOfTurn,
    FakeModels,
    FakeSynth,
    FakeTextEndOfTurn,
    FakeTranscriber,
    FakeVad,
    done,
    silence,
    speech,
    voice_service,
    wire,
)

SEMANTIC = {
    "type": "semantic_vad",
    "eagerness": "auto",
    "interrupt_response": True,
    "create_response": True,
    "interruption": pe.InterruptionSettings(
        mode="confirm", min_words=2, backchannels=DEFAULT_BACKCHANNELS, max_pause_ms=500
    ),
}


async def client(*scores: float, config: VoiceConfig | None = None) -> Client:
    models = FakeModels(
        vad=FakeVad(),
        transcriber=FakeTranscriber("What is the capital of France?"),
        synthesizer=FakeSynth(),
        end_of_turn=FakeEndOfTurn(*scores),
    )
    service, engine, models = await voice_service(models, config=config or VoiceConfig(speculate=False))
    return Client(service, engine, models)


def detection(updated: pe.SessionUpdated) -> dict[str, Any]:
    audio = updated.session.audio
    assert audio is not None and audio.input is not None and audio.input.turn_detection is not None
    td = audio.input.turn_detection
    return {
        k: getattr(td, k) for k in pe.TurnDetectionSettings.__dataclass_fields__ if getattr(td, k) is not None
    }


async def test_a_complete_turn_ends_after_a_short_silence_scored_off_the_event_loop() -> None:
    c = await client(0.93)
    try:
        await c.voice_session(output=False, detection="semantic_vad")
        await c.audio(silence(320) + speech(640))
        # 224 ms of silence (the medium window, in whole 32 ms frames): the turn ends there,
        # with no more audio needed; server_vad's default would need 512 ms
        await c.audio(silence(224))
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)
        assert stopped.audio_end_ms == 960
        (created,) = await c.wait_for(pe.ResponseCreated)
        # the final one (a partial may come first, from the pause)
        (transcript,) = [t for t in c.of(pe.InputAudioTranscript) if t.final]
        assert (
            transcript.text == "What is the capital of France?"
            and created.input_item_id == transcript.item_id
        )
        # scored once, as the window closed: the turn from its start (20 ms) through 224 ms of silence
        assert c.models.end_of_turn.heard == [16 * (960 + 224 - 20)]
        assert all(name.startswith("voice-input") for name in c.models.end_of_turn.threads)
    finally:
        await done(c)


async def test_an_incomplete_turn_is_not_ended_by_a_pause_but_by_the_eagerness_maximum() -> None:
    c = await client(0.05)
    try:
        await c.voice_session(output=False, detection="semantic_vad", eagerness="high")
        await c.audio(silence(320) + speech(640) + silence(1920))
        await c.send(type="ping")  # handled after every append before it
        await c.wait_for(pe.Pong)
        assert not c.of(pe.InputAudioSpeechStopped)  # 1.9 s of silence: still the user's turn
        await c.audio(silence(128))  # high: at most 2 s
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)
        assert stopped.audio_end_ms == 960
        await c.wait_for(pe.ResponseCreated)
        assert len(c.models.end_of_turn.heard) == 1
    finally:
        await done(c)


async def test_a_failing_model_leaves_the_turn_to_the_longest_wait_and_the_connection_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = await client(0.9)
    c.models.end_of_turn.failures = 1
    try:
        await c.voice_session(output=False, detection="semantic_vad", eagerness="high")
        await c.audio(silence(320) + speech(640) + silence(1920))
        await c.send(type="ping")
        await c.wait_for(pe.Pong)
        assert not c.of(pe.InputAudioSpeechStopped) and not c.of(pe.ErrorEvent)  # scored 0: incomplete
        assert "scoring the end of turn" in caplog.text
        await c.audio(silence(128))
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)  # at high's longest wait, 2 s
        assert stopped.audio_end_ms == 960
        await c.audio(speech(640) + silence(320))  # the next turn is scored as usual
        await c.wait_for(pe.InputAudioSpeechStopped, 2)
    finally:
        await done(c)


async def test_a_pause_scored_incomplete_then_more_speech_is_one_turn() -> None:
    c = await client(0.1, 0.9)
    try:
        await c.voice_session(output=False, detection="semantic_vad")
        await c.audio(silence(320) + speech(640) + silence(896) + speech(320) + silence(256))
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)
        assert stopped.audio_end_ms == 320 + 640 + 896 + 320
        (committed,) = await c.wait_for(pe.InputAudioCommitted)
        assert committed.audio_start_ms == 20
        assert len(c.of(pe.InputAudioSpeechStarted)) == 1
    finally:
        await done(c)


async def test_a_turn_scored_complete_is_answered_at_its_pause_and_the_answer_adopted() -> None:
    c = await client(0.9, config=VoiceConfig(speculate=True))
    try:
        await c.voice_session(output=False, detection="semantic_vad")
        await c.audio(silence(320) + speech(640) + silence(320))
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert len(c.engine.requests) == 1  # the answer started at the pause is the one shown
        assert created.input_item_id == c.of(pe.InputAudioCommitted)[0].item_id
    finally:
        await done(c)


async def words_client(*texts: str, speculate: bool) -> Client:
    """A client whose turns are scored complete by the audio (0.9) and read
    by a text model that finds "...for" unfinished."""
    models = FakeModels(
        vad=FakeVad(),
        transcriber=FakeTranscriber(*texts),
        synthesizer=FakeSynth(),
        end_of_turn=FakeEndOfTurn(default=0.9),
        text_end_of_turn=FakeTextEndOfTurn("for"),
    )
    service, engine, models = await voice_service(models, config=VoiceConfig(speculate=speculate))
    return Client(service, engine, models)


@pytest.mark.parametrize("speculate", [False, True])
async def test_words_that_do_not_end_a_message_keep_a_turn_the_audio_calls_over_open(speculate: bool) -> None:
    """ "I'd like to book a table for" sounds finished to the audio model; its
    words keep the turn open until the next pause, and each pause's audio is
    transcribed once, whoever reads it (the score, the speculative answer,
    the partial transcript, the final transcript)."""
    c = await words_client(
        "I'd like to book a table for.", "I'd like to book a table for two.", speculate=speculate
    )
    try:
        await c.voice_session(output=False, detection="semantic_vad")
        await c.audio(silence(320) + speech(640) + silence(896))
        await c.send(type="ping")
        await c.wait_for(pe.Pong)
        assert not c.of(pe.InputAudioSpeechStopped)  # the words vetoed the audio's 0.9
        await c.audio(speech(320) + silence(256))
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)
        assert stopped.audio_end_ms == 320 + 640 + 896 + 320
        await c.wait_for(pe.ResponseCreated)
        (final,) = [t for t in c.of(pe.InputAudioTranscript) if t.final]
        assert final.text == "I'd like to book a table for two."
        assert c.models.text_end_of_turn is not None
        assert c.models.text_end_of_turn.read == [
            "I'd like to book a table for.",
            "I'd like to book a table for two.",
        ]
        assert len(c.models.transcriber.heard) == 2  # one transcription per pause
        # waiting for the words holds a thread of this connection's own, not a shared input thread
        assert all(name.startswith("voice-input-turn") for name in c.models.end_of_turn.threads)
    finally:
        await done(c)


async def test_words_that_end_a_message_end_a_turn_the_audio_calls_unfinished() -> None:
    """A flat or synthetic "What is the capital of France?" may sound
    unfinished to the audio model; its words end the turn at the pause."""
    c = await words_client("What is the capital of France?", speculate=False)
    c.models.end_of_turn.scores.append(0.1)
    try:
        await c.voice_session(output=False, detection="semantic_vad")
        await c.audio(silence(320) + speech(640) + silence(224))
        (stopped,) = await c.wait_for(pe.InputAudioSpeechStopped)
        assert stopped.audio_end_ms == 960  # at the short window, not 4 s later
        assert c.models.text_end_of_turn is not None
        assert c.models.text_end_of_turn.read == ["What is the capital of France?"]
    finally:
        await done(c)


async def test_session_updated_echoes_semantic_vad_and_a_change_of_type_keeps_the_shared_fields() -> None:
    c = await client()
    try:
        await c.voice_session(output=False, create_response=False)
        await c.send(
            type="session.update", session={"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
        )
        updated = (await c.wait_for(pe.SessionUpdated, 2))[-1]
        assert detection(updated) == {**SEMANTIC, "create_response": False}
        await c.send(
            type="session.update", session={"audio": {"input": {"turn_detection": {"eagerness": "low"}}}}
        )
        updated = (await c.wait_for(pe.SessionUpdated, 3))[-1]
        assert detection(updated) == {**SEMANTIC, "create_response": False, "eagerness": "low"}
        await c.send(
            type="session.update", session={"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
        )
        updated = (await c.wait_for(pe.SessionUpdated, 4))[-1]
        assert detection(updated) == {
            "type": "server_vad",
            "threshold": 0.5,
            "prefix_padding_ms": 300,
            "silence_duration_ms": 500,
            "interrupt_response": True,
            "create_response": False,
            "interruption": SEMANTIC["interruption"],  # carried over, as the shared fields
        }
    finally:
        await done(c)


@pytest.mark.parametrize(
    ("turn_detection", "named"),
    [
        ({"type": "semantic_vad", "eagerness": "eager"}, "eagerness"),
        ({"type": "semantic_vad", "silence_duration_ms": 300}, "silence_duration_ms"),
        ({"type": "server_vad", "eagerness": "low"}, "eagerness"),
        ({"type": "sometimes_vad"}, "type"),
    ],
)
def test_bad_turn_detection_is_invalid_parameter_naming_the_field(
    turn_detection: dict[str, Any], named: str
) -> None:
    with pytest.raises(ProtocolError) as refused:
        wire(type="session.update", session={"audio": {"input": {"turn_detection": turn_detection}}})
    assert refused.value.code is pe.ErrorCode.INVALID_PARAMETER
    assert f"turn_detection.{named}'" in refused.value.message, refused.value.message


@pytest.mark.parametrize(
    ("in_force", "turn_detection", "named"),
    [
        ("server_vad", {"eagerness": "low"}, "eagerness"),
        ("semantic_vad", {"threshold": 0.6}, "threshold"),
    ],
)
async def test_a_field_of_the_other_type_than_the_one_in_force_is_refused_and_changes_nothing(
    in_force: str, turn_detection: dict[str, Any], named: str
) -> None:
    c = await client()
    try:
        await c.voice_session(output=False, detection=in_force)
        (before,) = await c.wait_for(pe.SessionUpdated)
        audio = {"input": {"turn_detection": turn_detection}}
        await c.send(type="session.update", event_id="u", session={"audio": audio})
        (error,) = await c.wait_for(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.INVALID_PARAMETER and error.event_id == "u"
        assert f"turn_detection.{named}" in error.message, error.message
        await c.send(type="session.update", session={})
        assert (await c.wait_for(pe.SessionUpdated, 2))[-1] == before  # a refused update changes nothing
    finally:
        await done(c)
