"""Every validation rule, with the error code a client gets for it."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from bargein.protocol import Decoder, ErrorCode, ProtocolError, select_subprotocol
from bargein.protocol import events as ev


def _error(frame: str | bytes, fmt: str = "json") -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        Decoder(fmt=fmt).decode(frame)  # type: ignore[arg-type]
    return e.value


def _create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", **fields})


INVALID_MESSAGE = [
    pytest.param("not json", id="undecodable"),
    pytest.param("", id="empty"),
    pytest.param('{"type":"ping"} {"type":"ping"}', id="two-values"),
    pytest.param("[1, 2]", id="not-a-map-list"),
    pytest.param('"ping"', id="not-a-map-string"),
    pytest.param('{"event_id":"e"}', id="missing-type"),
    pytest.param('{"type":7}', id="type-not-string"),
    pytest.param('{"type":"ping","temperature":NaN}', id="json-nan"),
    pytest.param('{"type":"response.create","temperature":Infinity}', id="json-infinity"),
    pytest.param('{"type":"response.cancel"}', id="missing-required"),
    pytest.param('{"type":"response.cancel","response_id":null}', id="null-required"),
    pytest.param('{"type":"response.cancel","response_id":5}', id="id-not-string"),
    pytest.param('{"type":"stream.resume","stream_id":"s","resume_token":"t"}', id="missing-from"),
    pytest.param('{"type":"stream.resume","stream_id":"s","resume_token":"t","from":1.0}', id="from-float"),
    pytest.param('{"type":"stream.resume","stream_id":"s","resume_token":"t","from":true}', id="from-bool"),
    pytest.param('{"type":"stream.resume","stream_id":"s","resume_token":"t","from":"1"}', id="from-string"),
    pytest.param(_create(max_tokens=True), id="max_tokens-bool"),
    pytest.param(_create(max_tokens=8.0), id="max_tokens-float"),
    pytest.param(_create(temperature="0.5"), id="temperature-string"),
    pytest.param(_create(temperature=False), id="temperature-bool"),
    pytest.param(_create(interrupt_active=1), id="interrupt_active-int"),
    pytest.param(_create(stop="User:"), id="stop-not-list"),
    pytest.param(_create(stop=["a", 1]), id="stop-item-not-string"),
    pytest.param(_create(input={"role": "user", "content": "hi"}), id="input-not-list"),
    pytest.param(_create(input=["hi"]), id="input-item-not-map"),
    pytest.param(_create(input=[{"role": "user"}]), id="input-missing-content"),
    pytest.param(_create(input=[{"role": "user", "content": ["hi"]}]), id="content-not-string"),
    pytest.param('{"type":"session.update"}', id="session-missing"),
    pytest.param('{"type":"session.update","session":[]}', id="session-not-map"),
    pytest.param(
        '{"type":"session.update","session":{"include_token_ids":"yes"}}', id="include_token_ids-string"
    ),
    pytest.param('{"type":"ping","event_id":5}', id="event_id-not-string"),
    pytest.param('{"type":"response.cancel","response_id":"\\ud800"}', id="lone-surrogate"),
]


@pytest.mark.parametrize("frame", INVALID_MESSAGE)
def test_invalid_message(frame: str) -> None:
    assert _error(frame).code is ErrorCode.INVALID_MESSAGE


INVALID_PARAMETER = [
    pytest.param(_create(temperature=-0.01), id="temperature<0"),
    pytest.param(_create(top_p=0), id="top_p=0"),
    pytest.param(_create(top_p=1.0001), id="top_p>1"),
    pytest.param(_create(max_tokens=0), id="max_tokens<1"),
    pytest.param(_create(top_k=-1), id="top_k<0"),
    pytest.param(_create(seed=-1), id="seed<0"),
    pytest.param(_create(max_tokens=2**63), id="int-over-64-bits"),
    pytest.param('{"type":"response.create","temperature":1' + "0" * 400 + "}", id="temperature-400-digits"),
    pytest.param('{"type":"response.create","temperature":1e999}', id="temperature-overflows-to-inf"),
    pytest.param(_create(stop=["a", "b", "c", "d", "e"]), id="stop>4"),
    pytest.param(_create(stop=["a", ""]), id="stop-empty-string"),
    pytest.param(_create(input=[{"role": "function", "content": "x"}]), id="role-outside-set"),
    pytest.param(_create(input=[{"role": "tool", "content": "x"}]), id="tool-item-without-call-id"),
    pytest.param(
        _create(input=[{"role": "user", "content": "x", "tool_call_id": "c"}]), id="call-id-on-a-user-item"
    ),
    pytest.param(
        _create(
            input=[
                {
                    "role": "user",
                    "content": "",
                    "tool_calls": [{"call_id": "c", "name": "f", "arguments": "{}"}],
                }
            ]
        ),
        id="tool-calls-on-a-user-item",
    ),
    pytest.param(
        _create(
            input=[
                {
                    "role": "assistant",
                    "content": "hi",
                    "tool_calls": [{"call_id": "c", "name": "f", "arguments": "{}"}],
                }
            ]
        ),
        id="tool-calls-with-text",
    ),
    pytest.param(_create(tools=[{"type": "function", "name": "a b"}]), id="tool-name-with-a-space"),
    pytest.param(
        _create(tools=[{"type": "function", "name": "f"}, {"type": "function", "name": "f"}]),
        id="tool-names-twice",
    ),
    pytest.param(
        _create(tools=[{"type": "function", "name": "f", "parameters": {"type": "array"}}]),
        id="tool-parameters-not-an-object-schema",
    ),
    pytest.param(
        _create(tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}),
        id="tool-choice-names-no-tool",
    ),
    pytest.param(_create(tools=[{"type": "other", "name": "f"}]), id="tool-type-not-function"),
    pytest.param(_create(response_id=""), id="response_id-empty"),
    pytest.param(_create(response_id="r" * 65), id="response_id>64"),
    pytest.param('{"type":"ping","event_id":"' + "e" * 65 + '"}', id="event_id>64"),
    pytest.param('{"type":"session.update","session":{"on_disconnect":"pause"}}', id="on_disconnect"),
    pytest.param('{"type":"session.update","session":{"defaults":{"top_p":2}}}', id="defaults-top_p"),
    pytest.param('{"type":"session.update","session":{"defaults":{"stop":[""]}}}', id="defaults-stop"),
    pytest.param('{"type":"stream.resume","stream_id":"s","resume_token":"t","from":-1}', id="from<0"),
    pytest.param('{"type":"response.cancel","response_id":"r","heard_chars":-1}', id="heard_chars<0"),
    pytest.param('{"type":"response.cancel","response_id":"r","audio_end_ms":-5}', id="audio_end_ms<0"),
    # Offsets and counts are bounded (2**31 - 1): past it, nothing a stream can hold.
    pytest.param(
        '{"type":"stream.resume","stream_id":"s","resume_token":"t","from":2147483648}', id="from>2**31-1"
    ),
    pytest.param(
        '{"type":"stream.resume","stream_id":"s","resume_token":"t","from":9223372036854775807}',
        id="from=2**63-1",
    ),
    pytest.param(
        '{"type":"response.cancel","response_id":"r","heard_chars":2147483648}', id="heard_chars>2**31-1"
    ),
    pytest.param(
        '{"type":"response.cancel","response_id":"r","audio_end_ms":2147483648}', id="audio_end_ms>2**31-1"
    ),
    pytest.param(_create(max_tokens=2**31), id="max_tokens>2**31-1"),
    pytest.param(_create(top_k=2**31), id="top_k>2**31-1"),
    pytest.param(
        '{"type":"session.update","session":{"defaults":{"max_tokens":2147483648}}}',
        id="defaults-max_tokens>2**31-1",
    ),
    pytest.param(
        '{"type":"session.update","session":{"defaults":{"top_k":2147483648}}}', id="defaults-top_k>2**31-1"
    ),
]


@pytest.mark.parametrize("frame", INVALID_PARAMETER)
def test_invalid_parameter(frame: str) -> None:
    assert _error(frame).code is ErrorCode.INVALID_PARAMETER


def test_boundary_values_are_accepted() -> None:
    frame = _create(temperature=0, top_p=1, max_tokens=1, top_k=0, seed=0, stop=["a", "b", "c", "d"])
    event = Decoder().decode(frame)
    assert event == ev.ResponseCreate(
        temperature=0.0, top_p=1.0, max_tokens=1, top_k=0, seed=0, stop=("a", "b", "c", "d")
    )
    assert Decoder().decode(_create(input=[])) == ev.ResponseCreate(input=())
    assert Decoder().decode('{"type":"ping","event_id":"' + "e" * 64 + '"}') == ev.Ping(event_id="e" * 64)
    top = 2**31 - 1
    assert Decoder().decode(_create(max_tokens=top, top_k=top)) == ev.ResponseCreate(
        max_tokens=top, top_k=top
    )
    resume = json.dumps({"type": "stream.resume", "stream_id": "s", "resume_token": "t", "from": top})
    assert Decoder().decode(resume) == ev.StreamResume(stream_id="s", resume_token="t", from_=top)
    cancel = json.dumps(
        {"type": "response.cancel", "response_id": "r", "heard_chars": top, "audio_end_ms": top}
    )
    assert Decoder().decode(cancel) == ev.ResponseCancel(response_id="r", heard_chars=top, audio_end_ms=top)


def _append(audio: Any) -> str:
    return json.dumps({"type": "input_audio.append", "audio": audio})


def _audio(audio: Any) -> str:
    return json.dumps({"type": "session.update", "session": {"audio": audio}})


def _turn(**fields: Any) -> str:
    return _audio({"input": {"turn_detection": fields}})


TD = "session.audio.input.turn_detection"

# (frame, the field the message must name)
AUDIO_INVALID_MESSAGE = [
    pytest.param('{"type":"input_audio.append"}', "audio", id="append-missing-audio"),
    pytest.param(_append(None), "audio", id="append-audio-null"),
    pytest.param(_append(5), "audio", id="append-audio-int"),
    pytest.param(_append(["AAAA"]), "audio", id="append-audio-list"),
    pytest.param(_append("AAA"), "audio", id="base64-unpadded"),
    pytest.param(_append("AA"), "audio", id="base64-unpadded-2"),
    pytest.param(_append("AA=A"), "audio", id="base64-padding-inside"),
    pytest.param(_append("AA==="), "audio", id="base64-excess-padding"),
    pytest.param(_append("A"), "audio", id="base64-one-char"),
    pytest.param(_append("AAA*"), "audio", id="base64-bad-char"),
    pytest.param(_append("AP-_"), "audio", id="base64-urlsafe-alphabet"),
    pytest.param(_append("AAAA AAAA"), "audio", id="base64-space"),
    pytest.param(_append("AAAA\n"), "audio", id="base64-newline"),
    pytest.param(_append("AB=="), "audio", id="base64-not-canonical"),
    pytest.param(_append("é==="), "audio", id="base64-non-ascii"),
    pytest.param(_audio(True), "session.audio", id="audio-not-map"),
    pytest.param(_audio({"input": []}), "session.audio.input", id="input-not-map"),
    pytest.param(_audio({"output": "amy"}), "session.audio.output", id="output-not-map"),
    pytest.param(_audio({"input": {"turn_detection": "server_vad"}}), TD, id="turn_detection-not-map"),
    pytest.param(_turn(threshold="0.5"), f"{TD}.threshold", id="threshold-string"),
    pytest.param(_turn(prefix_padding_ms=300.0), f"{TD}.prefix_padding_ms", id="prefix_padding_ms-float"),
    pytest.param(_turn(silence_duration_ms=True), f"{TD}.silence_duration_ms", id="silence_duration_ms-bool"),
    pytest.param(_turn(interrupt_response=1), f"{TD}.interrupt_response", id="interrupt_response-int"),
    pytest.param(_turn(create_response="yes"), f"{TD}.create_response", id="create_response-string"),
    pytest.param(_audio({"output": {"voice": 5}}), "session.audio.output.voice", id="voice-int"),
    pytest.param(_create(modalities="text"), "modalities", id="modalities-not-list"),
    pytest.param(
        '{"type":"stream.resume","stream_id":"s","resume_token":"t","from":0,"audio_from_ms":1.5}',
        "audio_from_ms",
        id="audio_from_ms-float",
    ),
]


@pytest.mark.parametrize(("frame", "name"), AUDIO_INVALID_MESSAGE)
def test_audio_invalid_message(frame: str, name: str) -> None:
    error = _error(frame)
    assert error.code is ErrorCode.INVALID_MESSAGE
    assert f"'{name}'" in error.message


AUDIO_INVALID_PARAMETER = [
    pytest.param(_append("AAAA"), "audio", id="append-3-bytes"),
    pytest.param(_append("AA=="), "audio", id="append-1-byte"),
    pytest.param(
        _audio({"input": {"sample_rate": 44100}}), "session.audio.input.sample_rate", id="in-rate-44100"
    ),
    pytest.param(
        _audio({"input": {"sample_rate": 8000}}), "session.audio.input.sample_rate", id="in-rate-8000"
    ),
    pytest.param(
        _audio({"input": {"sample_rate": "16000"}}), "session.audio.input.sample_rate", id="in-rate-str"
    ),
    pytest.param(
        _audio({"input": {"sample_rate": 16000.0}}), "session.audio.input.sample_rate", id="in-rate-float"
    ),
    pytest.param(
        _audio({"output": {"sample_rate": 22050}}), "session.audio.output.sample_rate", id="out-rate"
    ),
    pytest.param(_turn(type="magic_vad"), f"{TD}.type", id="turn-type"),
    pytest.param(_turn(type="semantic_vad", eagerness="eager"), f"{TD}.eagerness", id="eagerness"),
    pytest.param(_turn(type="semantic_vad", threshold=0.5), f"{TD}.threshold", id="semantic-threshold"),
    pytest.param(
        _turn(type="semantic_vad", silence_duration_ms=300),
        f"{TD}.silence_duration_ms",
        id="semantic-silence",
    ),
    pytest.param(_turn(type="server_vad", eagerness="low"), f"{TD}.eagerness", id="server-eagerness"),
    pytest.param(_turn(threshold=0), f"{TD}.threshold", id="threshold=0"),
    pytest.param(_turn(threshold=1), f"{TD}.threshold", id="threshold=1"),
    pytest.param(_turn(threshold=-0.2), f"{TD}.threshold", id="threshold<0"),
    pytest.param(_turn(threshold=1.5), f"{TD}.threshold", id="threshold>1"),
    pytest.param(_turn(prefix_padding_ms=-1), f"{TD}.prefix_padding_ms", id="prefix_padding_ms<0"),
    pytest.param(_turn(prefix_padding_ms=10_001), f"{TD}.prefix_padding_ms", id="prefix_padding_ms>10s"),
    pytest.param(_turn(silence_duration_ms=-1), f"{TD}.silence_duration_ms", id="silence_duration_ms<0"),
    pytest.param(
        _turn(silence_duration_ms=10_001), f"{TD}.silence_duration_ms", id="silence_duration_ms>10s"
    ),
    pytest.param(_turn(type="none", threshold=0.5), TD, id="turn-off-with-fields"),
    pytest.param(_turn(type="none", create_response=False), TD, id="turn-off-with-create_response"),
    pytest.param(_audio({"output": {"voice": ""}}), "session.audio.output.voice", id="voice-empty"),
    pytest.param(_audio({"output": {"voice": "v" * 65}}), "session.audio.output.voice", id="voice>64"),
    pytest.param(_create(modalities=["audio"]), "modalities", id="modalities-audio-alone"),
    pytest.param(_create(modalities=[]), "modalities", id="modalities-empty"),
    pytest.param(_create(modalities=["text", "text"]), "modalities", id="modalities-duplicate"),
    pytest.param(_create(modalities=["text", "audio", "audio"]), "modalities", id="modalities-audio-twice"),
    pytest.param(_create(modalities=["text", "video"]), "modalities[1]", id="modalities-unknown"),
    pytest.param(
        '{"type":"stream.resume","stream_id":"s","resume_token":"t","from":0,"audio_from_ms":-1}',
        "audio_from_ms",
        id="audio_from_ms<0",
    ),
    pytest.param(
        '{"type":"stream.resume","stream_id":"s","resume_token":"t","from":0,"audio_from_ms":2147483648}',
        "audio_from_ms",
        id="audio_from_ms>2**31-1",
    ),
]


@pytest.mark.parametrize(("frame", "name"), AUDIO_INVALID_PARAMETER)
def test_audio_invalid_parameter(frame: str, name: str) -> None:
    error = _error(frame)
    assert error.code is ErrorCode.INVALID_PARAMETER
    assert f"'{name}'" in error.message


def test_msgpack_audio_is_bin_only() -> None:
    pcm = b"\x01\x00\x02\x00"
    assert Decoder(fmt="msgpack").decode(
        msgpack.packb({"type": "input_audio.append", "audio": pcm}, use_bin_type=True)
    ) == ev.InputAudioAppend(audio=pcm)
    # base64 text where msgpack carries bin is a mistyped field, even when it would decode
    frame = msgpack.packb({"type": "input_audio.append", "audio": "AQACAA=="}, use_bin_type=True)
    error = _error(frame, "msgpack")
    assert error.code is ErrorCode.INVALID_MESSAGE and "'audio'" in error.message
    odd = msgpack.packb({"type": "input_audio.append", "audio": pcm[:3]}, use_bin_type=True)
    error = _error(odd, "msgpack")
    assert error.code is ErrorCode.INVALID_PARAMETER and "3" in error.message


def _decoded_audio(frame: str) -> ev.AudioSettings | None:
    event = Decoder().decode(frame)
    assert isinstance(event, ev.SessionUpdate)
    return event.session.audio


def test_audio_boundary_values_are_accepted() -> None:
    assert Decoder().decode(_append("")) == ev.InputAudioAppend(audio=b"")  # no samples is whole samples
    assert Decoder().decode(_append("AAD/fw==")) == ev.InputAudioAppend(audio=b"\x00\x00\xff\x7f")
    for threshold, padding_ms, silence_ms in ((0.001, 0, 10_000), (0.999, 10_000, 0)):
        frame = _turn(threshold=threshold, prefix_padding_ms=padding_ms, silence_duration_ms=silence_ms)
        assert _decoded_audio(frame) == ev.AudioSettings(
            input=ev.AudioInputSettings(
                turn_detection=ev.TurnDetectionSettings(
                    threshold=threshold, prefix_padding_ms=padding_ms, silence_duration_ms=silence_ms
                )
            )
        )
    assert _decoded_audio(_turn(type="none")) == ev.AudioSettings(
        input=ev.AudioInputSettings(turn_detection=ev.TURN_DETECTION_OFF)
    )
    for rate in (16000, 24000):
        assert _decoded_audio(_audio({"input": {"sample_rate": rate}, "output": {"sample_rate": rate}})) == (
            ev.AudioSettings(
                input=ev.AudioInputSettings(sample_rate=rate), output=ev.AudioOutputSettings(sample_rate=rate)
            )
        )
    assert _decoded_audio(_audio({"output": {"voice": "v" * 64}})) == ev.AudioSettings(
        output=ev.AudioOutputSettings(voice="v" * 64)
    )
    assert Decoder().decode(_create(modalities=["audio", "text"])) == ev.ResponseCreate(
        modalities=("audio", "text")
    )
    top = 2**31 - 1
    for ms in (0, top):
        resume = {
            "type": "stream.resume",
            "stream_id": "s",
            "resume_token": "t",
            "from": 0,
            "audio_from_ms": ms,
        }
        assert Decoder().decode(json.dumps(resume)) == ev.StreamResume(
            stream_id="s", resume_token="t", from_=0, audio_from_ms=ms
        )


def test_msgpack_nan_is_invalid_parameter() -> None:
    frame = msgpack.packb({"type": "response.create", "temperature": float("nan")})
    assert _error(frame, "msgpack").code is ErrorCode.INVALID_PARAMETER


def test_unknown_type() -> None:
    error = _error('{"type":"response.explode","event_id":"e7"}')
    assert error.code is ErrorCode.UNKNOWN_TYPE and error.event_id == "e7"


def test_error_echoes_event_id_and_maps_to_error_event() -> None:
    error = _error(_create(temperature=-1, event_id="e42"))
    assert error.event_id == "e42"
    event = error.to_event()
    assert event.code is ErrorCode.INVALID_PARAMETER and event.event_id == "e42" and event.retryable is False
    assert "temperature" in event.message


def test_unreadable_event_id_is_not_echoed() -> None:
    assert _error('{"type":"ping","event_id":"' + "e" * 65 + '"}').event_id is None


@pytest.mark.parametrize(
    ("fmt", "frame"),
    [
        pytest.param("json", b'{"type":"ping"}', id="binary-frame-on-json"),
        pytest.param("msgpack", '{"type":"ping"}', id="text-frame-on-msgpack"),
        pytest.param("msgpack", b"\xc1", id="msgpack-never-used-byte"),
        pytest.param("msgpack", msgpack.packb({"type": "ping"}) + b"\x00", id="msgpack-extra-data"),
        pytest.param("msgpack", msgpack.packb([1]), id="msgpack-not-a-map"),
        pytest.param("msgpack", b"\x81\xa4type\xa2\xff\xfe", id="msgpack-invalid-utf8-str"),
        pytest.param(
            "msgpack", msgpack.packb({"type": b"ping"}, use_bin_type=True), id="msgpack-bin-for-str"
        ),
        pytest.param("msgpack", msgpack.packb({1: "x"}), id="msgpack-int-key"),
    ],
)
def test_wrong_frame_kind_and_bad_msgpack(fmt: str, frame: str | bytes) -> None:
    assert _error(frame, fmt).code is ErrorCode.INVALID_MESSAGE


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        ([], ("json", None, None)),
        (["bargein.v1.json"], ("json", "bargein.v1.json", None)),
        (["bargein.v1.msgpack"], ("msgpack", "bargein.v1.msgpack", None)),
        (["bargein.v1.msgpack", "bargein.v1.json"], ("msgpack", "bargein.v1.msgpack", None)),
        (["bearer.sk-123", "bargein.v1.json"], ("json", "bargein.v1.json", "sk-123")),
        (["bearer.sk-123"], ("json", None, "sk-123")),
        (["chat", "bargein.v2.json"], ("json", None, None)),
    ],
)
def test_select_subprotocol(offered: list[str], expected: tuple[str, str | None, str | None]) -> None:
    assert select_subprotocol(offered) == expected
    assert not str(select_subprotocol(offered)[1]).startswith("bearer.")  # the key is never echoed
