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
    pytest.param(_create(stop=["a", "b", "c", "d", "e"]), id="stop>4"),
    pytest.param(_create(stop=["a", ""]), id="stop-empty-string"),
    pytest.param(_create(input=[{"role": "tool", "content": "x"}]), id="role-outside-set"),
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
