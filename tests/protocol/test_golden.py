"""Golden frames: every event's exact wire form, written by hand from PROTOCOL.md.

JSON frames must match byte for byte (compact, ``type`` first, fields in the
order of PROTOCOL.md's tables, ``None`` optionals left out); msgpack frames
must equal the same map packed by msgpack itself, with audio as ``bin``
where the JSON frame has base64.

``CLIENT_GOLDEN`` and ``SERVER_GOLDEN`` are the frames of the text protocol,
as they were before audio: they must still encode and decode exactly so.
``*_AUDIO_GOLDEN`` are the frames of the audio additions.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgpack
import pytest

from bargein.protocol import Decoder, decode_server_event, encode
from bargein.protocol import events as ev

CLIENT_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.SessionUpdate(
            session=ev.SessionSettings(
                instructions="Be brief.",
                defaults=ev.SamplingDefaults(max_tokens=64, temperature=0.7, stop=("\n\n",)),
                on_disconnect="cancel",
                include_token_ids=True,
            ),
            event_id="e1",
        ),
        '{"type":"session.update","session":{"instructions":"Be brief.","defaults":{"max_tokens":64,'
        '"temperature":0.7,"stop":["\\n\\n"]},"on_disconnect":"cancel","include_token_ids":true},"event_id":"e1"}',
    ),
    (ev.SessionUpdate(session=ev.SessionSettings()), '{"type":"session.update","session":{}}'),
    (
        ev.ResponseCreate(
            response_id="r1",
            input=(ev.InputItem(role="user", content="Bonjour, ça va ? 👋"),),
            max_tokens=32,
            temperature=0.0,
            top_p=0.9,
            top_k=40,
            seed=7,
            stop=("User:",),
            interrupt_active=True,
            event_id="e2",
        ),
        '{"type":"response.create","response_id":"r1","input":[{"role":"user","content":"Bonjour, ça va ? 👋"}],'
        '"max_tokens":32,"temperature":0.0,"top_p":0.9,"top_k":40,"seed":7,"stop":["User:"],'
        '"interrupt_active":true,"event_id":"e2"}',
    ),
    (ev.ResponseCreate(), '{"type":"response.create"}'),
    (
        ev.ResponseCancel(response_id="r1", heard_chars=12, audio_end_ms=1500),
        '{"type":"response.cancel","response_id":"r1","heard_chars":12,"audio_end_ms":1500}',
    ),
    (
        ev.StreamResume(stream_id="s1", resume_token="tok", from_=17),
        '{"type":"stream.resume","stream_id":"s1","resume_token":"tok","from":17}',
    ),
    (
        ev.SessionResume(session_id="sess", session_token="st"),
        '{"type":"session.resume","session_id":"sess","session_token":"st"}',
    ),
    (ev.Ping(event_id="p"), '{"type":"ping","event_id":"p"}'),
]

SERVER_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.SessionCreated(
            session_id="sess",
            session_token="st",
            model="SmolLM2-135M-Instruct",
            limits=ev.Limits(
                max_frame_bytes=65536, max_prompt_tokens=1536, max_tokens=512, max_context_tokens=2048
            ),
        ),
        '{"type":"session.created","session_id":"sess","session_token":"st","model":"SmolLM2-135M-Instruct",'
        '"limits":{"max_frame_bytes":65536,"max_prompt_tokens":1536,"max_tokens":512,"max_context_tokens":2048},'
        '"protocol":"bargein.v1"}',
    ),
    (
        ev.SessionCreated(
            session_id="sess",
            session_token="st",
            model="SmolLM2-135M-Instruct",
            limits=ev.Limits(
                max_frame_bytes=65536,
                max_prompt_tokens=1536,
                max_tokens=512,
                max_context_tokens=2048,
                max_conversation_bytes=4194304,
            ),
        ),
        '{"type":"session.created","session_id":"sess","session_token":"st","model":"SmolLM2-135M-Instruct",'
        '"limits":{"max_frame_bytes":65536,"max_prompt_tokens":1536,"max_tokens":512,"max_context_tokens":2048,'
        '"max_conversation_bytes":4194304},"protocol":"bargein.v1"}',
    ),
    (
        ev.SessionUpdated(
            session=ev.SessionSettings(instructions="", on_disconnect="continue", include_token_ids=False)
        ),
        '{"type":"session.updated","session":{"instructions":"","on_disconnect":"continue","include_token_ids":false}}',
    ),
    (
        ev.SessionResumed(session_id="sess", turns=3, active=None),
        '{"type":"session.resumed","session_id":"sess","turns":3,"active":null}',
    ),
    (
        ev.SessionResumed(
            session_id="sess",
            turns=4,
            active=ev.ActiveStream(response_id="r1", stream_id="s1", resume_token="tok", end=9),
        ),
        '{"type":"session.resumed","session_id":"sess","turns":4,'
        '"active":{"response_id":"r1","stream_id":"s1","resume_token":"tok","end":9}}',
    ),
    (
        ev.ResponseCreated(response_id="r1", stream_id="s1", resume_token="tok"),
        '{"type":"response.created","response_id":"r1","stream_id":"s1","resume_token":"tok"}',
    ),
    (
        ev.ResponseDelta(response_id="r1", stream_id="s1", start=0, end=3, text="日本語"),
        '{"type":"response.delta","response_id":"r1","stream_id":"s1","start":0,"end":3,"text":"日本語"}',
    ),
    (
        ev.ResponseDelta(
            response_id="r1", stream_id="s1", start=3, end=5, text=" 🎉", token_ids=(15107, 232)
        ),
        '{"type":"response.delta","response_id":"r1","stream_id":"s1","start":3,"end":5,"text":" 🎉",'
        '"token_ids":[15107,232]}',
    ),
    (
        ev.ResponseDone(
            response_id="r1",
            stream_id="s1",
            end=5,
            finish_reason="interrupted",
            usage=ev.Usage(prompt_tokens=20, completion_tokens=5, cached_tokens=16),
        ),
        '{"type":"response.done","response_id":"r1","stream_id":"s1","end":5,"finish_reason":"interrupted",'
        '"usage":{"prompt_tokens":20,"completion_tokens":5,"cached_tokens":16}}',
    ),
    (
        ev.StreamResumed(stream_id="s1", response_id="r1", from_=3, status="live"),
        '{"type":"stream.resumed","stream_id":"s1","response_id":"r1","from":3,"status":"live"}',
    ),
    (
        ev.ErrorEvent(code=ev.ErrorCode.OVERLOADED, message="try later", retryable=True, retry_after_ms=250),
        '{"type":"error","code":"overloaded","message":"try later","retryable":true,"retry_after_ms":250}',
    ),
    (
        ev.ErrorEvent(
            code=ev.ErrorCode.NOT_FOUND,
            message="no such response",
            retryable=False,
            event_id="e9",
            response_id="r7",
        ),
        '{"type":"error","code":"not_found","message":"no such response","retryable":false,"event_id":"e9",'
        '"response_id":"r7"}',
    ),
    (ev.Pong(), '{"type":"pong"}'),
]


# 4 samples of pcm16: 0, 1, -1, 32767 (base64 "AAABAP///38=", "/" included).
PCM = b"\x00\x00\x01\x00\xff\xff\xff\x7f"
AUDIO_ON = ev.AudioSettings(
    input=ev.AudioInputSettings(
        sample_rate=24000,
        turn_detection=ev.TurnDetectionSettings(
            type="server_vad",
            threshold=0.5,
            prefix_padding_ms=300,
            silence_duration_ms=500,
            interrupt_response=True,
            create_response=True,
        ),
    ),
    output=ev.AudioOutputSettings(sample_rate=24000, voice="amy"),
)
AUDIO_ON_WIRE = (
    '{"input":{"sample_rate":24000,"turn_detection":{"type":"server_vad","threshold":0.5,"prefix_padding_ms":300,'
    '"silence_duration_ms":500,"interrupt_response":true,"create_response":true}},'
    '"output":{"sample_rate":24000,"voice":"amy"}}'
)

CLIENT_AUDIO_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.SessionUpdate(
            session=ev.SessionSettings(
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(
                        sample_rate=16000,
                        turn_detection=ev.TurnDetectionSettings(
                            type="server_vad",
                            threshold=0.6,
                            prefix_padding_ms=200,
                            silence_duration_ms=700,
                            interrupt_response=True,
                            create_response=False,
                        ),
                    ),
                    output=ev.AudioOutputSettings(sample_rate=24000, voice="amy"),
                )
            ),
            event_id="e3",
        ),
        '{"type":"session.update","session":{"audio":{"input":{"sample_rate":16000,"turn_detection":'
        '{"type":"server_vad","threshold":0.6,"prefix_padding_ms":200,"silence_duration_ms":700,'
        '"interrupt_response":true,"create_response":false}},"output":{"sample_rate":24000,"voice":"amy"}}},'
        '"event_id":"e3"}',
    ),
    (  # detection off and text only: the two meaningful nulls
        ev.SessionUpdate(
            session=ev.SessionSettings(
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(turn_detection=ev.TURN_DETECTION_OFF),
                    output=ev.AUDIO_OUTPUT_OFF,
                )
            )
        ),
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":null},"output":null}}}',
    ),
    (  # a partial update: one field of turn detection; output on with the defaults
        ev.SessionUpdate(
            session=ev.SessionSettings(
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(
                        turn_detection=ev.TurnDetectionSettings(silence_duration_ms=800)
                    ),
                    output=ev.AudioOutputSettings(),
                )
            )
        ),
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"silence_duration_ms":800}},'
        '"output":{}}}}',
    ),
    (  # semantic_vad: a turn ends when the end-of-turn model hears the user done
        ev.SessionUpdate(
            session=ev.SessionSettings(
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(
                        turn_detection=ev.TurnDetectionSettings(type="semantic_vad", eagerness="high")
                    )
                )
            )
        ),
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"type":"semantic_vad",'
        '"eagerness":"high"}}}}}',
    ),
    (
        ev.InputAudioAppend(audio=PCM, event_id="a1"),
        '{"type":"input_audio.append","audio":"AAABAP///38=","event_id":"a1"}',
    ),
    (ev.InputAudioAppend(audio=b""), '{"type":"input_audio.append","audio":""}'),
    (ev.InputAudioCommit(event_id="c1"), '{"type":"input_audio.commit","event_id":"c1"}'),
    (ev.InputAudioClear(), '{"type":"input_audio.clear"}'),
    (
        ev.ResponseCreate(response_id="r2", modalities=("text", "audio"), interrupt_active=True),
        '{"type":"response.create","response_id":"r2","interrupt_active":true,"modalities":["text","audio"]}',
    ),
    (ev.ResponseCreate(modalities=("text",)), '{"type":"response.create","modalities":["text"]}'),
    (
        ev.StreamResume(stream_id="s1", resume_token="tok", from_=17, audio_from_ms=2300, event_id="e4"),
        '{"type":"stream.resume","stream_id":"s1","resume_token":"tok","from":17,"audio_from_ms":2300,'
        '"event_id":"e4"}',
    ),
]

SERVER_AUDIO_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.SessionCreated(
            session_id="sess",
            session_token="st",
            model="SmolLM2-135M-Instruct",
            limits=ev.Limits(
                max_frame_bytes=1048576,
                max_prompt_tokens=2047,
                max_tokens=1024,
                max_context_tokens=2048,
                max_input_audio_ms=60000,
            ),
        ),
        '{"type":"session.created","session_id":"sess","session_token":"st","model":"SmolLM2-135M-Instruct",'
        '"limits":{"max_frame_bytes":1048576,"max_prompt_tokens":2047,"max_tokens":1024,"max_context_tokens":2048,'
        '"max_input_audio_ms":60000},"protocol":"bargein.v1"}',
    ),
    (
        ev.SessionUpdated(
            session=ev.SessionSettings(
                defaults=ev.SamplingDefaults(),
                on_disconnect="continue",
                include_token_ids=False,
                audio=AUDIO_ON,
            )
        ),
        '{"type":"session.updated","session":{"defaults":{},"on_disconnect":"continue","include_token_ids":false,'
        f'"audio":{AUDIO_ON_WIRE}}}}}',
    ),
    (  # complete settings with detection off and text only
        ev.SessionUpdated(
            session=ev.SessionSettings(
                on_disconnect="cancel",
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(sample_rate=16000, turn_detection=ev.TURN_DETECTION_OFF),
                    output=ev.AUDIO_OUTPUT_OFF,
                ),
            )
        ),
        '{"type":"session.updated","session":{"on_disconnect":"cancel","audio":{"input":{"sample_rate":16000,'
        '"turn_detection":null},"output":null}}}',
    ),
    (  # semantic_vad in force: its four fields
        ev.SessionUpdated(
            session=ev.SessionSettings(
                audio=ev.AudioSettings(
                    input=ev.AudioInputSettings(
                        sample_rate=16000,
                        turn_detection=ev.TurnDetectionSettings(
                            type="semantic_vad",
                            interrupt_response=True,
                            create_response=True,
                            eagerness="auto",
                        ),
                    ),
                    output=ev.AUDIO_OUTPUT_OFF,
                ),
            )
        ),
        '{"type":"session.updated","session":{"audio":{"input":{"sample_rate":16000,"turn_detection":'
        '{"type":"semantic_vad","interrupt_response":true,"create_response":true,"eagerness":"auto"}},'
        '"output":null}}}',
    ),
    (
        ev.ResponseCreated(response_id="r1", stream_id="s1", resume_token="tok", input_item_id="item_1"),
        '{"type":"response.created","response_id":"r1","stream_id":"s1","resume_token":"tok","input_item_id":"item_1"}',
    ),
    (
        ev.InputAudioSpeechStarted(audio_start_ms=1200, item_id="item_1"),
        '{"type":"input_audio.speech_started","audio_start_ms":1200,"item_id":"item_1"}',
    ),
    (
        ev.InputAudioSpeechStarted(audio_start_ms=0),
        '{"type":"input_audio.speech_started","audio_start_ms":0}',
    ),
    (
        ev.InputAudioSpeechStopped(audio_end_ms=2950, item_id="item_1"),
        '{"type":"input_audio.speech_stopped","audio_end_ms":2950,"item_id":"item_1"}',
    ),
    (
        ev.InputAudioCommitted(item_id="item_1", audio_start_ms=1200, audio_end_ms=2950),
        '{"type":"input_audio.committed","item_id":"item_1","audio_start_ms":1200,"audio_end_ms":2950}',
    ),
    (
        ev.InputAudioTranscript(item_id="item_1", text="What is the", final=False),
        '{"type":"input_audio.transcript","item_id":"item_1","text":"What is the","final":false}',
    ),
    (
        ev.InputAudioTranscript(item_id="item_1", text="What is the capital of France?", final=True),
        '{"type":"input_audio.transcript","item_id":"item_1","text":"What is the capital of France?","final":true}',
    ),
    (
        ev.InputAudioTranscript(
            item_id="item_2",
            text="",
            final=True,
            error=ev.TranscriptionError(code=ev.ErrorCode.INTERNAL_ERROR, message="transcription failed"),
        ),
        '{"type":"input_audio.transcript","item_id":"item_2","text":"","final":true,'
        '"error":{"code":"internal_error","message":"transcription failed"}}',
    ),
    (
        ev.ResponseAudioDelta(
            response_id="r1", stream_id="s1", audio=PCM, start_ms=480, end_ms=480, text_end=6
        ),
        '{"type":"response.audio.delta","response_id":"r1","stream_id":"s1","audio":"AAABAP///38=","start_ms":480,'
        '"end_ms":480,"text_end":6}',
    ),
    (
        ev.ResponseAudioDone(response_id="r1", stream_id="s1", end_ms=1730),
        '{"type":"response.audio.done","response_id":"r1","stream_id":"s1","end_ms":1730}',
    ),
    (
        ev.ResponseAudioPaused(response_id="r1", stream_id="s1", end_ms=2400),
        '{"type":"response.audio.paused","response_id":"r1","stream_id":"s1","end_ms":2400}',
    ),
    (
        ev.ResponseAudioResumed(response_id="r1", stream_id="s1", from_ms=2400),
        '{"type":"response.audio.resumed","response_id":"r1","stream_id":"s1","from_ms":2400}',
    ),
    (
        ev.InputAudioDiscarded(item_id="item_2", reason="backchannel", transcript="Mm-hmm."),
        '{"type":"input_audio.discarded","item_id":"item_2","reason":"backchannel","transcript":"Mm-hmm."}',
    ),
]

# The tool additions (docs/protocol.md section 3, "Tools").
CLIENT_TOOLS_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.SessionUpdate(
            session=ev.SessionSettings(
                tools=(
                    ev.FunctionTool(
                        name="get_weather",
                        description="The weather now.",
                        parameters=ev.JsonText('{"type":"object","properties":{"city":{"type":"string"}}}'),
                    ),
                ),
                tool_choice="auto",
            )
        ),
        '{"type":"session.update","session":{"tools":[{"type":"function","name":"get_weather",'
        '"description":"The weather now.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],'
        '"tool_choice":"auto"}}',
    ),
    (
        ev.ResponseCreate(
            input=(
                ev.InputItem(
                    role="assistant",
                    content="",
                    tool_calls=(
                        ev.FunctionCall(call_id="call_1", name="get_weather", arguments='{"city":"Oslo"}'),
                    ),
                ),
                ev.InputItem(role="tool", content="-3 C, snow", tool_call_id="call_1"),
            ),
            tools=(ev.FunctionTool(name="get_weather"),),
            tool_choice=ev.NamedToolChoice(name="get_weather"),
            parallel_tool_calls=False,
        ),
        '{"type":"response.create","input":[{"role":"assistant","content":"","tool_calls":[{"call_id":"call_1",'
        '"name":"get_weather","arguments":"{\\"city\\":\\"Oslo\\"}"}]},{"role":"tool","content":"-3 C, snow",'
        '"tool_call_id":"call_1"}],"tools":[{"type":"function","name":"get_weather"}],'
        '"tool_choice":{"type":"function","name":"get_weather"},"parallel_tool_calls":false}',
    ),
]
SERVER_TOOLS_GOLDEN: list[tuple[Any, str]] = [
    (
        ev.ResponseCreated(response_id="r1", stream_id="s1", resume_token="t", tool_mode="auto"),
        '{"type":"response.created","response_id":"r1","stream_id":"s1","resume_token":"t","tool_mode":"auto"}',
    ),
    (
        ev.FunctionCallArgumentsDelta(
            response_id="r1", stream_id="s1", index=0, call_id="call_s1_0", name="get_weather", delta='{"ci'
        ),
        '{"type":"response.function_call_arguments.delta","response_id":"r1","stream_id":"s1","index":0,'
        '"call_id":"call_s1_0","name":"get_weather","delta":"{\\"ci"}',
    ),
    (
        ev.FunctionCallArgumentsDone(
            response_id="r1",
            stream_id="s1",
            index=0,
            call_id="call_s1_0",
            name="get_weather",
            arguments='{"city":"Oslo"}',
        ),
        '{"type":"response.function_call_arguments.done","response_id":"r1","stream_id":"s1","index":0,'
        '"call_id":"call_s1_0","name":"get_weather","arguments":"{\\"city\\":\\"Oslo\\"}"}',
    ),
    (
        ev.ResponseDone(
            response_id="r1",
            stream_id="s1",
            end=9,
            finish_reason="stop",
            usage=ev.Usage(prompt_tokens=40, completion_tokens=9, cached_tokens=0),
            tool_calls=(
                ev.FunctionCall(call_id="call_s1_0", name="get_weather", arguments='{"city":"Oslo"}'),
            ),
        ),
        '{"type":"response.done","response_id":"r1","stream_id":"s1","end":9,"finish_reason":"stop",'
        '"usage":{"prompt_tokens":40,"completion_tokens":9,"cached_tokens":0},"tool_calls":[{"call_id":"call_s1_0",'
        '"name":"get_weather","arguments":"{\\"city\\":\\"Oslo\\"}"}]}',
    ),
]

# The fields that hold audio bytes, by event type: base64 in JSON, bin in msgpack.
AUDIO_BYTES_FIELDS = {"input_audio.append": "audio", "response.audio.delta": "audio"}


def _msgpack_golden(json_frame: str) -> bytes:
    obj = json.loads(json_frame)
    if (key := AUDIO_BYTES_FIELDS.get(obj["type"])) is not None:
        obj[key] = base64.b64decode(obj[key], validate=True)
    return msgpack.packb(obj, use_bin_type=True)


def test_every_event_type_has_a_golden_frame() -> None:
    assert {type(e).type for e, _ in CLIENT_GOLDEN + CLIENT_AUDIO_GOLDEN} == set(ev.CLIENT_EVENTS)
    assert {type(e).type for e, _ in SERVER_GOLDEN + SERVER_AUDIO_GOLDEN + SERVER_TOOLS_GOLDEN} == set(
        ev.SERVER_EVENTS
    )


ALL_CLIENT_GOLDEN = CLIENT_GOLDEN + CLIENT_AUDIO_GOLDEN + CLIENT_TOOLS_GOLDEN
ALL_SERVER_GOLDEN = SERVER_GOLDEN + SERVER_AUDIO_GOLDEN + SERVER_TOOLS_GOLDEN


@pytest.mark.parametrize(("event", "frame"), ALL_CLIENT_GOLDEN + ALL_SERVER_GOLDEN)
def test_encode_matches_golden(event: Any, frame: str) -> None:
    assert encode(event, "json") == frame
    assert encode(event, "msgpack") == _msgpack_golden(frame)


@pytest.mark.parametrize(("event", "frame"), ALL_CLIENT_GOLDEN)
def test_client_golden_decodes(event: Any, frame: str) -> None:
    assert Decoder(fmt="json").decode(frame) == event
    assert Decoder(fmt="msgpack").decode(_msgpack_golden(frame)) == event


@pytest.mark.parametrize(("event", "frame"), ALL_SERVER_GOLDEN)
def test_server_golden_decodes(event: Any, frame: str) -> None:
    assert decode_server_event(frame) == event
    assert decode_server_event(_msgpack_golden(frame)) == event


@pytest.mark.parametrize(("event", "frame"), CLIENT_GOLDEN + SERVER_GOLDEN)
def test_frames_without_audio_decode_without_audio(event: Any, frame: str) -> None:
    # An old client's or server's frames: every audio addition reads as "not given".
    decoded = Decoder().decode(frame) if type(event).type in ev.CLIENT_EVENTS else decode_server_event(frame)
    if isinstance(decoded, ev.SessionUpdate | ev.SessionUpdated):
        assert decoded.session.audio is None
    if isinstance(decoded, ev.ResponseCreate):
        assert decoded.modalities is None
    if isinstance(decoded, ev.StreamResume):
        assert decoded.audio_from_ms is None
    if isinstance(decoded, ev.ResponseCreated):
        assert decoded.input_item_id is None
    if isinstance(decoded, ev.SessionCreated):
        assert decoded.limits.max_input_audio_ms is None
    new_keys = ('"audio"', '"modalities"', '"audio_from_ms"', '"input_item_id"', '"max_input_audio_ms"')
    assert not [k for k in new_keys if k in frame]  # the frame is an old one


def test_turn_detection_type_none_is_the_same_as_null() -> None:
    # One value for "detection off", however the client wrote it; it is written back as null.
    by_type = '{"type":"session.update","session":{"audio":{"input":{"turn_detection":{"type":"none"}}}}}'
    by_null = '{"type":"session.update","session":{"audio":{"input":{"turn_detection":null}}}}'
    off = ev.SessionUpdate(
        session=ev.SessionSettings(
            audio=ev.AudioSettings(input=ev.AudioInputSettings(turn_detection=ev.TURN_DETECTION_OFF))
        )
    )
    assert Decoder().decode(by_type) == Decoder().decode(by_null) == off
    assert encode(off, "json") == by_null
    assert ev.TURN_DETECTION_OFF == ev.TurnDetectionSettings(type="none")


def test_absent_null_and_off_are_three_values() -> None:
    # Absent (None: unchanged) is not the meaningful null (off), on the wire or in the event.
    absent = Decoder().decode('{"type":"session.update","session":{"audio":{"input":{}}}}')
    off = Decoder().decode(
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":null},"output":null}}}'
    )
    assert absent.session.audio == ev.AudioSettings(input=ev.AudioInputSettings())
    assert off.session.audio == ev.AudioSettings(
        input=ev.AudioInputSettings(turn_detection=ev.TURN_DETECTION_OFF), output=ev.AUDIO_OUTPUT_OFF
    )
    assert ev.AUDIO_OUTPUT_OFF.enabled is False and ev.AudioOutputSettings().enabled is True
    # A null elsewhere still counts as absent.
    assert Decoder().decode('{"type":"session.update","session":{"audio":null}}') == ev.SessionUpdate(
        session=ev.SessionSettings()
    )
    with pytest.raises(AssertionError):
        ev.AudioOutputSettings(enabled=False, voice="amy")  # text only takes no other field


def test_msgpack_bytes_by_hand() -> None:
    # fixmap(1) {fixstr "type": fixstr "ping"}
    assert encode(ev.Ping(), "msgpack") == bytes.fromhex("81 a4 74797065 a4 70696e67")
    # fixmap(2) {"type": "stream.resume"... "from": 0} ends with fixstr "from", positive fixint 0
    frame = encode(ev.StreamResume(stream_id="s", resume_token="t", from_=0), "msgpack")
    assert frame[0] == 0x84 and frame.endswith(bytes.fromhex("a4 66726f6d 00"))
    # audio is bin 8 (0xc4, length 4), the samples as they are
    frame = encode(ev.InputAudioAppend(audio=PCM[:4]), "msgpack")
    assert frame[0] == 0x82 and frame.endswith(bytes.fromhex("a5 617564696f c4 04 00000100"))


def test_integral_numbers_decode_as_floats_where_the_field_is_a_number() -> None:
    event = Decoder().decode('{"type":"response.create","temperature":1,"top_p":1}')
    assert event == ev.ResponseCreate(temperature=1.0, top_p=1.0)
    assert isinstance(event.temperature, float) and isinstance(event.top_p, float)


def test_unknown_fields_are_ignored() -> None:
    # The protocol only grows: a v1 server reads a newer client's frames.
    frame = '{"type":"response.cancel","response_id":"r","future":{"x":[1]},"heard_chars":2}'
    assert Decoder().decode(frame) == ev.ResponseCancel(response_id="r", heard_chars=2)
    frame = '{"type":"session.update","session":{"voice":"alloy","on_disconnect":"cancel"}}'
    assert Decoder().decode(frame) == ev.SessionUpdate(session=ev.SessionSettings(on_disconnect="cancel"))


def test_null_optional_field_counts_as_absent() -> None:
    assert Decoder().decode('{"type":"response.create","max_tokens":null}') == ev.ResponseCreate()


def test_error_code_default_retryable() -> None:
    retryable = {c.value for c in ev.ErrorCode if c.retryable}
    assert retryable == {"rate_limited", "overloaded", "internal_error"}
    assert len(ev.ErrorCode) == 11
    assert ev.ErrorCode("stream_truncated").retryable is False  # the lost tokens never come back


def test_close_codes() -> None:
    assert sorted(ev.CloseCode) == [1000, 1001, 1007, 1008, 1009, 1011, 1013, 4008]
    assert ev.CloseCode.MESSAGE_TOO_BIG == 1009 and ev.CloseCode.CLIENT_TOO_SLOW == 4008
