"""The engine waits for a token log slower than itself (issue 36, item 11):
the steps between the engine thread and the log writer stay within
``max_pending_log_steps``, no token is lost, and the observer hears of the wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from bargein.app.metrics import Metrics
from bargein.app.observer import Observer
from bargein.engine.request import SamplingParams
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import GenerationFinished, Message, Submit, Submitted
from bargein.session.runtime.observer import NullObserver
from bargein.session.runtime.service import Owner, Service
from bargein.session.streams.log import LogEntry, MemoryTokenLog, StreamWrite
from tests.session.test_service import ThreadedEngine, out, read_all
from tests.waiting import HANG_GUARD_S, wait_until

BOUND = 4
NUM_STEPS = 120
WRITE_S = 0.002  # each step's write: slower than the stand-in engine's steps (none)


class SlowLog(MemoryTokenLog):
    """A log that takes ``WRITE_S`` per step (a replica WAIT, a far Redis)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_written = 0

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        await asyncio.sleep(WRITE_S)
        await super().write_step(writes)
        self.num_written += 1


class Backlog(NullObserver):
    def __init__(self) -> None:
        self.num_steps: list[int] = []
        self.engine_wait_s = 0.0

    def log_backlog(self, *, num_steps: int, engine_wait_s: float) -> None:
        self.num_steps.append(num_steps)
        self.engine_wait_s += engine_wait_s


async def test_a_slow_log_makes_the_engine_wait_and_loses_no_token() -> None:
    engine, log, observer = ThreadedEngine(), SlowLog(), Backlog()
    service = Service(engine, log, SessionConfig(max_pending_log_steps=BOUND), secret=b"k", observer=observer)
    await service.start()
    finished: list[GenerationFinished] = []
    submit = Submit(
        response_id="r",
        stream_id="a",
        messages=(Message(role="user", content="hi"),),
        params=SamplingParams(max_tokens=NUM_STEPS),
    )
    assert isinstance(
        await service.submit(submit, Owner(principal="p", session_id="s", on_finish=finished.append), 0.0),
        Submitted,
    )
    pending: list[int] = []  # steps handed over and not yet written, seen by the engine thread

    def run_engine() -> None:
        for n in range(NUM_STEPS):
            for listener in engine.listeners:
                listener([out("a", n, f"{n} ", finished=n == NUM_STEPS - 1)])
            pending.append(n + 1 - log.num_written)

    thread = threading.Thread(target=run_engine)
    thread.start()
    # the writer runs on this loop meanwhile
    await wait_until(lambda: not thread.is_alive(), "the engine thread's last step")
    items = await read_all(log, "a")
    await service.stop()
    assert max(pending) <= BOUND, max(pending)
    assert max(observer.num_steps) <= BOUND
    assert observer.engine_wait_s > 0  # it did wait: without the bound it ran ahead
    entries = [item for item in items if isinstance(item, LogEntry)]
    assert "".join(e.text for e in entries) == "".join(f"{n} " for n in range(NUM_STEPS))
    assert [e.start for e in entries] == list(range(NUM_STEPS))
    assert [f.stream_id for f in finished] == ["a"]


async def test_a_stopping_service_lets_a_waiting_engine_go() -> None:
    engine, log = ThreadedEngine(), SlowLog()
    service = Service(engine, log, SessionConfig(max_pending_log_steps=1), secret=b"k")
    await service.start()
    submit = Submit(
        response_id="r",
        stream_id="a",
        messages=(Message(role="user", content="hi"),),
        params=SamplingParams(),
    )
    await service.submit(submit, Owner(principal="p", session_id="s", on_finish=None), 0.0)
    await service.stop()  # nobody writes any more: the engine must not wait for ever
    done = threading.Event()

    def run_engine() -> None:
        for n in range(3):
            for listener in engine.listeners:
                listener([out("a", n, "x")])
        done.set()

    threading.Thread(target=run_engine, daemon=True).start()
    assert await asyncio.to_thread(done.wait, HANG_GUARD_S)


def test_the_metrics_say_the_engine_waited() -> None:
    registry = CollectorRegistry()
    observer = Observer(Metrics(registry))
    observer.log_backlog(num_steps=3, engine_wait_s=0.25)
    observer.log_backlog(num_steps=4, engine_wait_s=0.5)
    assert registry.get_sample_value("bargein_engine_log_wait_seconds_total") == 0.75
    assert registry.get_sample_value("bargein_token_log_pending_steps") == 4
