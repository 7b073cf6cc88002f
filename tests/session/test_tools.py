"""The generic tool-call format's parser (session/conversation/tools.py), pure.

Whatever the chunking of an answer, the streamed events add up to the calls
the whole answer makes (the arguments fragments concatenate to the
arguments' JSON text as written), and an answer that is not a call is text.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.session.conversation.tools import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    ParserEvent,
    Tool,
    ToolCallParser,
    calls_text,
    tool_call_schema,
)

names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)


def stream(parser: ToolCallParser, text: str, cuts: list[int]) -> list[ParserEvent]:
    events: list[ParserEvent] = []
    start = 0
    for cut in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        events += parser.feed(text[start:cut])
        start = cut
    final, _ = parser.finish()
    return events + final


def joined(events: list[ParserEvent]) -> tuple[list[str], dict[int, str], str]:
    names = [e.name for e in events if isinstance(e, CallStart)]
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ArgumentsDelta):
            args[e.index] = args.get(e.index, "") + e.text
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return names, args, content


@settings(max_examples=200, deadline=None)
@given(calls=calls, cuts=st.lists(st.integers(0, 400), max_size=12), mode=st.sampled_from(["auto", "forced"]))
def test_streamed_calls_add_up_to_the_whole_answer(
    calls: list[tuple[str, dict[str, Any]]], cuts: list[int], mode: Any
) -> None:
    answer = calls_text([(name, json.dumps(args)) for name, args in calls])
    events = stream(ToolCallParser("abc", mode), answer, cuts)
    whole = ToolCallParser("abc", mode)
    whole.feed(answer)
    _, made = whole.finish()
    assert made is not None
    assert [(c.name, json.loads(c.arguments)) for c in made] == calls
    names, args, content = joined(events)
    assert names == [c.name for c in made] and content == ""
    assert [args[i] for i in range(len(made))] == [c.arguments for c in made]
    assert [c.call_id for c in made] == [f"call_abc_{i}" for i in range(len(made))]


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 40), max_size=6))
def test_text_stays_text_in_auto_mode(text: str, cuts: list[int]) -> None:
    parser = ToolCallParser("abc", "auto")
    events = stream(parser, text, cuts)
    _, made = parser.finish()
    names, _, content = joined(events)
    if made is None and not names:  # not a call: all of it is text, once
        assert content == text


def test_json_that_is_not_a_call_is_text() -> None:
    parser = ToolCallParser("abc", "auto")
    assert parser.feed('{"answer": 4') == []  # held back: it may still become a call
    events = parser.feed("2}")
    final, made = parser.finish()
    assert made is None and joined(events + final)[2] == '{"answer": 42}'


def test_forced_schema_lists_each_function() -> None:
    tools = [
        Tool(name="a", description="", parameters='{"type":"object"}'),
        Tool(name="b", description="", parameters='{"type":"object","properties":{"x":{"type":"integer"}}}'),
    ]
    one = json.loads(tool_call_schema(tools, parallel=False).source)
    assert [c["properties"]["name"]["const"] for c in one["anyOf"]] == ["a", "b"]
    several = json.loads(tool_call_schema(tools, parallel=True).source)
    assert several["anyOf"][1]["type"] == "array" and several["anyOf"][1]["items"] == one
