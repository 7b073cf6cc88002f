"""Function calling on bargein's own protocol, over a real socket with the real model (issue 40).

A forced call (``tool_choice`` naming a function) is always a valid call:
its arguments stream as ``response.function_call_arguments.delta`` events
that add up to JSON valid against the function's schema, and
``response.done.tool_calls`` lists it. The tool's result goes back as a
``tool`` item, and the next answer's prompt holds the call and the result.
A barge-in while a call's arguments stream leaves no call in the
conversation; a resume replays the call's events exactly.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import LiveServer

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": WEATHER,
    },
    {
        "type": "function",
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object"},
    },
]
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


async def until_done(client: RealtimeClient, response_id: str) -> list[dict[str, Any]]:
    """Events up to and including ``response_id``'s ``response.done``."""
    events = []
    while True:
        event = await client._recv()
        events.append(event)
        if event["type"] == "error":
            raise AssertionError(event)
        if event["type"] == "response.done" and event["response_id"] == response_id:
            return events


async def test_a_forced_call_streams_valid_arguments_and_its_result_answers(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send({"type": "session.update", "session": {"tools": TOOLS}})
        updated = await client._recv()
        while updated["type"] != "session.updated":
            updated = await client._recv()
        assert [t["name"] for t in updated["session"]["tools"]] == ["get_weather", "get_time"]
        assert updated["session"]["tool_choice"] == "auto"
        await client.send(
            {
                "type": "response.create",
                "response_id": "call",
                "input": ASK,
                "tool_choice": {"type": "function", "name": "get_weather"},
                "temperature": 0,
                "max_tokens": 64,
            }
        )
        events = await until_done(client, "call")
        created = next(e for e in events if e["type"] == "response.created")
        assert created["tool_mode"] == "forced"
        text = "".join(e["text"] for e in events if e["type"] == "response.delta")
        deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
        (done_args,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        done = events[-1]
        assert done["finish_reason"] == "stop"
        (call,) = done["tool_calls"]
        assert call["name"] == "get_weather" == done_args["name"]
        assert call["call_id"] == done_args["call_id"] and all(
            d["call_id"] == call["call_id"] for d in deltas
        )
        assert "".join(d["delta"] for d in deltas) == call["arguments"] == done_args["arguments"]
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
        assert json.loads(text) == {"name": "get_weather", "arguments": json.loads(call["arguments"])}
        # a late cancel of the finished call (the user spoke while the client ran it) keeps it,
        # and its response.done again lists it
        await client.send({"type": "response.cancel", "response_id": "call", "heard_chars": 3})
        again = (await until_done(client, "call"))[-1]
        assert again["tool_calls"] == done["tool_calls"]

        result = '{"temperature": 18, "sky": "clear"}'
        await client.send(
            {
                "type": "response.create",
                "response_id": "answer",
                "input": [{"role": "tool", "content": result, "tool_call_id": call["call_id"]}],
                "tool_choice": "none",
                "temperature": 0,
                "max_tokens": 8,
            }
        )
        events = await until_done(client, "answer")
        assert "tool_mode" not in next(e for e in events if e["type"] == "response.created")
        assert "tool_calls" not in events[-1]
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    # the call as the model made it, then its result; tool_choice none lists no functions
    assert f"<|im_start|>assistant\n{text}<|im_end|>" in prompt
    assert f"<|im_start|>tool\n{result}<|im_end|>" in prompt
    assert "You can call these functions" not in prompt


async def test_a_barge_in_while_arguments_stream_leaves_no_call(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as client:
        long_text = {"type": "object", "properties": {"text": {"type": "string", "minLength": 400}}}
        tools = [{"type": "function", "name": "write_note", "parameters": long_text}]
        await client.send(
            {
                "type": "response.create",
                "response_id": "call",
                "input": [{"role": "user", "content": "Write a long note about dragons."}],
                "tools": tools,
                "tool_choice": "required",
                "temperature": 0,
                "max_tokens": 64,
            }
        )
        streamed = 0
        while streamed < 2:
            event = await client._recv()
            assert event["type"] != "error", event
            streamed += event["type"] == "response.function_call_arguments.delta"
        await client.send({"type": "response.cancel", "response_id": "call"})
        events = await until_done(client, "call")
        assert events[-1]["finish_reason"] == "interrupted"
        assert "tool_calls" not in events[-1]
        assert not [e for e in events if e["type"] == "response.function_call_arguments.done"]
        await client.send(
            {
                "type": "response.create",
                "response_id": "next",
                "input": [{"role": "user", "content": "Never mind. Say hi."}],
                "temperature": 0,
                "max_tokens": 4,
            }
        )
        await until_done(client, "next")
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    assert "write_note" not in prompt  # neither the cut call nor the tools (the session has none)
    assert "<|im_start|>assistant\n<|im_end|>" in prompt  # the cut turn kept nothing
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks


async def test_a_resumed_call_replays_its_events_exactly(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {
                "type": "response.create",
                "response_id": "call",
                "input": ASK,
                "tools": TOOLS,
                "tool_choice": "required",
                "temperature": 0,
                "max_tokens": 64,
            }
        )
        events = await until_done(client, "call")
        created = next(e for e in events if e["type"] == "response.created")
        deltas = [e for e in events if e["type"] == "response.delta"]
        middle = deltas[len(deltas) // 2]["end"]
        await client.send(
            {
                "type": "stream.resume",
                "stream_id": created["stream_id"],
                "resume_token": created["resume_token"],
                "from": middle,
            }
        )
        replay = await until_done(client, "call")

    def arguments(events: list[dict[str, Any]]) -> str:
        return "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")

    # what the client held at the offset, then the replay: the call's arguments, each character once
    held = next(i for i, e in enumerate(events) if e["type"] == "response.delta" and e["end"] > middle)
    (call,) = events[-1]["tool_calls"]
    assert arguments(events[:held]) + arguments(replay) == call["arguments"]
    assert [e for e in replay if e["type"] == "response.function_call_arguments.done"] == [
        e for e in events if e["type"] == "response.function_call_arguments.done"
    ]
    assert replay[-1]["tool_calls"] == events[-1]["tool_calls"]


async def test_a_schema_keyword_the_grammar_cannot_enforce_is_refused_and_the_connection_goes_on(
    live_server: LiveServer,
) -> None:
    bad = {"type": "function", "name": "f", "parameters": {"type": "object", "uniqueItems": True}}
    async with RealtimeClient(live_server.ws_url) as client:
        for event in (
            {"type": "session.update", "session": {"tools": [bad]}},
            {"type": "response.create", "response_id": "r", "input": ASK, "tools": [bad]},
        ):
            await client.send(event)
            error = await client._recv()
            assert (error["type"], error["code"]) == ("error", "invalid_parameter")
            assert "keyword 'uniqueItems'" in error["message"] and ".parameters'" in error["message"]
        assert error["response_id"] == "r"
        await client.send({"type": "ping"})
        assert (await client._recv())["type"] == "pong"
