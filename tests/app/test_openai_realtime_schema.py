"""The OpenAI Realtime translation alone (no server): the dispatch rule, and
client events mapped onto bargein's, or refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from bargein.app.openai.realtime.endpoint import wants_openai
from bargein.app.openai.realtime.inbound import Inbound, OpenAISession, RealtimeError
from bargein.app.openai.realtime.outbound import Translator
from bargein.protocol import events as pe
from bargein.session.conversation.actions import AddItem, ItemRetrieved, Message
from bargein.session.conversation.state import assistant_item_id
from bargein.session.conversation.tools import call_id


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
            {"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "s"}]}},
            "unsupported",
            "session.tools[0].type",
        ),
        (
            {"type": "session.update", "session": {"tools": [{"type": "function"}]}},
            "missing_required_parameter",
            "session.tools[0].name",
        ),
        (
            {
                "type": "session.update",
                "session": {"tools": [{"name": "f", "parameters": {"maximum": float("inf")}}]},
            },
            "invalid_value",
            "session.tools[0].parameters",
        ),
        (
            {"type": "response.create", "response": {"tool_choice": {"type": "mcp", "server_label": "s"}}},
            "unsupported",
            "response.tool_choice.type",
        ),
        (
            {"type": "response.create", "response": {"tool_choice": "any"}},
            "invalid_value",
            "response.tool_choice",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "{}"}},
            "missing_required_parameter",
            "item.call_id",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call", "name": "f", "arguments": {"a": 1}},
            },
            "invalid_type",
            "item.arguments",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "mcp_call", "id": "m"}},
            "unsupported",
            "item.type",
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


# ---- function calling -----------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
STREAM = "strm_0123456789abcdef"
USAGE = pe.Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=0)


def valid(events: list[dict[str, Any]]) -> list[str]:
    """The events' types, each checked against the SDK's schema."""
    for event in events:
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python(event)
    return [event["type"] for event in events]


def test_session_tools_and_tool_choice_map_onto_bargeins_settings() -> None:
    side = inbound()
    _, (event,) = side.translate(
        {
            "type": "session.update",
            "session": {
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": False,
            },
        }
    )
    (tool,) = event.session.tools
    assert (tool.name, tool.description) == ("get_weather", "The weather in a city.")
    assert isinstance(tool.parameters, pe.JsonText) and json.loads(tool.parameters) == WEATHER["parameters"]
    assert event.session.tool_choice == pe.NamedToolChoice(name="get_weather")
    # the session's parallel_tool_calls applies to its responses (bargein keeps it per response)
    _, (create,) = side.translate({"type": "response.create"})
    assert create.parallel_tool_calls is False and create.tools is None and create.tool_choice is None
    _, (create,) = side.translate(
        {"type": "response.create", "response": {"tools": [], "tool_choice": "none"}}
    )
    assert (create.tools, create.tool_choice) == ((), "none")


def test_a_named_function_outside_the_tools_is_refused() -> None:
    with pytest.raises(RealtimeError) as refused:
        inbound().translate(
            {
                "type": "response.create",
                "response": {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "book"}},
            }
        )
    assert refused.value.code == "invalid_value" and "book" in refused.value.message


def test_function_call_items_are_tool_turns() -> None:
    """A ``function_call`` item is the assistant turn that made the call (the
    generic format, its call id kept); its ``function_call_output`` a ``tool``
    turn naming the call."""
    side = inbound()
    _, (call,) = side.translate(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_abc",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
        }
    )
    assert isinstance(call, AddItem)
    assert call.item == Message(
        role="assistant", content='{"name":"get_weather","arguments":{"city":"Paris"}}'
    )
    assert (call.item.item_id, call.item.call_id) == ("fc_1", "call_abc")
    _, (output,) = side.translate(
        {
            "type": "conversation.item.create",
            "previous_item_id": "fc_1",
            "item": {"type": "function_call_output", "call_id": "call_abc", "output": '{"temp": 21}'},
        }
    )
    assert isinstance(output, AddItem) and output.previous_item_id == "fc_1"
    assert output.item == Message(role="tool", content='{"temp": 21}')
    assert output.item.call_id == "call_abc"


def test_the_session_echo_holds_the_tools_in_force() -> None:
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    translator.translate(pe.SessionUpdated(session=pe.SessionSettings()))
    settings = pe.SessionSettings(
        tools=(
            pe.FunctionTool(
                name="get_weather",
                description="The weather in a city.",
                parameters=pe.JsonText(json.dumps(WEATHER["parameters"], separators=(",", ":"))),
            ),
        ),
        tool_choice=pe.NamedToolChoice(name="get_weather"),
    )
    (updated,) = translator.translate(pe.SessionUpdated(session=settings))
    assert valid([updated]) == ["session.updated"]
    assert updated["session"]["tools"] == [WEATHER]
    assert updated["session"]["tool_choice"] == {"type": "function", "name": "get_weather"}
    (updated,) = translator.translate(pe.SessionUpdated(session=pe.SessionSettings(tool_choice="required")))
    assert (updated["session"]["tools"], updated["session"]["tool_choice"]) == ([], "required")


def tool_response(
    answer: list[str], *, mode: pe.ToolMode = "forced", finish: pe.FinishReasonName = "stop"
) -> list[dict[str, Any]]:
    """The OpenAI events of one tool-mode response whose answer streams as ``answer``'s deltas."""
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    events = translator.translate(
        pe.ResponseCreated(response_id="resp_1", stream_id=STREAM, resume_token="t", tool_mode=mode)
    )
    for i, text in enumerate(answer):
        events += translator.translate(
            pe.ResponseDelta(response_id="resp_1", stream_id=STREAM, start=i, end=i + 1, text=text)
        )
    events += translator.translate(
        pe.ResponseDone(
            response_id="resp_1", stream_id=STREAM, end=len(answer), finish_reason=finish, usage=USAGE
        )
    )
    return events


