"""Conversation items by id (OpenAI's ``conversation.item.*`` on the session),
and per-response instructions: the state machine with a fake clock, no model."""

from __future__ import annotations

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.actions import (
    Abort,
    AddItem,
    DeleteItem,
    Delivered,
    GenerationFinished,
    ItemAdded,
    ItemDeleted,
    ItemRetrieved,
    ItemTruncated,
    Message,
    RetrieveItem,
    Send,
    Submit,
    Submitted,
    TruncateItem,
)
from bargein.session.conversation.state import Conversation, assistant_item_id
from bargein.session.runtime.saved import SavedSession, snapshot
from tests.session.test_session import make_session


def add(
    session: Conversation,
    text: str,
    item_id: str | None = None,
    previous: str | None = None,
    role: str = "user",
) -> object:
    event = AddItem(
        item=Message(role=role, content=text, item_id=item_id), previous_item_id=previous, event_id="e"
    )
    (action,) = session.handle(event, 0.0)
    assert isinstance(action, Send)
    return action.event


def answer(session: Conversation, text: str, **create: object) -> tuple[str, Submit]:
    """Create a response and finish it with ``text``; (its stream id, its Submit)."""
    submit = session.handle(pe.ResponseCreate(**create), 0.0)[-1]  # type: ignore[arg-type]
    assert isinstance(submit, Submit)
    session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    session.handle(Delivered(stream_id=submit.stream_id, text=text), 0.0)
    session.handle(
        GenerationFinished(stream_id=submit.stream_id, text=text, finish_reason=FinishReason.STOP), 0.0
    )
    return submit.stream_id, submit


def test_items_are_inserted_where_asked_and_prompted_in_that_order() -> None:
    session = make_session()
    first = add(session, "first", "a")
    assert first == ItemAdded(item=Message(role="user", content="first"), previous_item_id=None)
    assert add(session, "zeroth", "z", previous="root") == ItemAdded(
        item=Message(role="user", content="zeroth"), previous_item_id=None
    )
    added = add(session, "second", previous="a")
    assert isinstance(added, ItemAdded) and added.previous_item_id == "a" and added.item.item_id
    _, submit = answer(session, "ok")
    assert [m.content for m in submit.messages] == ["zeroth", "first", "second"]
    assert session.turns[-1].item_id == assistant_item_id(submit.stream_id)


def test_a_duplicate_or_unknown_id_is_refused_and_changes_nothing() -> None:
    session = make_session()
    add(session, "first", "a")
    duplicate = add(session, "again", "a")
    assert (
        isinstance(duplicate, pe.ErrorEvent)
        and duplicate.code is pe.ErrorCode.CONFLICT
        and duplicate.event_id == "e"
    )
    unknown = add(session, "x", previous="nope")
    assert isinstance(unknown, pe.ErrorEvent) and unknown.code is pe.ErrorCode.NOT_FOUND
    (gone,) = session.handle(DeleteItem(item_id="nope"), 0.0)
    assert isinstance(gone, Send) and gone.event.code is pe.ErrorCode.NOT_FOUND
    assert [t.content for t in session.turns] == ["first"]


def test_items_cannot_change_under_an_active_response() -> None:
    session = make_session()
    session.handle(pe.ResponseCreate(input=(pe.InputItem(role="user", content="hi"),)), 0.0)
    refused = add(session, "meanwhile")
    assert isinstance(refused, pe.ErrorEvent) and refused.code is pe.ErrorCode.CONFLICT
    assert len(session.turns) == 1


def test_delete_and_retrieve() -> None:
    session = make_session(max_conversation_items=2)
    add(session, "a", "a")
    add(session, "b", "b")
    full = add(session, "c", "c")
    assert isinstance(full, pe.ErrorEvent) and full.code is pe.ErrorCode.INVALID_PARAMETER
    assert session.handle(DeleteItem(item_id="a"), 0.0) == [Send(event=ItemDeleted(item_id="a"))]
    (retrieved,) = session.handle(RetrieveItem(item_id="b"), 0.0)
    assert isinstance(retrieved, Send) and retrieved.event == ItemRetrieved(
        item=Message(role="user", content="b")
    )
    assert [t.item_id for t in session.turns] == ["b"]


