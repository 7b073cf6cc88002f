"""The conversation state machine, event by event, with a fake clock and no model."""

from __future__ import annotations

import itertools

import pytest

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import (
    Abort,
    Conversation,
    Delivered,
    Disconnected,
    GenerationFinished,
    IllegalTransition,
    Message,
    ResumedFrom,
    Send,
    StartDelivery,
    State,
    StopDelivery,
    Submit,
    SubmitFailed,
    Submitted,
)


def make_session(**config: object) -> Conversation:
    ids = (f"s{i}" for i in itertools.count())
    return Conversation(SessionConfig(**config), session_id="sess", new_id=lambda: next(ids))  # type: ignore[arg-type]


def user(text: str) -> tuple[pe.InputItem, ...]:
    return (pe.InputItem(role="user", content=text),)


def create(text: str | None = "hi", **fields: object) -> pe.ResponseCreate:
    return pe.ResponseCreate(input=None if text is None else user(text), **fields)  # type: ignore[arg-type]


def only(actions: list, kind: type) -> object:
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def errors(actions: list) -> list[pe.ErrorEvent]:
    return [a.event for a in actions if isinstance(a, Send) and isinstance(a.event, pe.ErrorEvent)]


def start_response(s: Conversation, text: str = "hi", now: float = 1.0, **fields: object) -> Submit:
    """create + Submitted: the response is GENERATING."""
    submit = only(s.handle(create(text, **fields), now), Submit)
    assert isinstance(submit, Submit)
    actions = s.handle(Submitted(response_id=submit.response_id, resume_token="tok"), now)
    created = only(actions, Send).event  # type: ignore[attr-defined]
    assert created == pe.ResponseCreated(
        response_id=submit.response_id, stream_id=submit.stream_id, resume_token="tok"
    )
    assert only(actions, StartDelivery) == StartDelivery(
        response_id=submit.response_id, stream_id=submit.stream_id
    )
    assert s.state is State.GENERATING
    return submit


def test_ping_is_answered_with_pong() -> None:
    assert make_session().handle(pe.Ping(), 0.0) == [Send(event=pe.Pong())]


def test_create_submits_the_conversation_with_instructions_first() -> None:
    s = make_session(instructions="Be brief.", default_max_tokens=7)
    submit = only(s.handle(create("What is 2+2?", temperature=0.0, response_id="r1"), 0.0), Submit)
    assert isinstance(submit, Submit)
    assert submit.response_id == "r1"
    assert submit.messages == (
        Message(role="system", content="Be brief."),
        Message(role="user", content="What is 2+2?"),
    )
    assert submit.params.max_tokens == 7 and submit.params.greedy
    assert s.state is State.SUBMITTING


def test_finished_response_becomes_the_assistant_turn_of_the_next_prompt() -> None:
    s = make_session()
    first = start_response(s, "Hello")
    assert (
        s.handle(
            GenerationFinished(stream_id=first.stream_id, text="Hi there!", finish_reason=FinishReason.STOP),
            2.0,
        )
        == []
    )
    assert s.state is State.IDLE
    second = only(s.handle(create("And you?"), 3.0), Submit)
    assert second.messages == (
        Message(role="user", content="Hello"),  # type: ignore[attr-defined]
        Message(role="assistant", content="Hi there!"),
        Message(role="user", content="And you?"),
    )


def test_second_create_while_active_is_a_conflict() -> None:
    s = make_session()
    start_response(s)
    actions = s.handle(create("again", event_id="e7"), 2.0)
    assert [e.code for e in errors(actions)] == [pe.ErrorCode.CONFLICT]
    assert errors(actions)[0].event_id == "e7"
    assert s.state is State.GENERATING


def test_interrupt_active_cuts_to_what_was_delivered_and_starts_the_next() -> None:
    s = make_session()
    first = start_response(s, "Tell me a story")
    s.handle(Delivered(stream_id=first.stream_id, text="Once upon "), 2.0)
    s.handle(Delivered(stream_id=first.stream_id, text="a time"), 2.1)
    actions = s.handle(create("Stop, shorter please", interrupt_active=True), 3.0)
    assert actions[0] == Abort(
        stream_id=first.stream_id, reason=FinishReason.INTERRUPTED, requested_at=3.0, kept_chars=16
    )
    submit = only(actions, Submit)
    assert submit.messages[-2:] == (  # type: ignore[attr-defined]
        Message(role="assistant", content="Once upon a time"),
        Message(role="user", content="Stop, shorter please"),
    )
    # The engine's late finish of the interrupted stream changes nothing.
    s.handle(Submitted(response_id=submit.response_id, resume_token="t"), 3.1)  # type: ignore[attr-defined]
    s.handle(
        GenerationFinished(
            stream_id=first.stream_id, text="Once upon a time there", finish_reason=FinishReason.INTERRUPTED
        ),
        3.2,
    )
    assert s.turns[1] == Message(role="assistant", content="Once upon a time")
    assert s.state is State.GENERATING