def test_a_call_streams_as_a_function_call_item() -> None:
    """A forced call: a ``function_call`` item whose arguments stream as
    deltas, never as text; ids as bargein's (item: the assistant item's;
    call: :func:`call_id`)."""
    events = tool_response(['{"name":"get_', 'weather","argu', 'ments":{"city":', ' "Paris"}', "}"])
    assert valid(events) == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    added = events[2]["item"]
    assert added == {
        "id": assistant_item_id(STREAM),
        "object": "realtime.item",
        "type": "function_call",
        "status": "in_progress",
        "call_id": call_id(STREAM, 0),
        "name": "get_weather",
        "arguments": "",
    }
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(d["delta"] for d in deltas) == '{"city": "Paris"}'
    assert [d["bargein"] for d in deltas] == [{"start": 2, "end": 3}, {"start": 3, "end": 4}]  # for a resume
    assert {(d["item_id"], d["call_id"], d["output_index"]) for d in deltas} == {
        (added["id"], added["call_id"], 0)
    }
    done = events[6]
    assert (done["name"], done["arguments"]) == ("get_weather", '{"city": "Paris"}')
    item = {**added, "status": "completed", "arguments": '{"city": "Paris"}'}
    assert events[7]["item"] == events[8]["item"] == item
    response = events[-1]["response"]
    assert (response["status"], response["output"]) == ("completed", [item])


def test_several_calls_are_several_items() -> None:
    events = tool_response(['[{"name":"a","arguments":{}},', '{"name":"b","arguments":{"x":1}}]'])
    valid(events)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    first = assistant_item_id(STREAM)
    assert [(e["output_index"], e["item"]["id"], e["item"]["call_id"]) for e in added] == [
        (0, first, call_id(STREAM, 0)),
        (1, f"{first}_1", call_id(STREAM, 1)),
    ]
    chained = [e["previous_item_id"] for e in events if e["type"] == "conversation.item.added"]
    assert chained == [None, first]  # each call's item follows the one before
    output = events[-1]["response"]["output"]
    assert [(i["name"], i["arguments"], i["status"]) for i in output] == [
        ("a", "{}", "completed"),
        ("b", '{"x":1}', "completed"),
    ]


def test_a_text_answer_in_auto_mode_is_announced_once_known() -> None:
    """Tools in force, the model answers in words: the message item is
    announced at its first text (not before: it could have been a call)."""
    events = tool_response(["  ", "Sunny", " today."], mode="auto")
    kinds = valid(events)
    assert kinds == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    first = events[5]
    assert (first["delta"], first["bargein"], first["output_index"]) == ("  Sunny", {"start": 0, "end": 2}, 0)
    (item,) = events[-1]["response"]["output"]
    assert (item["type"], item["content"][0]["text"]) == ("message", "  Sunny today.")


