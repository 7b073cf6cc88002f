"""OpenAI request validation and response shapes, without a server (fast)."""

from __future__ import annotations

from typing import Any

import pytest

from bargein.app.openai.routes import principal_of
from bargein.app.openai.schema import (
    ApiError,
    Completion,
    chunk_body,
    completion_body,
    decode_json,
    origin_session_id,
    parse_chat_request,
    parse_origin,
    usage_chunk,
)
from bargein.engine.grammar_spec import GrammarKind, GrammarSpec
from bargein.engine.request import SamplingParams
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message
from bargein.session.streams.log import StreamEnd

CONFIG = SessionConfig(max_tokens=64, default_max_tokens=32)
HELLO = [{"role": "user", "content": "Hello"}]


def parse(**fields: Any) -> Any:
    return parse_chat_request({"model": "m", "messages": HELLO, **fields}, CONFIG)


def test_a_minimal_request_takes_the_server_defaults() -> None:
    chat = parse()
    assert chat.messages == (Message(role="user", content="Hello"),)
    assert chat.params == SamplingParams(max_tokens=32)
    assert not chat.stream and not chat.include_usage
    assert chat.on_disconnect is None and chat.user is None


def test_every_supported_field_is_honoured() -> None:
    chat = parse(
        max_tokens=10,
        temperature=0,
        top_p=0.5,
        seed=7,
        stop="\n",
        stream=True,
        stream_options={"include_usage": True},
        n=1,
        user="u-1",
        bargein_on_disconnect="cancel",
        ignore_eos=True,
        min_tokens=10,
        frobnicate={"ignored": True},
    )
    assert chat.params == SamplingParams(
        max_tokens=10, temperature=0.0, top_p=0.5, seed=7, stop=("\n",), ignore_eos=True, min_tokens=10
    )
    assert chat.stream and chat.include_usage
    assert chat.on_disconnect == "cancel" and chat.user == "u-1"


def test_max_completion_tokens_wins_and_nulls_mean_absent() -> None:
    chat = parse(max_tokens=5, max_completion_tokens=9, temperature=None, stop=None, n=None)
    assert chat.params.max_tokens == 9 and chat.params.temperature == 1.0


def test_messages_map_roles_and_join_text_parts() -> None:
    chat = parse_chat_request(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "ok", "name": "bot"},
            ]
        },
        CONFIG,
    )
    assert chat.messages == (
        Message(role="system", content="Be brief."),
        Message(role="user", content="a\nb"),
        Message(role="assistant", content="ok"),
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"n": "1"}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 65}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": 1000}, "max_completion_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"min_tokens": 33}, "min_tokens"),  # above the default max_tokens (32)
        ({"max_tokens": 8, "min_tokens": 9}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 2.0}, "min_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"user": 5}, "user"),
        ({"model": 5}, "model"),
        ({"bargein_on_disconnect": "explode"}, "bargein_on_disconnect"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"uniqueItems": True}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0].tool_call_id"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"messages": [HELLO[0], 3]}, "messages[1]"),
    ],
)
def test_bad_values_name_their_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    error = caught.value.body()["error"]
    assert caught.value.status == 400
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_missing_messages_and_bad_bodies() -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"model": "m"}, CONFIG)
    assert caught.value.code == "missing_required_parameter"
    with pytest.raises(ApiError):
        parse_chat_request([HELLO], CONFIG)
    for raw in (b"{", b'{"temperature": NaN}', b"\xff"):
        with pytest.raises(ApiError) as caught:
            decode_json(raw)
        assert caught.value.code == "invalid_json"


def test_the_origin_of_an_http_stream_round_trips() -> None:
    assert parse_origin(origin_session_id(1700000000, True)) == (1700000000, True, None)
    assert parse_origin(origin_session_id(5, False)) == (5, False, None)
    assert parse_origin(origin_session_id(5, False, "forced")) == (5, False, "forced")
    assert parse_origin(origin_session_id(5, True, "auto")) == (5, True, "auto")
    assert parse_origin("3f2a9c") is None  # a WebSocket session's id


def test_response_shapes_follow_openai() -> None:
    c = Completion(completion_id="chatcmpl-x", created=5, model="m", include_usage=True)
    end = StreamEnd(end=3, finish_reason="length", prompt_tokens=7, completion_tokens=3, cached_tokens=0)
    body = completion_body(c, "abc", end)
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "finish_reason": "length",
            "logprobs": None,
            "message": {"role": "assistant", "content": "abc"},
        }
    ]
    assert body["usage"]["total_tokens"] == 10
    chunk = chunk_body(c, {"content": "a"})
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    assert "usage" not in chunk_body(Completion(completion_id="i", created=1, model="m"), {})
    last = usage_chunk(c, end)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3


def test_the_principal_is_anonymous_or_a_hash_of_the_key() -> None:
    assert principal_of({}) == "anonymous"
    assert principal_of({"authorization": "Basic abc"}) == "anonymous"
    alice = principal_of({"authorization": "Bearer sk-alice"})
    assert alice.startswith("key:") and "sk-alice" not in alice
    assert alice == principal_of({"authorization": "bearer  sk-alice "})
    assert alice != principal_of({"authorization": "Bearer sk-bob"})


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_response_format_becomes_the_grammar() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    chat = parse(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        }
    )
    assert chat.params.grammar == GrammarSpec.json_schema(schema)
    assert parse(response_format={"type": "json_object"}).params.grammar == GrammarSpec(
        kind=GrammarKind.JSON_OBJECT
    )
    assert parse(response_format={"type": "text"}).params.grammar is None


def test_tools_are_listed_and_forced_calls_get_a_grammar() -> None:
    auto = parse(tools=[WEATHER])
    assert auto.tool_mode == "auto" and auto.params.grammar is None
    assert auto.messages[0].role == "system" and '"name":"get_weather"' in auto.messages[0].content
    forced = parse(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert forced.tool_mode == "forced" and forced.params.grammar is not None
    assert '"const":"get_weather"' in forced.params.grammar.source
    assert parse(tools=[WEATHER], tool_choice="none").messages == (Message(role="user", content="Hello"),)


def test_tool_history_is_rendered_in_the_generic_format() -> None:
    chat = parse(
        messages=[
            *HELLO,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "4 C, rain"},
        ],
        tools=[WEATHER],
    )
    assert chat.messages[2:] == (
        Message(role="assistant", content='{"name":"get_weather","arguments":{"city":"Oslo"}}'),
        Message(role="tool", content="4 C, rain"),
    )


def test_an_unsupported_schema_keyword_is_named() -> None:
    bad = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(ApiError) as caught:
        parse(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    assert caught.value.code == "unsupported_schema" and "'uniqueItems'" in caught.value.message
    tool = {"type": "function", "function": {"name": "f", "parameters": bad}}
    with pytest.raises(ApiError) as caught:
        parse(tools=[tool])
    assert caught.value.param == "tools[0].function.parameters" and "'uniqueItems'" in caught.value.message


def test_a_deeply_nested_schema_is_refused_before_compiling() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(500):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ApiError) as caught:
        parse(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert (
        caught.value.code == "invalid_schema" and caught.value.param == "response_format.json_schema.schema"
    )
