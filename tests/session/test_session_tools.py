"""Tools on bargein's protocol, in the conversation's state machine (no model):
what a response's prompt and grammar hold, what a cut call leaves, and the
delivery's reading of an answer for calls (issue 40)."""

from __future__ import annotations

import json

import pytest

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.actions import (
    Delivered,
    GenerationFinished,
    Message,
    Send,
    StartDelivery,
    Submit,
    Submitted,
)
from bargein.session.conversation.state import Conversation
from bargein.session.conversation.tools import UNANSWERED_CALL, settled_calls
from bargein.session.runtime.delivery import Delivery
from bargein.session.runtime.saved import SavedSession, snapshot
from bargein.session.runtime.tool_check import tools_problem
from bargein.session.runtime.tool_events import ToolCallEvents, spoken_text
from bargein.session.streams.log import LogEntry, MemoryTokenLog, StreamWrite
from tests.session.test_delivery import finish, new_stream
from tests.session.test_session import make_session

WEATHER = pe.FunctionTool(
    name="get_weather",
    description="The weather now.",
    parameters=pe.JsonText('{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}'),
)
TIME = pe.FunctionTool(name="get_time")
CALL = '{"name":"get_weather","arguments":{"city":"Oslo"}}'


def create(session: Conversation, **fields: object) -> list[object]:
    return session.handle(
        pe.ResponseCreate(input=(pe.InputItem(role="user", content="Weather?"),), **fields), 0.0
    )  # type: ignore[arg-type]


def update(session: Conversation, **fields: object) -> object:
    (action,) = session.handle(pe.SessionUpdate(session=pe.SessionSettings(**fields)), 0.0)  # type: ignore[arg-type]
    assert isinstance(action, Send)
    return action.event


def submit_of(actions: list[object]) -> Submit:
    submit = actions[-1]
    assert isinstance(submit, Submit), actions
    return submit


def test_session_tools_are_listed_and_auto_reads_the_answer_for_calls() -> None:
    session = make_session()
    updated = update(session, tools=(WEATHER, TIME), instructions="Be brief.")
    assert isinstance(updated, pe.SessionUpdated)
    assert [t.name for t in updated.session.tools or ()] == ["get_weather", "get_time"]
    assert updated.session.tool_choice == "auto"
    submit = submit_of(create(session))
    system = submit.messages[0]
    assert system.role == "system" and system.content.startswith("Be brief.\n\nYou can call these functions")
    assert '"name":"get_weather"' in system.content
    assert submit.params.grammar is None  # auto: the model chooses
    actions = session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    created, start = actions
    assert isinstance(created, Send) and created.event.tool_mode == "auto"
    assert isinstance(start, StartDelivery) and start.tool_mode == "auto"


def test_a_named_choice_forces_a_call_by_grammar_and_none_lists_nothing() -> None:
    session = make_session()
    update(session, tools=(WEATHER, TIME))
    submit = submit_of(
        create(session, tool_choice=pe.NamedToolChoice(name="get_weather"), parallel_tool_calls=False)
    )
    assert submit.params.grammar is not None
    schema = json.loads(submit.params.grammar.source)
    assert schema["properties"]["name"] == {"const": "get_weather"}  # one call, of that function
    session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    session.handle(
        GenerationFinished(stream_id=submit.stream_id, text=CALL, finish_reason=FinishReason.STOP), 0.0
    )
    result = pe.InputItem(role="tool", content="-3 C", tool_call_id="call_1")
    submit = submit_of(session.handle(pe.ResponseCreate(input=(result,), tool_choice="none"), 0.0))
    assert submit.params.grammar is None
    assert [m.role for m in submit.messages] == ["user", "assistant", "tool"]  # no tools' system turn
    assert submit.messages[1].content == CALL and submit.messages[2].call_id == "call_1"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {
                "tools": (
                    pe.FunctionTool(
                        name="f",
                        parameters=pe.JsonText(
                            '{"type":"object","properties":{"a":' + "[" * 40 + "]" * 40 + "}}"
                        ),
                    ),
                )
            },
            "nested deeper than 32 levels",
        ),
        ({"tool_choice": pe.NamedToolChoice(name="nope")}, "not among the tools"),
        ({"tool_choice": "required"}, "no tools"),
    ],
)
def test_tools_that_cannot_be_enforced_are_refused_naming_why(fields: dict, message: str) -> None:
    session = make_session()
    event = update(session, **fields)
    assert isinstance(event, pe.ErrorEvent) and event.code is pe.ErrorCode.INVALID_PARAMETER
    assert message in event.message
    (error,) = create(session, **fields)
    assert isinstance(error, Send) and message in error.event.message


