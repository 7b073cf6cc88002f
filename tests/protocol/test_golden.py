"""Golden frames: every event's exact wire form, written by hand from PROTOCOL.md.

JSON frames must match byte for byte (compact, ``type`` first, fields in the
order of PROTOCOL.md's tables, ``None`` optionals left out); msgpack frames
must equal the same map packed by msgpack itself.
"""

from __future__ import annotations

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


def _msgpack_golden(json_frame: str) -> bytes:
    return msgpack.packb(json.loads(json_frame), use_bin_type=True)


def test_every_event_type_has_a_golden_frame() -> None:
    assert {type(e).type for e, _ in CLIENT_GOLDEN} == set(ev.CLIENT_EVENTS)
    assert {type(e).type for e, _ in SERVER_GOLDEN} == set(ev.SERVER_EVENTS)


@pytest.mark.parametrize(("event", "frame"), CLIENT_GOLDEN + SERVER_GOLDEN)
def test_encode_matches_golden(event: Any, frame: str) -> None:
    assert encode(event, "json") == frame
    assert encode(event, "msgpack") == _msgpack_golden(frame)


@pytest.mark.parametrize(("event", "frame"), CLIENT_GOLDEN)
def test_client_golden_decodes(event: Any, frame: str) -> None:
    assert Decoder(fmt="json").decode(frame) == event
    assert Decoder(fmt="msgpack").decode(_msgpack_golden(frame)) == event


@pytest.mark.parametrize(("event", "frame"), SERVER_GOLDEN)
def test_server_golden_decodes(event: Any, frame: str) -> None:
    assert decode_server_event(frame) == event
    assert decode_server_event(_msgpack_golden(frame)) == event


def test_msgpack_bytes_by_hand() -> None:
    # fixmap(1) {fixstr "type": fixstr "ping"}
    assert encode(ev.Ping(), "msgpack") == bytes.fromhex("81 a4 74797065 a4 70696e67")
    # fixmap(2) {"type": "stream.resume"... "from": 0} ends with fixstr "from", positive fixint 0
    frame = encode(ev.StreamResume(stream_id="s", resume_token="t", from_=0), "msgpack")
    assert frame[0] == 0x84 and frame.endswith(bytes.fromhex("a4 66726f6d 00"))


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
