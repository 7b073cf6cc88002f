"""Structured outputs and tools over HTTP with the official ``openai`` SDK (issue 40).

A real server on the bundled model (``live_server``'s engine, a node with a
larger ``max_tokens``): ``response_format`` ``json_schema`` answers validate
with ``jsonschema`` for hypothesis-generated schemas; ``tool_choice``
``required`` and named functions give valid calls; streamed and
non-streamed answers agree (greedy); a tool-call stream resumed from an SSE
id continues its arguments exactly; a schema keyword the grammar library
cannot enforce is a 400 naming it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from loadtests.structured_schemas import prompt_for, schemas
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer, node_on_engine

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
BOOKING = {
    "type": "object",
    "properties": {
        "people": {"type": "integer", "minimum": 1, "maximum": 12},
        "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
    },
    "required": ["people", "time"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "book_table", "description": "Book a restaurant table.", "parameters": BOOKING},
    },
]
SCHEMAS_OF = {"get_weather": WEATHER, "book_table": BOOKING}
ASK: list[Any] = [
    {"role": "user", "content": "What's the weather in Paris? And book a table for two at 8pm."}
]


@pytest.fixture(scope="module")
def node(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """A node on the shared engine whose answers may be long enough for any generated schema."""
    node_settings = Settings(
        session=SessionConfig(max_tokens=320, default_max_tokens=32, max_frame_bytes=MAX_FRAME_BYTES),
        server=ServerConfig(port=0, log_level="warning", debug_endpoints=True),  # keeps the prompts
    )
    with node_on_engine(live_server, node_settings) as node:
        yield node


@pytest.fixture(scope="module")
def server(node: EmbeddedServer) -> str:
    return f"http://{node.host}:{node.port}"


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server + "/v1", api_key="sk-test", max_retries=0, timeout=300) as client:
        yield client


# no shrinking: each example is a model answer (seconds); the failing schema is in the message
@settings(
    max_examples=20,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(schema=schemas())
def test_json_schema_answers_validate(client: openai.OpenAI, schema: dict[str, Any]) -> None:
    reply = client.chat.completions.create(
        model="bargein",
        messages=prompt_for(schema),  # type: ignore[arg-type]
        max_tokens=320,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", (schema, choice.message.content)
    jsonschema.validate(json.loads(choice.message.content or ""), schema)


def check_calls(calls: list[tuple[str, str]], allowed: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in allowed
        jsonschema.validate(json.loads(arguments), SCHEMAS_OF[name])


def made(reply: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls or []]


@pytest.mark.parametrize("seed", range(4))
def test_required_and_named_tool_choice_give_valid_calls(client: openai.OpenAI, seed: int) -> None:
    for choice, allowed in [
        ("required", {"get_weather", "book_table"}),
        ({"type": "function", "function": {"name": "book_table"}}, {"book_table"}),
    ]:
        reply = client.chat.completions.create(
            model="bargein",
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        assert reply.choices[0].message.content is None
        check_calls(made(reply), allowed)
        assert all(
            c.id.startswith("call_") and c.type == "function"
            for c in reply.choices[0].message.tool_calls or []
        )


def streamed_calls(client: openai.OpenAI, **request: Any) -> tuple[list[tuple[str, str]], str | None, str]:
    """The calls of a streamed answer as an SDK user assembles them, its finish reason and text."""
    calls: dict[int, list[str]] = {}
    finish, text = None, ""
    for chunk in client.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            assert delta.function is not None
            if delta.index not in calls:  # a call's first chunk names it
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = [delta.function.name, ""]
            else:
                assert delta.id is None and delta.function.name is None
            calls[delta.index][1] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [(name, args) for name, args in (calls[i] for i in sorted(calls))], finish, text


def test_streamed_and_non_streamed_answers_agree(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": "bargein",
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 200,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**request)
    calls, finish, text = streamed_calls(client, **request)
    assert (calls, finish, text) == (made(whole), "tool_calls", "")
    check_calls(calls, {"get_weather", "book_table"})

    schema = {"type": "object", "properties": {"city": WEATHER["properties"]["city"]}, "required": ["city"]}
    request = {
        "model": "bargein",
        "messages": [{"role": "user", "content": "Name a city."}],
        "max_tokens": 60,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    }
    whole = client.chat.completions.create(**request)
    calls, finish, text = streamed_calls(client, **request)
    assert (text, finish, calls) == (whole.choices[0].message.content, "stop", [])


def test_auto_tool_choice_and_tool_results_in_the_prompt(
    client: openai.OpenAI, live_server: LiveServer, node: EmbeddedServer
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    reply = client.chat.completions.create(
        model="bargein",
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees and rain"},
        ],
        tools=TOOLS,
        max_tokens=40,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert node.state.service is not None
    prompt = live_server.tokenizer.decode(node.state.service.recent_requests[-1].prompt_token_ids)
    assert '{"name":"get_weather","arguments":{"city":"Oslo"}}' in prompt
    assert "<|im_start|>tool\n4 degrees and rain<|im_end|>" in prompt
    assert '"name":"book_table"' in prompt.split("<|im_start|>user")[0]  # the tools' system message


def test_unsupported_schema_keyword_is_a_400_naming_it(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="bargein",
            messages=ASK,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema, "strict": True},
            },
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_schema" and "'uniqueItems'" in error["message"]
    assert error["param"] == "response_format.json_schema.schema"


def sse_events(response: httpx.Response) -> list[tuple[str | None, dict[str, Any] | None]]:
    """``(id, chunk)`` of each event (chunk None for ``[DONE]``)."""
    events, event_id = [], None
    for line in response.iter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            events.append((event_id, None if data == "[DONE]" else json.loads(data)))
        elif not line:
            event_id = None
    return events


def arguments_of(events: list[tuple[str | None, dict[str, Any] | None]]) -> str:
    return "".join(
        call["function"].get("arguments") or ""
        for _, chunk in events
        if chunk and chunk["choices"]
        for call in chunk["choices"][0]["delta"].get("tool_calls") or []
    )


@given(cut=st.integers(1, 1000))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_resumed_tool_call_stream_continues_its_arguments_exactly(server: str, cut: int) -> None:
    body = {
        "model": "bargein",
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 100,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=server, timeout=120) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = sse_events(response)
        ids = [i for i, _ in events if i is not None]
        resume_at = ids[cut % len(ids)]
        had = events[: max(k for k, (i, _) in enumerate(events) if i == resume_at) + 1]
        stream_id = resume_at.rpartition(":")[0]
        with http.stream(
            "GET", f"/v1/streams/{stream_id}/events", headers={"Last-Event-ID": resume_at}
        ) as response:
            rest = sse_events(response)
    whole = arguments_of(events)
    assert arguments_of(had) + arguments_of(rest) == whole
    jsonschema.validate(json.loads(whole), WEATHER)
    finish = [
        c["choices"][0]["finish_reason"]
        for _, c in rest
        if c and c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["tool_calls"] and rest[-1][1] is None