@pytest.mark.parametrize(
    ("heard", "kept"), [(None, "Paris is the"), (5, "Paris"), (0, ""), (10_000, "Paris is the")]
)
def test_cancel_cuts_the_turn_at_heard_chars_clamped_to_delivered(heard: int | None, kept: str) -> None:
    s = make_session()
    first = start_response(s, "Capital of France?", response_id="r1")
    s.handle(Delivered(stream_id=first.stream_id, text="Paris is the"), 2.0)
    actions = s.handle(pe.ResponseCancel(response_id="r1", heard_chars=heard), 2.5)
    # The KV of what the conversation keeps stays cached for the next turn.
    assert actions == [
        Abort(
            stream_id=first.stream_id, reason=FinishReason.INTERRUPTED, requested_at=2.5, kept_chars=len(kept)
        )
    ]
    assert s.state is State.IDLE
    assert s.turns[-1] == Message(role="assistant", content=kept)


@pytest.mark.parametrize(
    ("held", "replayed"),
    [
        ("", "Paris is the capital"),  # from 0: the replay is not counted twice
        ("Paris is", " the capital"),
        ("Paris is the capital of", " France"),  # past the stale count: no gap
    ],
)
def test_a_resume_resets_what_was_delivered_to_what_the_client_holds(held: str, replayed: str) -> None:
    s = make_session()
    first = start_response(s, "Capital of France?", response_id="r1")
    s.handle(Delivered(stream_id=first.stream_id, text="Paris is"), 2.0)  # a stale count
    s.handle(ResumedFrom(stream_id=first.stream_id, text=held), 3.0)
    s.handle(Delivered(stream_id=first.stream_id, text=replayed), 3.1)
    s.handle(pe.ResponseCancel(response_id="r1"), 3.5)
    assert s.turns[-1] == Message(role="assistant", content=held + replayed)


def test_cancel_of_an_unknown_response_is_not_found() -> None:
    s = make_session()
    actions = s.handle(pe.ResponseCancel(response_id="nope", event_id="e1"), 0.0)
    assert [(e.code, e.event_id, e.response_id) for e in errors(actions)] == [
        (pe.ErrorCode.NOT_FOUND, "e1", "nope")
    ]


def test_cancel_after_finish_resends_done_and_cuts_the_last_turn() -> None:
    s = make_session()
    first = start_response(s, response_id="r1")
    s.handle(Delivered(stream_id=first.stream_id, text="Hello"), 1.5)
    s.handle(
        GenerationFinished(stream_id=first.stream_id, text="Hello world", finish_reason=FinishReason.STOP),
        2.0,
    )
    actions = s.handle(pe.ResponseCancel(response_id="r1", heard_chars=3), 3.0)
    assert actions == [StopDelivery(response_id="r1", stream_id=first.stream_id)]
    assert s.turns[-1] == Message(role="assistant", content="Hel")
    # Twice is fine, and never lengthens the turn again.
    s.handle(pe.ResponseCancel(response_id="r1"), 3.5)
    assert s.turns[-1] == Message(role="assistant", content="Hel")


def test_response_id_can_be_reused_right_after_a_cancel() -> None:
    s = make_session()
    first = start_response(s, response_id="same")
    s.handle(pe.ResponseCancel(response_id="same"), 2.0)
    second = start_response(s, "again", response_id="same")
    assert second.stream_id != first.stream_id
    actions = s.handle(pe.ResponseCancel(response_id="same"), 3.0)
    assert only(actions, Abort).stream_id == second.stream_id  # type: ignore[attr-defined]


