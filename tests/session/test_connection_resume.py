"""``session.resume`` and the abandon grace on Connection and Service, with a
stand-in engine (the real model is exercised in tests/app/test_resume.py)."""

from __future__ import annotations

from typing import Any

from bargein.engine.request import FinishReason, RequestOutput
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message, State
from bargein.session.runtime.connection import Connection
from bargein.session.runtime.service import Service
from tests.session.test_service import CountingLog, ThreadedEngine
from tests.waiting import wait_until, wait_until_async


def output(stream_id: str, start: int, text: str, *, finished: bool = False) -> RequestOutput:
    return RequestOutput(
        request_id=stream_id,
        new_token_ids=(7,),
        text=text,
        num_prompt_tokens=3,
        num_output_tokens=start + 1,
        finished=finished,
        finish_reason=FinishReason.LENGTH if finished else None,
    )


class Client:
    """A connection and the events it was sent."""

    def __init__(self, service: Service, principal: str = "anonymous") -> None:
        self.events: list[Any] = []
        self.conn = Connection(service, self._send, principal=principal)
        self.created = self.conn.created_event()

    async def _send(self, event: object) -> None:
        self.events.append(event)

    async def wait_for(self, kind: type, count: int = 1) -> list[Any]:
        def found() -> list[Any] | None:
            events = [e for e in self.events if isinstance(e, kind)]
            return events if len(events) >= count else None

        return await wait_until(found, f"{count} {kind.__name__} (sent: {self.events})")


def create(text: str) -> pe.ResponseCreate:
    return pe.ResponseCreate(input=(pe.InputItem(role="user", content=text),))


async def started(grace_s: float = 30.0) -> tuple[ThreadedEngine, Service]:
    engine = ThreadedEngine()
    service = Service(engine, CountingLog(), SessionConfig(abandon_grace_s=grace_s), secret=b"k")
    await service.start()
    return engine, service


async def test_a_resumed_session_gets_the_turn_that_finished_after_the_drop() -> None:
    engine, service = await started()
    first = Client(service)
    await first.conn.handle(create("hi"))
    stream_id = (await first.wait_for(pe.ResponseCreated))[0].stream_id
    engine.run_steps([[output(stream_id, 0, "Hel")]])
    await first.wait_for(pe.ResponseDelta)
    await first.conn.close()
    second = Client(service)
    await second.conn.handle(
        pe.SessionResume(session_id=first.created.session_id, session_token=first.created.session_token)
    )
    resumed = (await second.wait_for(pe.SessionResumed))[0]
    assert resumed.turns == 1 and resumed.active.stream_id == stream_id
    assert resumed.active.end == 1 and second.conn.conversation.state is State.GENERATING
    engine.run_steps([[output(stream_id, 1, "lo", finished=True)]])

    async def ended() -> bool:
        info = await service.log.info(stream_id)
        return info is not None and info.status != "live"

    await wait_until_async(ended, "the end in the log")  # as a client learns it
    await second.conn.handle(create("again"))  # waits for the turn of the ended stream
    assert second.conn.conversation.turns[:3] == [
        Message(role="user", content="hi"),
        Message(role="assistant", content="Hello"),
        Message(role="user", content="again"),
    ]
    await second.conn.close()
    await service.stop()


async def test_a_resume_before_the_drop_is_noticed_gets_the_last_turn() -> None:
    """A client that reconnects to the same node before the server noticed
    its drop (no FIN on a bad network) resumes the conversation as that
    connection holds it, not as last saved: saves are at most one per
    ``save_interval_s`` (an hour here, so the save of turn two never lands)."""
    engine = ThreadedEngine()
    config = SessionConfig(save_interval_s=3600.0)
    service = Service(engine, CountingLog(), config, secret=b"k")
    await service.start()
    first = Client(service)
    await first.conn.handle(create("hi"))
    one = (await first.wait_for(pe.ResponseCreated))[0].stream_id
    engine.run_steps([[output(one, 0, "Hello", finished=True)]])
    await first.wait_for(pe.ResponseDone)
    await first.conn.handle(create("again"))
    two = (await first.wait_for(pe.ResponseCreated, 2))[1].stream_id
    engine.run_steps([[output(two, 0, "Hi")]])
    await first.wait_for(pe.ResponseDelta, 2)
    second = Client(service)  # the first connection is still open
    await second.conn.handle(
        pe.SessionResume(session_id=first.created.session_id, session_token=first.created.session_token)
    )
    resumed = (await second.wait_for(pe.SessionResumed))[0]
    assert resumed.turns == 3 and resumed.active.stream_id == two
    assert second.conn.conversation.turns[:3] == [
        Message(role="user", content="hi"),
        Message(role="assistant", content="Hello"),
        Message(role="user", content="again"),
    ]
    await first.conn.close()  # taken over: its close saves nothing over the new connection's
    assert service.sessions[first.created.session_id] is second.conn
    await second.conn.close()
    await service.stop()


async def test_wrong_principal_and_token_are_refused() -> None:
    _, service = await started()
    first = Client(service)
    await first.conn.handle(create("hi"))
    await first.conn.close()
    other = Client(service, principal="mallory")
    await other.conn.handle(
        pe.SessionResume(session_id=first.created.session_id, session_token=first.created.session_token)
    )
    assert (await other.wait_for(pe.ErrorEvent))[0].code is pe.ErrorCode.FORBIDDEN
    await service.stop()


async def test_an_abandoned_stream_is_cancelled_unless_someone_reads_it() -> None:
    # The grace is the only wall-clock assumption left: the follower's resume,
    # a few awaits on in-process fakes, lands within it even on a loaded box.
    engine, service = await started(grace_s=1.0)
    read, left = Client(service), Client(service)
    for client in (read, left):
        await client.conn.handle(create("hi"))
    read_id, left_id = [(await c.wait_for(pe.ResponseCreated))[0].stream_id for c in (read, left)]
    created = [e for e in read.events if isinstance(e, pe.ResponseCreated)][0]
    for client in (read, left):
        await client.conn.close()
    follower = Client(service)
    await follower.conn.handle(pe.StreamResume(stream_id=read_id, from_=0, resume_token=created.resume_token))
    # Wait for the abort (a hang guard), not a fixed 0.3 s. The read stream was
    # released first with the same grace, so had its timer not been cancelled
    # by the resume it would have fired first: one abort, the left stream's,
    # is the whole answer.
    await wait_until(lambda: engine.aborted, "an abandoned stream's abort")
    assert engine.aborted == [(left_id, FinishReason.CANCELLED)]
    await follower.conn.close()
    await service.stop()