def test_truncate_cuts_a_finished_answer_anywhere_in_the_conversation() -> None:
    session = make_session()
    add(session, "q1")
    stream, _ = answer(session, "Hello there, friend.")
    add(session, "q2")  # the answer is no longer the last item: a truncate still finds it
    item_id = assistant_item_id(stream)
    (action,) = session.handle(TruncateItem(item_id=item_id, heard_chars=5, audio_end_ms=300), 0.0)
    assert action == Send(event=ItemTruncated(item_id=item_id, kept_chars=5, audio_end_ms=300))
    assert session.turns[1].content == "Hello"
    # never longer than what was delivered; a user item is refused
    session.handle(TruncateItem(item_id=item_id, heard_chars=999), 0.0)
    assert session.turns[1].content == "Hello"
    (refused,) = session.handle(TruncateItem(item_id=session.turns[0].item_id or ""), 0.0)
    assert isinstance(refused, Send) and refused.event.code is pe.ErrorCode.INVALID_PARAMETER


def test_truncate_of_the_answer_being_generated_cancels_it() -> None:
    session = make_session()
    submit = session.handle(pe.ResponseCreate(input=(pe.InputItem(role="user", content="hi"),)), 0.0)[-1]
    assert isinstance(submit, Submit)
    session.handle(Submitted(response_id=submit.response_id, resume_token="t"), 0.0)
    session.handle(Delivered(stream_id=submit.stream_id, text="Once upon"), 0.0)
    actions = session.handle(TruncateItem(item_id=assistant_item_id(submit.stream_id), heard_chars=4), 1.0)
    assert isinstance(actions[0], Abort) and actions[0].kept_chars == 4
    assert session.turns[-1].content == "Once" and session.active_response is None


def test_a_response_may_have_its_own_instructions() -> None:
    session = make_session(instructions="Be kind.")
    add(session, "hi")
    submit = session.handle(pe.ResponseCreate(instructions="Answer in French."), 0.0)[-1]
    assert isinstance(submit, Submit)
    assert submit.messages[0] == Message(role="system", content="Answer in French.")
    assert session.messages()[0] == Message(role="system", content="Be kind.")  # the session's stay


def test_item_ids_survive_a_save() -> None:
    session = make_session()
    add(session, "hi", "item_hi")
    stream, _ = answer(session, "Hello")
    saved = SavedSession.from_bytes(snapshot(session, "anonymous").to_bytes())
    assert [t.item_id for t in saved.turns] == ["item_hi", assistant_item_id(stream)]
    # a save written before item ids: pairs, still read
    old = b'{"v":1,"session_id":"s","principal":"p","settings":{"instructions":null,"defaults":{},"on_disconnect":"continue","include_token_ids":false},"turns":[["user","hi"]],"active":null}'
    assert SavedSession.from_bytes(old).turns == (Message(role="user", content="hi"),)


def test_a_late_cancel_cuts_a_finished_answer_while_only_user_turns_follow_it() -> None:
    """The user's interruption may be committed (a confirmed interruption)
    before the client's response.cancel says what it played: the cancel still
    cuts the answer, until the next response starts (docs/protocol.md 3, 8.7)."""
    session = make_session()
    add(session, "tell me a story")
    _, first = answer(session, "Once upon a time there was a dragon.")
    add(session, "stop, tell me about dogs")
    session.handle(pe.ResponseCancel(response_id=first.response_id, heard_chars=16), 0.0)
    assert [t.content for t in session.turns] == [
        "tell me a story",
        "Once upon a time",
        "stop, tell me about dogs",
    ]
    # once the next response has started, its prompt holds the answer: no later cut
    submit = session.handle(pe.ResponseCreate(), 0.0)[-1]
    assert isinstance(submit, Submit)
    session.handle(pe.ResponseCancel(response_id=first.response_id, heard_chars=4), 0.0)
    assert session.turns[1].content == "Once upon a time"
