"""A conversation's bytes are bounded when text is added (``max_conversation_bytes``),
and its saves are encoded off the event loop and bounded too (issue 36, p13)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from bargein.protocol import events as pe
from bargein.session.conversation.actions import AddItem, Message, Send, Submit
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Conversation, text_bytes
from bargein.session.runtime.saved import SavedSession, SessionSaver, max_saved_bytes, snapshot
from bargein.session.streams.log import MemoryTokenLog
from tests.session.test_session import create, make_session

LIMIT = 1024


def add(session: Conversation, text: str) -> pe.ErrorEvent | None:
    """Add a user item; the error it got, or None when it was added."""
    (action,) = session.handle(AddItem(item=Message(role="user", content=text), event_id="e"), 0.0)
    assert isinstance(action, Send)
    return action.event if isinstance(action.event, pe.ErrorEvent) else None


def test_bytes_are_utf8_bytes() -> None:
    assert text_bytes("abc") == 3
    assert text_bytes("é🙂") == 2 + 4
    assert text_bytes("\ud800") == 3  # a lone surrogate, as OpenAI's JSON lets through


def test_an_item_past_the_bound_is_refused_and_nothing_is_added() -> None:
    session = make_session(max_conversation_bytes=LIMIT, instructions="x" * 24)
    assert add(session, "é" * 450) is None  # 24 + 900 bytes
    assert add(session, "a" * 100) is None  # 1024: exactly at the bound
    error = add(session, "b")
    assert error is not None and error.code is pe.ErrorCode.INVALID_PARAMETER
    assert error.event_id == "e" and "max_conversation_bytes" in error.message
    assert len(session.turns) == 2 and session.conversation_bytes() == LIMIT


def test_input_of_a_response_create_past_the_bound_is_refused() -> None:
    session = make_session(max_conversation_bytes=LIMIT)
    assert add(session, "a" * 1000) is None
    (refused,) = session.handle(create("b" * 25, event_id="c"), 0.0)
    assert isinstance(refused, Send) and isinstance(refused.event, pe.ErrorEvent)
    assert refused.event.code is pe.ErrorCode.INVALID_PARAMETER and refused.event.event_id == "c"
    assert len(session.turns) == 1
    # within it, the same event is served
    assert isinstance(session.handle(create("b" * 24), 0.0)[-1], Submit)


def test_instructions_past_the_bound_are_refused_and_the_old_ones_stay() -> None:
    session = make_session(max_conversation_bytes=LIMIT, instructions="old")
    assert add(session, "a" * 1000) is None
    update = pe.SessionUpdate(session=pe.SessionSettings(instructions="n" * 25), event_id="u")
    (refused,) = session.handle(update, 0.0)
    assert isinstance(refused, Send) and isinstance(refused.event, pe.ErrorEvent)
    assert session.settings.instructions == "old"
    clear = pe.SessionUpdate(session=pe.SessionSettings(instructions=""))
    (updated,) = session.handle(clear, 0.0)
    assert isinstance(updated, Send) and isinstance(updated.event, pe.SessionUpdated)


async def test_a_save_is_encoded_off_the_event_loop() -> None:
    log = MemoryTokenLog()
    session = make_session()
    add(session, "hello")
    threads: list[threading.Thread] = []

    class Spy(SavedSession):
        def to_bytes(self) -> bytes:
            threads.append(threading.current_thread())
            return super().to_bytes()

    def state() -> SavedSession:
        s = snapshot(session, "alice")
        return Spy(
            session_id=s.session_id, principal=s.principal, settings=s.settings, turns=s.turns, active=None
        )

    saver = SessionSaver(log, state)
    saver.request()
    await saver.flush()
    assert threads and threads[0] is not threading.main_thread()
    assert await log.load_session("sess") is not None


async def test_saves_still_land_in_order() -> None:
    log = MemoryTokenLog()
    session = make_session()
    saver = SessionSaver(log, lambda: snapshot(session, "alice"), min_interval_s=0)
    for i in range(20):
        add(session, f"item {i}")
        saver.request()
        await asyncio.sleep(0)
    await saver.close(snapshot(session, "alice"))
    data = await log.load_session("sess")
    assert data is not None and len(SavedSession.from_bytes(data).turns) == 20


async def test_a_save_over_its_bound_is_not_written(caplog: pytest.LogCaptureFixture) -> None:
    config = SessionConfig(max_conversation_bytes=LIMIT)
    log = MemoryTokenLog()
    session = Conversation(config, session_id="sess")
    assert add(session, "fits") is None
    saver = SessionSaver(log, lambda: snapshot(session, "alice"), max_bytes=max_saved_bytes(config))
    saver.request()
    await saver.flush()
    kept = await log.load_session("sess")
    assert kept is not None
    # JSON escapes a control character in six bytes: past twice the conversation plus the overhead
    session.turns.append(Message(role="user", content="\x00" * (max_saved_bytes(config) // 6 + 1)))
    with caplog.at_level(logging.WARNING):
        await saver.close(snapshot(session, "alice"))
    assert await log.load_session("sess") == kept  # the last save that fitted
    assert any("not saved" in r.getMessage() for r in caplog.records)