def test_json_that_is_no_call_is_text_at_the_end() -> None:
    events = tool_response(['{"a"', ": 1}"], mode="auto")
    valid(events)
    texts = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert texts == ['{"a": 1}']
    assert not [e for e in events if "function_call" in e["type"]]


def test_a_call_cut_while_its_arguments_stream_ends_incomplete() -> None:
    events = tool_response(['{"name":"get_weather",', '"arguments":{"city":"Pa'], finish="interrupted")
    valid(events)
    assert not [e for e in events if e["type"].startswith("response.output_text")]
    # a cut call is no call to run: no arguments done; its item says what it held
    assert not [e for e in events if e["type"] == "response.function_call_arguments.done"]
    item = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert (item["type"], item["status"], item["arguments"]) == ("function_call", "incomplete", '{"city":"Pa')
    response = events[-1]["response"]
    assert (response["status"], response["output"]) == ("cancelled", [item])


@pytest.mark.parametrize("mode", ["auto", "forced"])
def test_a_response_cut_before_a_call_is_named_has_no_output(mode: pe.ToolMode) -> None:
    """What the parser held back of a cut answer (a call's start) is not text either."""
    events = tool_response([' {"name":"get_'], mode=mode, finish="interrupted")
    assert valid(events)[-1] == "response.done"
    assert events[-1]["response"]["output"] == []


def test_tool_turns_are_retrieved_as_function_call_items() -> None:
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    item_id = assistant_item_id(STREAM)
    made = Message(
        role="assistant", content='{"name":"get_weather","arguments":{"city":"Paris"}}', item_id=item_id
    )
    result = Message(role="tool", content="21C", item_id="item_2", call_id=call_id(STREAM, 0))
    (call,) = translator.translate(ItemRetrieved(item=made))
    (output,) = translator.translate(ItemRetrieved(item=result))
    valid([call, output])
    assert call["item"] == {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "call_id": call_id(STREAM, 0),
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    }
    assert output["item"] == {
        "id": "item_2",
        "object": "realtime.item",
        "type": "function_call_output",
        "status": "completed",
        "call_id": call_id(STREAM, 0),
        "output": "21C",
    }
    # a client's function_call item keeps the call id it was given
    given = Message(role="assistant", content=made.content, item_id="fc_1", call_id="call_abc")
    (retrieved,) = translator.translate(ItemRetrieved(item=given))
    assert retrieved["item"]["call_id"] == "call_abc"
    # an answer in words stays a message
    (text,) = translator.translate(ItemRetrieved(item=Message(role="assistant", content="{hi}", item_id="x")))
    assert text["item"]["type"] == "message"


def resumed(
    from_: int, answer: list[str], calls: tuple[pe.FunctionCall, ...] | None, mode: pe.ToolMode = "forced"
) -> list[dict[str, Any]]:
    """The OpenAI events of a tool-mode response resumed (``bargein.resume``) on a new connection."""
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    events = translator.translate(
        pe.StreamResumed(stream_id=STREAM, response_id="resp_1", from_=from_, status="live", tool_mode=mode)
    )
    for i, text in enumerate(answer):
        offset = from_ + i
        events += translator.translate(
            pe.ResponseDelta(response_id="resp_1", stream_id=STREAM, start=offset, end=offset + 1, text=text)
        )
    end = from_ + len(answer)
    return events + translator.translate(
        pe.ResponseDone(
            response_id="resp_1",
            stream_id=STREAM,
            end=end,
            finish_reason="stop",
            usage=USAGE,
            tool_calls=calls,
        )
    )


def test_a_call_resumed_from_its_start_streams_as_on_its_first_connection() -> None:
    events = resumed(0, ['{"name":"get_weather","arguments":', '{"city":"Paris"}}'], None)
    kinds = valid(events[1:])  # bargein.stream.resumed: bargein's own event
    assert kinds.index("response.function_call_arguments.delta") < kinds.index(
        "response.function_call_arguments.done"
    )
    assert not [k for k in kinds if k.startswith("response.output_text")]