def test_a_schema_the_grammar_library_cannot_enforce_is_refused_naming_the_keyword() -> None:
    bad = pe.FunctionTool(name="f", parameters=pe.JsonText('{"type":"object","not":{}}'))
    problem = tools_problem(pe.SessionUpdate(session=pe.SessionSettings(tools=(WEATHER, bad))))
    assert problem is not None and "'session.tools[1].parameters'" in problem and "keyword 'not'" in problem
    assert tools_problem(pe.ResponseCreate(tools=(bad,))) is not None
    assert tools_problem(pe.ResponseCreate(tools=(WEATHER, TIME))) is None


@pytest.mark.parametrize(
    ("cut", "kept"),
    [(CALL[:30], ""), (CALL, CALL)],
)
def test_a_call_cut_before_it_is_whole_leaves_nothing(cut: str, kept: str) -> None:
    session = make_session()
    submit = submit_of(create(session, tools=(WEATHER,), tool_choice="required"))
    session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    session.handle(Delivered(stream_id=submit.stream_id, text=cut), 0.0)
    session.handle(pe.ResponseCancel(response_id=submit.response_id), 0.0)
    assert session.turns[-1] == Message(role="assistant", content=kept)


def test_a_call_cut_by_max_tokens_leaves_nothing_but_text_stays() -> None:
    session = make_session()
    for text, reason, kept in (
        (CALL[:30], FinishReason.LENGTH, ""),
        ("It is cold in Oslo", FinishReason.LENGTH, "It is cold in Oslo"),
    ):
        submit = submit_of(create(session, tools=(WEATHER,)))
        session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
        session.handle(GenerationFinished(stream_id=submit.stream_id, text=text, finish_reason=reason), 0.0)
        assert session.turns[-1] == Message(role="assistant", content=kept)


def test_a_saved_session_keeps_its_tools_and_tool_results() -> None:
    session = make_session()
    update(session, tools=(WEATHER,), tool_choice=pe.NamedToolChoice(name="get_weather"))
    session.handle(
        pe.ResponseCreate(input=(pe.InputItem(role="tool", content="-3 C", tool_call_id="call_9"),)), 0.0
    )
    saved = SavedSession.from_bytes(snapshot(session, principal="p").to_bytes())
    assert saved.settings.tools == session.settings.tools
    assert saved.settings.tool_choice == pe.NamedToolChoice(name="get_weather")
    assert saved.turns[-1].call_id == "call_9"


def test_the_delivery_reads_calls_in_fragments_that_add_up() -> None:
    answer = '[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_time","arguments":{}}]'
    reader = ToolCallEvents("r", "s" * 32, "auto")
    events: list[pe.ServerEvent] = []
    for i in range(0, len(answer), 3):
        out = reader.feed(answer[i : i + 3])
        assert out.text == ""  # calls are never text to speak
        events += out.events
    out, calls = reader.finish()
    events += out.events
    assert calls is not None and [c.name for c in calls] == ["get_weather", "get_time"]
    for index, call in enumerate(calls):
        fragments = [e for e in events if isinstance(e, pe.FunctionCallArgumentsDelta) and e.index == index]
        assert "".join(e.delta for e in fragments) == call.arguments
        assert all(e.call_id == call.call_id and e.name == call.name for e in fragments)
    done = [e for e in events if isinstance(e, pe.FunctionCallArgumentsDone)]
    assert [(e.call_id, e.arguments) for e in done] == [(c.call_id, c.arguments) for c in calls]
    assert calls[0].arguments == '{"city":"Oslo"}'


