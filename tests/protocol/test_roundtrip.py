"""Property tests: round trips in both encodings, and garbage never escapes as another exception."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.protocol import Decoder, FrameTooLarge, ProtocolError, decode_server_event, encode
from bargein.protocol.codec import DEFAULT_MAX_FRAME_BYTES, Format
from tests.protocol import strategies as s

FORMATS: list[Format] = ["json", "msgpack"]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=300)
@given(event=s.client_events)
def test_client_events_round_trip(fmt: Format, event: Any) -> None:
    assert Decoder(fmt=fmt).decode(encode(event, fmt)) == event


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=300)
@given(event=s.server_events)
def test_server_events_round_trip(fmt: Format, event: Any) -> None:
    assert decode_server_event(encode(event, fmt)) == event


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=300)
@given(frame=st.binary(max_size=200) | st.text(max_size=200))
def test_garbage_gives_protocol_error_only(fmt: Format, frame: bytes | str) -> None:
    try:
        Decoder(fmt=fmt, max_frame_bytes=10_000).decode(frame)
    except ProtocolError:
        pass


_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=10)
# Near-base64 strings, for the audio fields.
_base64ish = st.text(st.sampled_from("AQw+/=-_ \n"), max_size=12)


def _values(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | keys, inner, max_size=4)
        ),
        max_leaves=12,
    )


keys = st.sampled_from(
    [
        "type",
        "event_id",
        "session",
        "input",
        "role",
        "content",
        "stop",
        "from",
        "max_tokens",
        "temperature",
        "audio",
        "output",
        "turn_detection",
        "sample_rate",
        "threshold",
        "modalities",
        "audio_from_ms",
        "x",
    ]
)
json_values = _values(_scalars | _base64ish)
msgpack_values = _values(_scalars | _base64ish | st.binary(max_size=9))  # bin only msgpack carries
types = st.sampled_from(
    [
        "ping",
        "response.create",
        "response.cancel",
        "session.update",
        "stream.resume",
        "input_audio.append",
        "input_audio.commit",
        "input_audio.clear",
        "?",
    ]
)


@st.composite
def near_miss_maps(draw: st.DrawFn, values: st.SearchStrategy[Any] = json_values) -> dict[str, Any]:
    """Maps that look like events, with fields of any type ``values`` draws."""
    obj = draw(st.dictionaries(keys, values, max_size=6))
    if draw(st.booleans()):
        obj["type"] = draw(types)
    return obj


@settings(max_examples=300)
@given(obj=near_miss_maps())
def test_structured_garbage_gives_protocol_error_only_json(obj: dict[str, Any]) -> None:
    try:
        Decoder(fmt="json", max_frame_bytes=1 << 20).decode(json.dumps(obj))
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(obj=near_miss_maps(msgpack_values))
def test_structured_garbage_gives_protocol_error_only_msgpack(obj: dict[str, Any]) -> None:
    try:
        Decoder(fmt="msgpack", max_frame_bytes=1 << 20).decode(msgpack.packb(obj, use_bin_type=True))
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(frame=st.binary(max_size=200) | st.text(max_size=200) | near_miss_maps().map(json.dumps))
def test_server_garbage_gives_protocol_error_only(frame: bytes | str) -> None:
    try:
        decode_server_event(frame)
    except ProtocolError:
        pass


def test_deep_nesting_is_invalid_message() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ProtocolError) as e:
        Decoder(max_frame_bytes=1 << 20).decode(deep)
    assert e.value.code == "invalid_message"
    deep_msgpack = b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(ProtocolError):
        Decoder(fmt="msgpack", max_frame_bytes=1 << 20).decode(deep_msgpack)


@pytest.mark.parametrize("fmt", FORMATS)
def test_frame_too_large_is_not_a_protocol_error(fmt: Format) -> None:
    event = s.ev.ResponseCreate(input=(s.ev.InputItem(role="user", content="é" * 600),))
    frame = encode(event, fmt)
    Decoder(fmt=fmt, max_frame_bytes=1300).decode(frame)  # 1200 bytes of content plus framing fits
    with pytest.raises(FrameTooLarge) as e:
        Decoder(fmt=fmt, max_frame_bytes=1000).decode(frame)
    assert not isinstance(e.value, ProtocolError)
    assert e.value.limit == 1000 and e.value.size > 1200


def test_default_frame_limit_fits_audio_in_both_encodings() -> None:
    # 100 ms of 24 kHz pcm16 (4,800 bytes) is 6,400 base64 characters: a small fraction of the limit.
    chunk = s.ev.InputAudioAppend(audio=bytes(4800), event_id="e" * 64)
    assert len(encode(chunk, "json")) < 6400 + 120 < DEFAULT_MAX_FRAME_BYTES // 100
    assert len(encode(chunk, "msgpack")) < 4800 + 120
    # The largest append that fits the default limit as JSON: over 16 s of 24 kHz pcm16.
    overhead = len(encode(s.ev.InputAudioAppend(audio=b""), "json"))
    num_bytes = (DEFAULT_MAX_FRAME_BYTES - overhead) // 4 * 3 // 2 * 2
    assert num_bytes / (24_000 * 2) > 16
    largest = encode(s.ev.InputAudioAppend(audio=bytes(num_bytes)), "json")
    assert Decoder().decode(largest) == s.ev.InputAudioAppend(audio=bytes(num_bytes))
    with pytest.raises(FrameTooLarge):
        Decoder().decode(encode(s.ev.InputAudioAppend(audio=bytes(num_bytes + 4)), "json"))
    # msgpack carries the same audio in 3/4 of the bytes.
    assert len(encode(s.ev.InputAudioAppend(audio=bytes(num_bytes)), "msgpack")) < 0.76 * len(largest)