def test_submit_failure_reports_and_rolls_back_the_input() -> None:
    s = make_session()
    submit = only(s.handle(create("x" * 50, response_id="r9", event_id="e9"), 0.0), Submit)
    actions = s.handle(
        SubmitFailed(response_id="r9", code=pe.ErrorCode.PROMPT_TOO_LONG, message="too long"), 0.1
    )
    assert [(e.code, e.response_id, e.event_id) for e in errors(actions)] == [
        (pe.ErrorCode.PROMPT_TOO_LONG, "r9", "e9")
    ]
    assert s.state is State.IDLE and s.turns == []
    assert isinstance(submit, Submit)


def test_dropped_at_the_queue_deadline_rolls_back_the_input() -> None:
    s = make_session()
    first = start_response(s, "one", response_id="r1")
    s.handle(
        GenerationFinished(stream_id=first.stream_id, text="an answer", finish_reason=FinishReason.STOP), 1.5
    )
    second = start_response(s, "two", response_id="r2", now=2.0)
    actions = s.handle(
        GenerationFinished(
            stream_id=second.stream_id, text="", finish_reason=FinishReason.CANCELLED, expired=True
        ),
        4.0,
    )
    assert actions == []  # the stream's delivery tells the client (error, then done)
    # the earlier exchange stays; the dropped request's input is gone, so a
    # retry sends it again without a duplicate
    assert s.state is State.IDLE
    assert s.turns == [Message(role="user", content="one"), Message(role="assistant", content="an answer")]


@pytest.mark.parametrize(
    "event",
    [
        create(None),  # nothing to answer
        pe.ResponseCreate(input=()),  # empty input
        create(max_tokens=10_000),  # above the session's limit
    ],
)
def test_bad_create_is_invalid_parameter(event: pe.ResponseCreate) -> None:
    s = make_session(max_tokens=100)
    actions = s.handle(event, 0.0)
    assert [e.code for e in errors(actions)] == [pe.ErrorCode.INVALID_PARAMETER]
    assert s.state is State.IDLE and s.turns == []


def test_session_update_sets_instructions_and_defaults() -> None:
    s = make_session()
    update = pe.SessionSettings(
        instructions="Answer in French.",
        defaults=pe.SamplingDefaults(temperature=0.0, max_tokens=5),
        on_disconnect="cancel",
    )
    actions = s.handle(pe.SessionUpdate(session=update), 0.0)
    updated = only(actions, Send).event  # type: ignore[attr-defined]
    assert isinstance(updated, pe.SessionUpdated)
    assert updated.session.instructions == "Answer in French."
    assert updated.session.on_disconnect == "cancel"
    assert updated.session.defaults == pe.SamplingDefaults(temperature=0.0, max_tokens=5)
    submit = only(s.handle(create("hi", max_tokens=3), 1.0), Submit)
    assert submit.params.max_tokens == 3 and submit.params.temperature == 0.0  # type: ignore[attr-defined]
    assert submit.messages[0] == Message(role="system", content="Answer in French.")  # type: ignore[attr-defined]


def test_session_update_over_the_limit_changes_nothing() -> None:
    s = make_session(max_tokens=10)
    bad = pe.SessionSettings(instructions="x", defaults=pe.SamplingDefaults(max_tokens=11))
    actions = s.handle(pe.SessionUpdate(session=bad), 0.0)
    assert [e.code for e in errors(actions)] == [pe.ErrorCode.INVALID_PARAMETER]
    assert s.settings.instructions is None


@pytest.mark.parametrize(("policy", "aborted"), [("continue", False), ("cancel", True)])
def test_disconnect_applies_the_policy(policy: str, aborted: bool) -> None:
    s = make_session()
    s.handle(pe.SessionUpdate(session=pe.SessionSettings(on_disconnect=policy)), 0.0)  # type: ignore[arg-type]
    first = start_response(s)
    actions = s.handle(Disconnected(), 5.0)
    expected = [Abort(stream_id=first.stream_id, reason=FinishReason.CANCELLED, requested_at=5.0)]
    assert actions == (expected if aborted else [])
    assert s.state is State.CLOSED


def test_illegal_transitions_raise() -> None:
    s = make_session()
    with pytest.raises(IllegalTransition):
        s.handle(Submitted(response_id="r", resume_token="t"), 0.0)  # nothing submitted
    s.handle(create("hi"), 0.0)
    with pytest.raises(IllegalTransition):
        s.handle(create("again"), 0.0)  # one submit at a time
    s.handle(Disconnected(), 1.0)
    with pytest.raises(IllegalTransition):
        s.handle(pe.Ping(), 2.0)  # closed is final