def test_text_answers_are_spoken_and_calls_are_not() -> None:
    assert spoken_text("  Hello there", "auto") == "  Hello there"
    assert spoken_text(CALL, "auto") == ""
    assert spoken_text(CALL, None) == CALL
    reader = ToolCallEvents("r", "s", "auto")
    assert reader.feed("  ").text == ""  # blanks wait until the answer shows what it is
    assert reader.feed("Hi").text == "  Hi"
    assert reader.finish() == (reader.finish()[0], None)


def test_a_call_left_without_its_result_is_settled_as_cancelled_in_the_next_prompt() -> None:
    session = make_session()
    two = f"[{CALL},{CALL.replace('Oslo', 'Rome')}]"
    submit = submit_of(create(session, tools=(WEATHER,), tool_choice="required"))
    session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    session.handle(
        GenerationFinished(stream_id=submit.stream_id, text=two, finish_reason=FinishReason.STOP), 0.0
    )
    # the client answers the first call; the user speaks before the second's result came
    follow = (
        pe.InputItem(role="tool", content="-3 C", tool_call_id="c0"),
        pe.InputItem(role="user", content="Actually, never mind."),
    )
    submit = submit_of(session.handle(pe.ResponseCreate(input=follow), 0.0))
    assert [(m.role, m.content) for m in submit.messages[1:]] == [
        ("assistant", two),
        ("tool", "-3 C"),
        ("tool", UNANSWERED_CALL),
        ("user", "Actually, never mind."),
    ]
    assert [m.role for m in session.turns] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]  # the conversation as it came
    # calls that are the last turns still wait for their results
    assert settled_calls(session.turns[:2]) == tuple(session.turns[:2])


class Recorder:
    """A delivery subscriber that records what it is told."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def on_delta(self, text: str) -> None:
        self.told.append(f"delta:{text}")

    def on_calls(self) -> None:
        self.told.append("calls")

    async def on_end(self) -> None:
        self.told.append("end")

    async def on_failure(self) -> None:
        self.told.append("failure")

    async def on_close(self) -> None:
        self.told.append("close")


@pytest.mark.parametrize(
    ("answer", "told"),
    [
        ([CALL[:20], CALL[20:]], ("", ["calls", "end", "close"])),
        (["Hello", " there"], ("Hello there", ["end", "close"])),
    ],
)
async def test_the_delivery_tells_its_subscribers_only_text_and_that_calls_were_made(
    answer: list[str], told: tuple[str, list[str]]
) -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    for i, text in enumerate(answer):
        await log.write_step(
            [
                StreamWrite(
                    stream_id="s1", entry=LogEntry(start=i, end=i + 1, text=text, token_ids=(i,)), finish=None
                )
            ]
        )
    await log.write_step(finish(len(answer)))
    sent: list[object] = []

    async def send(event: object) -> None:
        sent.append(event)

    recorder = Recorder()
    delivery = Delivery(
        log,
        response_id="r1",
        stream_id="s1",
        from_offset=0,
        send=send,
        subscribers=(recorder,),
        tool_mode="auto",
    )
    await delivery.run()
    # batches of the log may join: the text told adds up, then the rest in order
    text, rest = told
    assert "".join(t[len("delta:") :] for t in recorder.told if t.startswith("delta:")) == text
    assert [t for t in recorder.told if not t.startswith("delta:")] == rest
    done = sent[-1]
    assert isinstance(done, pe.ResponseDone)
    assert (done.tool_calls is not None) == ("calls" in rest)
