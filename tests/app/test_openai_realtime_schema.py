"""The OpenAI Realtime translation alone (no server): the dispatch rule, and
client events mapped onto bargein's, or refused naming the field."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from bargein.app.openai.realtime.endpoint import wants_openai
from bargein.app.openai.realtime.inbound import Inbound, OpenAISession, RealtimeError
from bargein.app.openai.realtime.outbound import Translator
from bargein.protocol import events as pe


def inbound(has_voice: bool = True, active: str | None = None) -> Inbound:
    return Inbound(
        OpenAISession(audio_output=has_voice),
        has_voice=has_voice,
        active_response_id=lambda: active,
        voices=("joe",),
    )


@pytest.mark.parametrize(
    ("subprotocols", "query", "openai"),
    [
        ([], b"model=bargein", True),  # the SDKs
        (["realtime", "openai-insecure-api-key.k"], b"", True),  # browser clients
        (["bargein.v1.json"], b"model=x", False),  # bargein's client naming a model
        ([], b"", False),  # bargein's default
        (["bearer.k"], b"", False),
    ],
)
def test_the_dispatch_rule(subprotocols: list[str], query: bytes, openai: bool) -> None:
    assert wants_openai({"subprotocols": subprotocols, "query_string": query}) is openai


def test_session_update_maps_onto_bargeins_settings() -> None:
    side = inbound()
    _, (event,) = side.translate(
        {
            "type": "session.update",
            "event_id": "u1",
            "session": {
                "type": "realtime",
                "instructions": "Be brief.",
                "output_modalities": ["text"],
                "max_output_tokens": 40,
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
                    }
                },
            },
        }
    )
    assert isinstance(event, pe.SessionUpdate) and event.event_id == "u1"
    assert event.session.instructions == "Be brief."
    assert event.session.defaults == pe.SamplingDefaults(max_tokens=40)
    audio = event.session.audio
    assert audio is not None and audio.output == pe.AUDIO_OUTPUT_OFF
    assert audio.input == pe.AudioInputSettings(
        sample_rate=24000, turn_detection=pe.TurnDetectionSettings(type="server_vad", silence_duration_ms=300)
    )
    assert side.session.audio_output is False and side.session.max_output_tokens == 40
    # later responses take the session's max_output_tokens
    _, (create,) = side.translate({"type": "response.create"})
    assert isinstance(create, pe.ResponseCreate) and create.max_tokens == 40


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        (
            {"type": "session.update", "session": {"tools": [{"type": "function"}]}},
            "unsupported",
            "session.tools",
        ),
        (
            {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}},
            "unsupported",
            "session.audio.input.format.type",
        ),
        (
            {
                "type": "session.update",
                "session": {"audio": {"input": {"turn_detection": {"type": "magic_vad"}}}},
            },
            "invalid_value",
            "session.audio.input.turn_detection.type",
        ),
        (
            {
                "type": "session.update",
                "session": {
                    "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}
                },
            },
            "invalid_value",
            "session.audio.input.turn_detection.eagerness",
        ),
        (
            {
                "type": "session.update",
                "session": {
                    "audio": {
                        "input": {"turn_detection": {"type": "semantic_vad", "silence_duration_ms": 300}}
                    }
                },
            },
            "unknown_parameter",
            "session.audio.input.turn_detection.silence_duration_ms",
        ),
        (
            {"type": "response.create", "response": {"conversation": "none"}},
            "unsupported",
            "response.conversation",
        ),
        ({"type": "response.create", "response": {"input": []}}, "unsupported", "response.input"),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -1},
            "invalid_value",
            "audio_end_ms",
        ),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_value", "audio"),
        ({"type": "response.cancel"}, "response_cancel_not_active", None),
        ({"type": "transcription_session.update"}, "unknown_event", "type"),
        ({"event_id": "x"}, "missing_required_parameter", "type"),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(
    event: dict[str, object], code: str, param: str | None
) -> None:
    with pytest.raises(RealtimeError) as refused:
        inbound().translate(event)
    assert (refused.value.code, refused.value.param) == (code, param)


def test_semantic_vad_maps_onto_bargeins_settings() -> None:
    _, (event,) = inbound().translate(
        {
            "type": "session.update",
            "session": {
                "audio": {
                    "input": {
                        "turn_detection": {
                            "type": "semantic_vad",
                            "eagerness": "high",
                            "create_response": False,
                        }
                    }
                }
            },
        }
    )
    assert isinstance(event, pe.SessionUpdate) and event.session.audio is not None
    assert event.session.audio.input == pe.AudioInputSettings(
        turn_detection=pe.TurnDetectionSettings(type="semantic_vad", eagerness="high", create_response=False)
    )


def test_audio_events_need_the_voice_pipeline() -> None:
    with pytest.raises(RealtimeError) as refused:
        inbound(has_voice=False).translate({"type": "input_audio_buffer.commit"})
    assert refused.value.code == "unsupported"
    with pytest.raises(RealtimeError):
        inbound(has_voice=False).translate(
            {"type": "session.update", "session": {"output_modalities": ["audio"]}}
        )


def test_openai_voice_names_take_the_servers_voice() -> None:
    _, (event,) = inbound().translate(
        {"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}}
    )
    assert event.session.audio.output == pe.AudioOutputSettings(sample_rate=24000)
    _, (event,) = inbound().translate(
        {"type": "session.update", "session": {"audio": {"output": {"voice": "joe"}}}}
    )
    assert event.session.audio.output.voice == "joe"


def test_a_failed_transcription_is_openais_failed_event_and_the_item_leaves() -> None:
    """A final transcript with an ``error`` (issue 36, p09): OpenAI's
    ``conversation.item.input_audio_transcription.failed``, then the item
    announced at the commit is deleted; both fit the SDK's schema."""
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    translator.translate(pe.InputAudioCommitted(item_id="item_1", audio_start_ms=0, audio_end_ms=900))
    error = pe.TranscriptionError(code=pe.ErrorCode.INTERNAL_ERROR, message="transcription failed")
    failed, deleted = translator.translate(
        pe.InputAudioTranscript(item_id="item_1", text="", final=True, error=error)
    )
    assert failed["type"] == "conversation.item.input_audio_transcription.failed"
    assert (failed["item_id"], failed["content_index"]) == ("item_1", 0)
    assert failed["error"] == {
        "type": "server_error",
        "code": "internal_error",
        "message": "transcription failed",
        "param": None,
    }
    assert deleted["type"] == "conversation.item.deleted" and deleted["item_id"] == "item_1"
    for event in (failed, deleted):
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python(event)


def test_partial_transcripts_are_deltas_that_never_restate_text() -> None:
    """bargein's partials (the whole text so far) become OpenAI's
    ``input_audio_transcription.delta`` events: each only what extends the
    text sent, none for a revision, and ``.completed`` carries the final
    text; every event fits the SDK's schema."""
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)

    def partial(text: str) -> list[dict[str, Any]]:
        return translator.translate(pe.InputAudioTranscript(item_id="item_1", text=text, final=False))

    (first,) = partial("Book a table")
    (second,) = partial("Book a table for two")
    assert partial("Book a table for two") == [] and partial("Look, a table") == []
    assert [first["delta"], second["delta"]] == ["Book a table", " for two"]
    assert first["type"] == "conversation.item.input_audio_transcription.delta"
    assert (first["item_id"], first["content_index"]) == ("item_1", 0)
    translator.translate(pe.InputAudioCommitted(item_id="item_1", audio_start_ms=0, audio_end_ms=900))
    completed, _ = translator.translate(
        pe.InputAudioTranscript(item_id="item_1", text="Book a table for two at seven.", final=True)
    )
    assert completed["transcript"] == "Book a table for two at seven."
    for event in (first, second, completed):
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python(event)