def test_a_call_resumed_mid_answer_comes_whole_at_its_end() -> None:
    """From an offset past the answer's start no parser can read it: the
    deltas are held, and bargein's ``tool_calls`` give the calls at the end
    (never the JSON as text)."""
    call = pe.FunctionCall(call_id=call_id(STREAM, 0), name="get_weather", arguments='{"city":"Paris"}')
    events = resumed(9, ['"Paris"', "}}"], (call,))
    kinds = valid(events[1:])
    assert kinds == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    (item,) = events[-1]["response"]["output"]
    assert (item["type"], item["call_id"], item["arguments"], item["status"]) == (
        "function_call",
        call.call_id,
        '{"city":"Paris"}',
        "completed",
    )


def test_text_resumed_mid_answer_comes_at_its_end() -> None:
    events = resumed(3, [" is", " sunny."], None, mode="auto")
    valid(events[1:])
    (delta,) = [e for e in events if e["type"] == "response.output_text.delta"]
    assert (delta["delta"], delta["bargein"]) == (" is sunny.", {"start": 3, "end": 5})
    (item,) = events[-1]["response"]["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == " is sunny."


def test_a_spoken_call_has_no_audio_part() -> None:
    """bargein speaks no call: an answer of calls has no message, so no
    audio part, not even the ``--voice-tool-filler`` phrase bargein may say
    while the client runs the calls (OpenAI's audio is a message's)."""
    translator = Translator(session=OpenAISession(audio_output=True), model="m", conversation=list)
    created = pe.ResponseCreated(
        response_id="resp_1",
        stream_id=STREAM,
        resume_token="t",
        modalities=("text", "audio"),
        tool_mode="forced",
    )
    events = translator.translate(created)
    events += translator.translate(
        pe.ResponseDelta(
            response_id="resp_1", stream_id=STREAM, start=0, end=1, text='{"name":"f","arguments":{}}'
        )
    )
    filler = pe.ResponseAudioDelta(
        response_id="resp_1", stream_id=STREAM, audio=b"\0\0" * 240, start_ms=0, end_ms=10, text_end=0
    )
    events += translator.translate(filler)
    events += translator.translate(pe.ResponseAudioDone(response_id="resp_1", stream_id=STREAM, end_ms=10))
    events += translator.translate(
        pe.ResponseDone(response_id="resp_1", stream_id=STREAM, end=1, finish_reason="stop", usage=USAGE)
    )
    kinds = valid(events)
    assert not [k for k in kinds if "audio" in k or k.startswith("response.content_part")]
    (item,) = events[-1]["response"]["output"]
    assert (item["type"], item["status"]) == ("function_call", "completed")


def test_a_forced_call_cut_and_resumed_mid_answer_is_never_text() -> None:
    """A forced call cut by max_tokens, resumed from its middle on a new
    connection: no message, no text, no arguments ``done`` (no call to run)."""
    translator = Translator(session=OpenAISession(audio_output=False), model="m", conversation=list)
    events = translator.translate(
        pe.StreamResumed(stream_id=STREAM, response_id="resp_1", from_=4, status="live", tool_mode="forced")
    )
    events += translator.translate(
        pe.ResponseDelta(response_id="resp_1", stream_id=STREAM, start=4, end=5, text=" note of the details")
    )
    events += translator.translate(
        pe.ResponseDone(response_id="resp_1", stream_id=STREAM, end=5, finish_reason="length", usage=USAGE)
    )
    kinds = [e["type"] for e in events]
    assert not [k for k in kinds if k.startswith("response.output_text") or k.endswith("arguments.done")]
    assert events[-1]["response"]["output"] == []


def test_text_only_output_on_a_server_without_voice_is_no_audio_setting() -> None:
    """``output_modalities: ["text"]`` is all a server without voice does: the
    update (tools with it) goes through with no audio settings to refuse."""
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    _, (update,) = inbound(has_voice=False).translate(
        {
            "type": "session.update",
            "session": {"type": "realtime", "output_modalities": ["text"], "tools": [tool]},
        }
    )
    assert isinstance(update, pe.SessionUpdate)
    assert update.session.audio is None
    assert [t.name for t in update.session.tools or ()] == ["get_weather"]
