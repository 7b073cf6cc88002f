"""A connection's seams without a voice side and without a model: the text-only
port refuses every audio event as the protocol says, and a voice turn that
must not interrupt waits on the conversation's idle event (no polling)."""

from __future__ import annotations

import asyncio
from typing import Any

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.actions import AddItem, GenerationFinished, Message, Submitted
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import State
from bargein.session.runtime.connection import Connection
from bargein.session.runtime.live_conversation import LiveConversation
from bargein.session.runtime.service import Service
from bargein.session.runtime.voice_port import NO_VOICE
from tests.session.test_service import CountingLog, ThreadedEngine

HANG_GUARD_S = 30.0  # a hang guard, never a timing assumption


async def started() -> tuple[ThreadedEngine, Service]:
    engine = ThreadedEngine()
    service = Service(engine, CountingLog(), SessionConfig(), secret=b"k")
    await service.start()
    return engine, service


def create(text: str, **fields: Any) -> pe.ResponseCreate:
    return pe.ResponseCreate(input=(pe.InputItem(role="user", content=text),), **fields)


async def test_a_text_only_connection_refuses_audio_and_announces_no_audio_limits() -> None:
    _, service = await started()
    sent: list[Any] = []

    async def send(event: object) -> None:
        sent.append(event)

    conn = Connection(service, send)
    limits = conn.created_event().limits
    assert limits.max_input_audio_ms is None and limits.max_voice_turns is None
    audio_on = pe.AudioSettings(output=pe.AudioOutputSettings(sample_rate=24000))
    await conn.handle(pe.InputAudioAppend(audio=b"\0\0", event_id="e1"))
    await conn.handle(pe.SessionUpdate(session=pe.SessionSettings(audio=audio_on), event_id="e2"))
    item = Message(role="user", content="")
    await conn.handle(AddItem(item=item, audio=b"\0\0", event_id="e3"))
    await conn.handle(create("Hi.", modalities=("text", "audio"), response_id="r4", event_id="e4"))
    assert [(e.code, e.message, e.event_id, e.response_id, e.retry_after_ms) for e in sent] == [
        (pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, "e1", None, None),
        (pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, "e2", None, None),
        (pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, "e3", None, None),
        (pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, "e4", "r4", None),
    ]
    assert conn.turns == [] and conn.active_response_id is None
    await conn.close()
    await service.stop()


async def test_waiting_for_idle_wakes_when_the_active_response_finishes() -> None:
    _, service = await started()
    live = LiveConversation(service, "p", clock=service.clock)
    await asyncio.wait_for(live.wait_idle(), HANG_GUARD_S)  # idle: at once
    live.apply(create("Hi."), 0.0)
    assert live.current.state is State.SUBMITTING
    active = live.current.active_response
    assert active is not None
    live.apply(Submitted(response_id=active[0], resume_token="t"), 0.0)
    waiter = asyncio.create_task(live.wait_idle())
    await asyncio.sleep(0)
    assert not waiter.done()  # generating: it waits
    live.finished(GenerationFinished(stream_id=active[1], text="Hello.", finish_reason=FinishReason.STOP))
    await asyncio.wait_for(waiter, HANG_GUARD_S)
    assert live.current.turns[-1].content == "Hello."
    await service.stop()
