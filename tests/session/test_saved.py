"""Saved sessions: the format, the saver, and restoring a Conversation from one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.actions import GenerationFinished, Message
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Conversation, ConversationSettings, IllegalTransition, State
from bargein.session.runtime.saved import SavedActive, SavedSession, SessionSaver, snapshot
from bargein.session.streams.log import MemoryTokenLog
from tests.session.log_helpers import FakeClock

SETTINGS = ConversationSettings(
    instructions="Be brief ✓",
    defaults={"max_tokens": 8, "stop": ["\n"]},
    on_disconnect="cancel",
    include_token_ids=True,
)


def saved(active: SavedActive | None = None, turns: int = 2) -> SavedSession:
    items = tuple(
        Message(role=("user", "assistant")[i % 2], content=f"{i} ありがとう 🙂") for i in range(turns)
    )
    return SavedSession(session_id="s1", principal="alice", settings=SETTINGS, turns=items, active=active)


@pytest.mark.parametrize(
    "active", [None, SavedActive(response_id="r", stream_id="st", delivered="half 🙂", num_input_turns=2)]
)
def test_round_trip(active: SavedActive | None) -> None:
    original = saved(active)
    assert SavedSession.from_bytes(original.to_bytes()) == original


AUDIO = pe.AudioSettings(
    input=pe.AudioInputSettings(sample_rate=16000, turn_detection=pe.TURN_DETECTION_OFF),
    output=pe.AudioOutputSettings(sample_rate=24000, voice="joe"),
)


@pytest.mark.parametrize("audio", [AUDIO, pe.AudioSettings(input=AUDIO.input, output=pe.AUDIO_OUTPUT_OFF)])
def test_a_voice_session_keeps_its_audio_settings(audio: pe.AudioSettings) -> None:
    original = replace(saved(), audio=audio)
    assert SavedSession.from_bytes(original.to_bytes()) == original


def test_audio_settings_this_build_cannot_read_are_dropped_not_the_session() -> None:
    """A save of another build (a newer node's setting, a value out of this
    build's range) resumes with the connection's audio settings."""
    data = replace(saved(), audio=AUDIO).to_bytes().replace(b'"sample_rate":24000', b'"sample_rate":7')
    restored = SavedSession.from_bytes(data)
    assert restored.audio is None and restored.turns == saved().turns


def test_a_save_from_before_the_input_count_still_loads() -> None:
    data = (
        saved(SavedActive(response_id="r", stream_id="st", delivered="x", num_input_turns=1))
        .to_bytes()
        .replace(b',"x",1]', b',"x"]')
    )
    active = SavedSession.from_bytes(data).active
    assert active == SavedActive(response_id="r", stream_id="st", delivered="x")


@pytest.mark.parametrize("data", [b"", b"[]", b'{"v": 1}', b'{"v": 99}', b"\xff"])
def test_garbage_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        SavedSession.from_bytes(data)


async def test_saver_writes_the_latest_state_and_the_last_one_at_close() -> None:
    log = MemoryTokenLog()
    states = [saved(turns=n) for n in range(1, 6)]
    current = iter(states)
    saver = SessionSaver(log, lambda: next(current))
    for _ in range(4):  # requested while the first is in flight: folded into one more
        saver.request()
    await saver.flush()
    loaded = await log.load_session("s1")
    assert loaded is not None and SavedSession.from_bytes(loaded) in states[:2]
    await saver.close(states[-1])
    assert await log.load_session("s1") == states[-1].to_bytes()


class CountingLog(MemoryTokenLog):
    """A memory log that counts the saves written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.num_saves = 0

    async def save_session(self, session_id: str, state: bytes) -> None:
        self.num_saves += 1
        await super().save_session(session_id, state)


def fake_sleep(clock: FakeClock) -> Callable[[float], Awaitable[None]]:
    """A sleep that ends when the test has moved ``clock`` far enough."""

    async def sleep(seconds: float) -> None:
        until = clock.now + seconds
        while clock.now < until:
            await asyncio.sleep(0)

    return sleep


INTERVAL_S = 0.05


async def test_a_burst_of_requests_is_saved_at_most_once_per_interval() -> None:
    """1,000 turn changes over one second (fake time) are at most 1 s / 50 ms + 1
    saves and encodes, not 1,000; the last state still lands."""
    clock, log = FakeClock(), CountingLog()
    states = [saved(turns=n) for n in range(1, 1001)]
    num_encoded = 0
    current = states[0]

    def state() -> SavedSession:
        nonlocal num_encoded
        num_encoded += 1
        return current

    saver = SessionSaver(log, state, min_interval_s=INTERVAL_S, clock=clock, sleep=fake_sleep(clock))
    for current in states:  # noqa: B007 - state() returns the current one
        saver.request()
        clock.advance(0.001)
        await asyncio.sleep(0)  # the saver runs between turn changes, as it does live
    clock.advance(INTERVAL_S)  # the pending save's interval passes
    await asyncio.wait_for(saver.flush(), 30)  # a hang guard
    assert log.num_saves == num_encoded == saver.num_saves
    assert 2 <= log.num_saves <= 1.0 / INTERVAL_S + 1, log.num_saves
    assert await log.load_session("s1") == states[-1].to_bytes()


async def test_close_does_not_wait_for_a_pending_save() -> None:
    """The pending save's interval never passes here: close writes the last
    state at once instead of waiting for it."""
    clock, log = FakeClock(), CountingLog()
    first, pending, last = saved(turns=1), saved(turns=2), saved(turns=3)
    current = first
    saver = SessionSaver(
        log, lambda: current, min_interval_s=INTERVAL_S, clock=clock, sleep=fake_sleep(clock)
    )
    saver.request()
    await asyncio.wait_for(saver.flush(), 30)  # the first save goes out at once
    current = pending
    saver.request()  # waits for the interval (the clock never moves)
    await asyncio.sleep(0)
    await asyncio.wait_for(saver.close(last), 30)  # a hang guard
    assert log.num_saves == 2
    assert await log.load_session("s1") == last.to_bytes()


def test_restore_waits_for_the_active_response_then_keeps_its_turn() -> None:
    session = Conversation(SessionConfig(), session_id="s1")
    state = saved(turns=3)
    session.restore(settings=state.settings, turns=list(state.turns), active=("r", "st", "half", 1))
    assert session.state is State.GENERATING and session.active_stream_id == "st"
    assert snapshot(session, "alice").active == SavedActive(
        response_id="r", stream_id="st", delivered="half", num_input_turns=1
    )
    session.handle(GenerationFinished(stream_id="st", text="whole", finish_reason=FinishReason.STOP), now=0.0)
    assert session.state is State.IDLE
    assert session.turns[-1] == Message(role="assistant", content="whole")
    assert session.messages()[0] == Message(role="system", content="Be brief ✓")


def test_a_restored_response_dropped_at_its_deadline_takes_its_input_away() -> None:
    session = Conversation(SessionConfig(), session_id="s1")
    state = saved(turns=3)  # user, assistant, user: the last is the dropped one's input
    session.restore(settings=state.settings, turns=list(state.turns), active=("r", "st", "", 1))
    session.handle(
        GenerationFinished(stream_id="st", text="", expired=True, finish_reason=FinishReason.CANCELLED),
        now=0.0,
    )
    assert session.state is State.IDLE and session.turns == list(state.turns[:2])


def test_only_a_fresh_session_is_restored() -> None:
    session = Conversation(SessionConfig())
    session.handle(pe.ResponseCreate(input=(pe.InputItem(role="user", content="hi"),)), now=0.0)
    with pytest.raises(IllegalTransition):
        session.restore(settings=SETTINGS, turns=[], active=None)


async def test_a_save_that_fails_unexpectedly_is_logged_and_the_next_one_goes_through(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 24: a save task that raised anything but TokenLogError died with
    # it, and flush() / close() re-raised it into the connection's close.
    log = MemoryTokenLog()
    real, calls = log.save_session, iter([RuntimeError("injected")])

    async def fails_once(session_id: str, state: bytes) -> None:
        for exc in calls:
            raise exc
        await real(session_id, state)

    monkeypatch.setattr(log, "save_session", fails_once)
    saver = SessionSaver(log, lambda: saved(turns=1))
    saver.request()
    await saver.flush()  # does not raise
    assert any(r.exc_info for r in caplog.records if r.levelname == "ERROR")
    await saver.close(saved(turns=3))
    assert await log.load_session("s1") == saved(turns=3).to_bytes()
