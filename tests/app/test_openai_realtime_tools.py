"""Function calling on OpenAI's Realtime endpoint, driven by the official
``openai`` SDK against the real server and model: a call forced by a named
``tool_choice`` streams as a ``function_call`` item whose arguments are valid
against the function's schema, its output is answered in words, and a call
cut while its arguments stream ends ``incomplete``, leaving no dangling call."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest

from tests.app.conftest import LiveServer
from tests.app.test_openai_realtime import TEXT_ONLY, next_of, realtime, user

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    # strict, as OpenAI's guide advises: a small model forced to call adds keys and rambles otherwise
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# arguments longer than a response's 64 tokens: a cancel always lands while they stream
STORY = {
    "type": "function",
    "name": "write_story",
    "description": "Write a story down.",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 600}},
        "required": ["text"],
    },
}


def forced(tool: dict[str, Any]) -> dict[str, Any]:
    """A text session with ``tool``, which every response must call."""
    return {**TEXT_ONLY, "tools": [tool], "tool_choice": {"type": "function", "name": tool["name"]}}


async def ask(conn: Any, prompt: str, response: dict[str, Any]) -> list[Any]:
    """Add a user item and ask for a response: its events up to ``response.done``."""
    await conn.conversation.item.create(item=user(prompt))
    await next_of(conn, "conversation.item.done")
    await conn.send({"type": "response.create", "response": {"temperature": 0, **response}})
    seen: list[Any] = []
    await next_of(conn, "response.done", seen)
    return seen


async def test_a_forced_call_then_its_output_answered_in_words(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        await conn.session.update(session=forced(WEATHER))
        updated = await next_of(conn, "session.updated")
        assert [tool.name for tool in updated.session.tools] == ["get_weather"]
        assert updated.session.tool_choice.name == "get_weather"
        seen = await ask(conn, "What's the weather in Paris?", {"max_output_tokens": 64})
        kinds = [e.type for e in seen]
        assert not [k for k in kinds if k.startswith(("response.output_text", "response.content_part"))]
        added = next(e for e in seen if e.type == "response.output_item.added").item
        assert (added.type, added.name, added.status, added.arguments) == (
            "function_call",
            "get_weather",
            "in_progress",
            "",
        )
        deltas = [e for e in seen if e.type == "response.function_call_arguments.delta"]
        arguments = "".join(d.delta for d in deltas)
        assert {(d.item_id, d.call_id, d.output_index) for d in deltas} == {(added.id, added.call_id, 0)}
        jsonschema.validate(json.loads(arguments), WEATHER["parameters"])
        done_args = next(e for e in seen if e.type == "response.function_call_arguments.done")
        assert (done_args.name, done_args.arguments, done_args.call_id) == (
            "get_weather",
            arguments,
            added.call_id,
        )
        done = seen[-1].response
        assert done.status == "completed"
        (call,) = done.output
        assert (call.type, call.id, call.call_id, call.status, call.arguments) == (
            "function_call",
            added.id,
            added.call_id,
            "completed",
            arguments,
        )
        # the conversation holds the call
        await conn.conversation.item.retrieve(item_id=call.id)
        held = (await next_of(conn, "conversation.item.retrieved")).item
        assert (held.type, held.call_id, held.name) == ("function_call", call.call_id, "get_weather")
        assert json.loads(held.arguments) == json.loads(arguments)
        # its result, then an answer in words
        output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}
        await conn.conversation.item.create(item=output)
        result = (await next_of(conn, "conversation.item.done")).item
        assert (result.type, result.call_id, result.output) == (
            "function_call_output",
            call.call_id,
            '{"temp_c": 21}',
        )
        await conn.send(
            {
                "type": "response.create",
                "response": {"tool_choice": "none", "max_output_tokens": 16, "temperature": 0},
            }
        )
        seen = []
        done = (await next_of(conn, "response.done", seen)).response
        (message,) = done.output
        assert message.type == "message" and message.content[0].text
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert text == message.content[0].text
        prompt = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        assert "What's the weather in Paris?" in prompt and '{"temp_c": 21}' in prompt
        assert '"name":"get_weather"' in prompt  # the call, as the model made it


async def test_a_call_cancelled_while_its_arguments_stream_is_incomplete(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        await conn.session.update(session=forced(STORY))
        await next_of(conn, "session.updated")
        await conn.conversation.item.create(item=user("Write me a story about a dragon."))
        await next_of(conn, "conversation.item.done")
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        seen: list[Any] = []
        delta = await next_of(conn, "response.function_call_arguments.delta", seen)
        await conn.response.cancel()
        done = (await next_of(conn, "response.done", seen)).response
        assert not [e for e in seen if e.type.startswith("response.output_text")]
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
        (call,) = done.output
        assert (call.type, call.id, call.status) == ("function_call", delta.item_id, "incomplete")
        item_done = next(e for e in seen if e.type == "response.output_item.done").item
        assert item_done.status == "incomplete"
        # a cut call is no call to run: its arguments never come as done
        assert not [e for e in seen if e.type == "response.function_call_arguments.done"]
        # no dangling call: the session kept the cut turn empty (no call awaits a result)...
        await conn.conversation.item.retrieve(item_id=call.id)
        held = (await next_of(conn, "conversation.item.retrieved")).item
        assert (held.type, held.role, held.content[0].text) == ("message", "assistant", "")
        # ... and the next prompt holds none of it
        await conn.send(
            {"type": "response.create", "response": {"tool_choice": "none", "max_output_tokens": 2}}
        )
        await next_of(conn, "response.done")
        prompt = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        assert "Write me a story about a dragon." in prompt
        assert '"name":"write_story"' not in prompt


async def test_a_call_the_client_adds_is_kept_with_its_call_id(live_server: LiveServer) -> None:
    """History replayed by the client (a call and its output, as OpenAI's
    items) joins the conversation as the model's own calls would: the call in
    the generic format, retrieved with the client's ``call_id``."""
    async with realtime(live_server.http_url) as conn:
        await conn.session.update(session={**TEXT_ONLY, "tools": [WEATHER]})
        await next_of(conn, "session.updated")
        await conn.conversation.item.create(item=user("What's the weather in Oslo?"))
        await next_of(conn, "conversation.item.done")
        call = {
            "type": "function_call",
            "id": "item_call",
            "call_id": "call_client_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        }
        await conn.conversation.item.create(item=call)
        added = (await next_of(conn, "conversation.item.done")).item
        assert (added.type, added.call_id, added.name) == ("function_call", "call_client_1", "get_weather")
        output = {"type": "function_call_output", "call_id": "call_client_1", "output": "snow, -3 C"}
        await conn.conversation.item.create(item=output)
        await next_of(conn, "conversation.item.done")
        await conn.conversation.item.retrieve(item_id="item_call")
        held = (await next_of(conn, "conversation.item.retrieved")).item
        assert (held.type, held.call_id, json.loads(held.arguments)) == (
            "function_call",
            "call_client_1",
            {"city": "Oslo"},
        )
        await conn.send(
            {"type": "response.create", "response": {"tool_choice": "none", "max_output_tokens": 2}}
        )
        await next_of(conn, "response.done")
        prompt = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        assert prompt.index('"name":"get_weather"') < prompt.index("snow, -3 C")


async def resume_from(conn: Any, created: Any, offset: int, session: dict[str, str] | None = None) -> Any:
    """``bargein.resume`` of ``created``'s stream from ``offset`` (and of
    ``session``, when given): the replayed response's ``response.done`` and
    the events before it."""
    stream = created.response.bargein
    resume: dict[str, Any] = {
        "type": "bargein.resume",
        "stream": {"stream_id": stream["stream_id"], "resume_token": stream["resume_token"], "from": offset},
    }
    if session is not None:
        resume |= {"session_id": session["session_id"], "session_token": session["session_token"]}
    await conn.send(resume)
    seen: list[Any] = []
    await next_of(conn, "response.done", seen)
    return seen


async def test_a_call_replayed_from_its_middle_comes_whole_never_as_text(live_server: LiveServer) -> None:
    """``bargein.resume`` of a call's stream from an offset inside its JSON:
    the call whole at the response's end (nothing can read JSON from its
    middle), never as text, nothing generated again."""
    async with realtime(live_server.http_url) as conn:
        await conn.session.update(session=forced(WEATHER))
        await next_of(conn, "session.updated")
        await conn.conversation.item.create(item=user("What's the weather in Paris?"))
        await next_of(conn, "conversation.item.done")
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        seen: list[Any] = []
        first = (await next_of(conn, "response.done", seen)).response
        created = next(e for e in seen if e.type == "response.created")
        delta = next(e for e in seen if e.type == "response.function_call_arguments.delta")
        requests = len(live_server.recent_requests())
        seen = await resume_from(conn, created, delta.bargein["end"])
        assert not [e for e in seen if e.type.startswith("response.output_text")]
        done = seen[-1].response
        assert done.id == first.id and done.status == "completed"
        assert [(c.type, c.id, c.call_id, c.arguments) for c in done.output] == [
            (c.type, c.id, c.call_id, c.arguments) for c in first.output
        ]
        assert len(live_server.recent_requests()) == requests  # nothing generated twice


async def test_a_call_resumed_after_a_drop_is_never_text(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url, on_reconnecting=lambda _: None) as conn:
        ids = conn.created.session.bargein
        await conn.session.update(session=forced(WEATHER))
        await next_of(conn, "session.updated")
        await conn.conversation.item.create(item=user("What's the weather in Paris?"))
        await next_of(conn, "conversation.item.done")
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        created = await next_of(conn, "response.created")
        delta = await next_of(conn, "response.function_call_arguments.delta")
        for writer in list(live_server.state.writers):  # the server restarts this connection
            closing = asyncio.run_coroutine_threadsafe(writer.close(1012), writer.task.get_loop())
            await asyncio.wrap_future(closing)
        await next_of(conn, "session.created")  # the SDK reconnected
        seen = await resume_from(conn, created, delta.bargein["end"], ids)
        assert not [e for e in seen if e.type.startswith("response.output_text")]
        (call,) = seen[-1].response.output
        assert (call.type, call.call_id) == ("function_call", delta.call_id)


async def test_a_spoken_session_makes_its_call_silently(voice_server: LiveServer) -> None:
    """Audio output on: an answer of calls is no speech (bargein reads no
    call aloud), so its response has no audio and no transcript, only the call."""
    async with realtime(voice_server.http_url) as conn:
        session = {**forced(WEATHER), "output_modalities": ["audio"]}
        await conn.session.update(session=session)
        await next_of(conn, "session.updated")
        seen = await ask(conn, "What's the weather in Paris?", {"max_output_tokens": 64})
        assert not [e for e in seen if "audio" in e.type or e.type.startswith("response.content_part")]
        (call,) = seen[-1].response.output
        assert (call.type, call.status) == ("function_call", "completed")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
