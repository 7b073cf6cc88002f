"""The service's step hand-off: one loop hand-off and one log write per engine step.

The engine side is a stand-in that calls the step listener from its own
thread, as ``EngineLoop`` does (the real runner and model are exercised end
to end in tests/app); what is checked here is the glue's contract.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import GenerationFinished, Message, Submit, SubmitFailed, Submitted
from bargein.session.errors import TokenLogUnavailable
from bargein.session.runtime.admission import Admission, AdmissionConfig
from bargein.session.runtime.one_at_a_time import OneAtATime
from bargein.session.runtime.service import Owner, Service
from bargein.session.streams.log import LogEntry, MemoryTokenLog, StreamEnd, StreamInfo, StreamWrite
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async


class ChatTemplate:
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> list[int]:
        return [1, 2, 3]


@dataclass
class Stats:
    """The fields of ``EngineStats`` the runtime reads."""

    last_step_s: float = 0.001
    step_budget: None = None  # no ITL target: admission does not model the load


class ThreadedEngine:
    """Calls the listeners from another thread, one call per step."""

    tokenizer = ChatTemplate()
    max_model_len = 64
    model_name = "stand-in"

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.requests: list[EngineRequest] = []
        self.aborted: list[tuple[str, FinishReason]] = []
        self.kept_tokens: list[int | None] = []

    def add_step_listener(self, fn: Any) -> None:
        self.listeners.append(fn)

    def remove_step_listener(self, fn: Any) -> None:
        if fn in self.listeners:
            self.listeners.remove(fn)

    def submit(self, request: EngineRequest) -> None:
        self.requests.append(request)

    def abort(
        self,
        request_id: str,
        reason: FinishReason,
        *,
        only_if_waiting: bool = False,
        keep_tokens: int | None = None,
    ) -> None:
        self.aborted.append((request_id, reason))
        self.kept_tokens.append(keep_tokens)

    def stats(self) -> Stats:
        return Stats()

    def run_steps(self, steps: Sequence[list[RequestOutput]]) -> None:
        def run() -> None:
            for outputs in steps:
                for fn in self.listeners:
                    fn(outputs)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()


class CountingLog(MemoryTokenLog):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[StreamWrite]] = []

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        self.writes.append(list(writes))
        await super().write_step(writes)


def logged_to(log: MemoryTokenLog, stream_id: str, end: int) -> Callable[[], Awaitable[bool]]:
    """A condition for :func:`wait_until_async`: the log holds ``stream_id``'s tokens up to ``end``."""

    async def logged() -> bool:
        info = await log.info(stream_id)
        return info is not None and info.end >= end

    return logged


def out(request_id: str, n: int, text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        new_token_ids=(100 + n,),
        text=text,
        num_prompt_tokens=3,
        num_output_tokens=n + 1,
        finished=finished,
        finish_reason=FinishReason.STOP if finished else None,
    )


async def test_each_engine_step_is_one_log_write_and_finishes_reach_the_owner() -> None:
    engine, log = ThreadedEngine(), CountingLog()
    service = Service(engine, log, SessionConfig(), secret=b"k")
    await service.start()
    finished: list[GenerationFinished] = []
    owner = Owner(principal="p", session_id="sess", on_finish=finished.append)
    for stream_id in ("a", "b"):
        submit = Submit(
            response_id=f"r-{stream_id}",
            stream_id=stream_id,
            messages=(Message(role="user", content="hi"),),
            params=SamplingParams(max_tokens=4),
        )
        assert isinstance(await service.submit(submit, owner, 0.0), Submitted)
    assert [r.prompt_token_ids for r in engine.requests] == [(1, 2, 3), (1, 2, 3)]
    engine.run_steps(
        [
            [out("a", 0, "Hel"), out("b", 0, "Yo")],
            [out("a", 1, "lo", finished=True), out("b", 1, "!")],
            [out("b", 2, "", finished=True)],
        ]
    )
    await wait_until(lambda: len(finished) == 2, "both finishes to reach the owner")
    await service.stop()
    assert [[w.stream_id for w in step] for step in log.writes] == [["a", "b"], ["a", "b"], ["b"]]
    assert log.writes[1][0] == StreamWrite(
        stream_id="a",
        entry=LogEntry(start=1, end=2, text="lo", token_ids=(101,)),
        finish=StreamEnd(end=2, finish_reason="stop", prompt_tokens=3, completion_tokens=2, cached_tokens=0),
    )
    assert [(f.stream_id, f.text) for f in finished] == [("a", "Hello"), ("b", "Yo!")]


async def test_abort_reaches_the_engine_and_its_latency_is_recorded() -> None:
    engine, log = ThreadedEngine(), CountingLog()
    service = Service(engine, log, SessionConfig(), secret=b"k")
    await service.start()
    submit = Submit(
        response_id="r",
        stream_id="s",
        params=SamplingParams(max_tokens=4),
        messages=(Message(role="user", content="hi"),),
    )
    await service.submit(submit, Owner(principal="p", session_id="sess"), 0.0)
    service.abort("s", FinishReason.INTERRUPTED, requested_at=service.clock())
    assert engine.aborted == [("s", FinishReason.INTERRUPTED)]
    final = RequestOutput(
        request_id="s",
        new_token_ids=(),
        text="",
        num_prompt_tokens=3,
        num_output_tokens=0,
        finished=True,
        finish_reason=FinishReason.INTERRUPTED,
    )
    engine.run_steps([[final]])
    await wait_until(lambda: service.num_interrupts, "the interrupt to be recorded")
    await service.stop()
    assert len(service.interrupt_latencies_s) == 1
    assert (await log.info("s")).finish.finish_reason == "interrupted"  # type: ignore[union-attr]


async def test_a_barge_in_keeps_the_kv_of_the_prompt_and_the_heard_tokens() -> None:
    """The engine is told how many tokens' KV stay cached: the prompt's and
    those of the logged tokens wholly inside the heard text; the salt of the
    request is its principal's."""
    engine, log = ThreadedEngine(), CountingLog()
    service = Service(engine, log, SessionConfig(), secret=b"k")
    await service.start()
    submit = Submit(
        response_id="r",
        stream_id="s",
        params=SamplingParams(max_tokens=8),
        messages=(Message(role="user", content="hi"),),
    )
    await service.submit(submit, Owner(principal="key:a", session_id="sess"), 0.0)
    (request,) = engine.requests
    assert request.cache_salt == "key:a"
    engine.run_steps([[out("s", 0, "Once")], [out("s", 1, " upon")], [out("s", 2, " a")]])
    await wait_until_async(logged_to(log, "s", 3), "the three tokens in the log")
    service.abort("s", FinishReason.INTERRUPTED, requested_at=service.clock(), kept_chars=7)  # "Once up"
    service.abort("s", FinishReason.INTERRUPTED, requested_at=service.clock())
    prompt = len(request.prompt_token_ids)
    assert engine.kept_tokens == [prompt + 1, prompt + 3]  # "Once" only; then every logged token
    await service.stop()


def test_a_shared_prefix_cache_has_no_salt() -> None:
    service = Service(
        ThreadedEngine(), MemoryTokenLog(), SessionConfig(shared_prefix_cache=True), secret=b"k"
    )
    assert service.cache_salt("key:a") is None


class DownLog(MemoryTokenLog):
    async def create_stream(self, info: StreamInfo) -> None:
        raise TokenLogUnavailable("redis: connection refused")


async def test_a_log_that_cannot_create_the_stream_refuses_the_request_retryably() -> None:
    engine = ThreadedEngine()
    service = Service(engine, DownLog(), SessionConfig(), secret=b"k")
    await service.start()
    submit = Submit(
        response_id="r",
        stream_id="s",
        messages=(Message(role="user", content="hi"),),
        params=SamplingParams(max_tokens=4),
    )
    result = await service.submit(submit, Owner(principal="p", session_id="sess"), 0.0)
    await service.stop()
    assert isinstance(result, SubmitFailed)
    assert result.code is pe.ErrorCode.INTERNAL_ERROR and result.code.retryable
    assert engine.requests == []  # nothing reached the engine


async def test_nothing_is_logged_once_a_cancel_is_accepted() -> None:
    # The step in flight when the cancel arrived still samples a token (and
    # may even finish with "length"): it was sampled after the user spoke, so
    # it is not logged, and the end says where the logged tokens stop.
    engine, log = ThreadedEngine(), CountingLog()
    service = Service(engine, log, SessionConfig(), secret=b"k")
    await service.start()
    finished: list[GenerationFinished] = []
    submit = Submit(
        response_id="r",
        stream_id="s",
        params=SamplingParams(max_tokens=3),
        messages=(Message(role="user", content="hi"),),
    )
    await service.submit(submit, Owner(principal="p", session_id="sess", on_finish=finished.append), 0.0)
    engine.run_steps([[out("s", 0, "Hel")], [out("s", 1, "lo")]])
    await wait_until(lambda: len(log.writes) == 2, "both steps in the log")
    service.abort("s", FinishReason.INTERRUPTED, requested_at=service.clock())
    in_flight = RequestOutput(
        request_id="s",
        new_token_ids=(102,),
        text=" you",
        num_prompt_tokens=3,
        num_output_tokens=3,
        finished=True,
        finish_reason=FinishReason.LENGTH,
    )
    engine.run_steps([[in_flight]])
    await wait_until(lambda: finished, "the finish to reach the owner")
    await service.stop()
    items = [item async for item in log.read("s", 0)]
    assert [i.end for i in items if isinstance(i, LogEntry)] == [1, 2]
    end = items[-1]
    assert isinstance(end, StreamEnd)
    assert (end.end, end.completion_tokens, end.finish_reason) == (2, 2, "interrupted")
    assert finished[0].text == "Hello"  # the turn, like the stream, stops before " you"


class BlockingTemplate:
    """A chat template that holds each render until released, counting how
    many run at once per conversation (its first message's content)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> list[int]:
        key = conversation[0]["content"]
        with self.lock:
            self.running[key] = self.running.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.running[key])
        self.release.wait(timeout=10)
        with self.lock:
            self.running[key] -= 1
        return [1, 2, 3]


class WatchedTurns(OneAtATime):
    """The service's one-tokenization-per-connection gate, counting per key the
    submits that asked for their turn and those that got it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[str] = Counter()
        self.got: Counter[str] = Counter()

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        self.asked[key] += 1
        async with super().hold(key):
            self.got[key] += 1
            yield


async def test_one_connection_tokenizes_one_prompt_at_a_time() -> None:
    engine, log = ThreadedEngine(), CountingLog()
    engine.tokenizer = BlockingTemplate()  # type: ignore[assignment]
    service = Service(engine, log, SessionConfig(), secret=b"k")
    turns = service._submitter._tokenizing = WatchedTurns()
    await service.start()

    def submit(n: int, connection: str) -> Any:
        action = Submit(
            response_id=f"r{n}",
            stream_id=f"s{n}",
            messages=(Message(role="user", content=connection),),
            params=SamplingParams(max_tokens=4),
        )
        return service.submit(action, Owner(principal="p", session_id=connection), 0.0)

    pending = [asyncio.ensure_future(submit(n, conn)) for n, conn in enumerate(["a", "a", "a", "b", "b"])]
    # The moment has passed once all five asked for their turn (from then on each
    # either renders or waits) and one render of each connection runs.
    await wait_until(
        lambda: turns.asked == {"a": 3, "b": 2} and engine.tokenizer.running.keys() == {"a", "b"},
        "all five submits at the gate, a render of each connection running",
    )
    assert turns.got == {"a": 1, "b": 1}  # the others wait their turn: none of them went on to render
    engine.tokenizer.release.set()
    results = await asyncio.gather(*pending)
    await service.stop()
    assert all(isinstance(r, Submitted) for r in results)
    assert turns.got == {"a": 3, "b": 2}
    assert engine.tokenizer.most == {"a": 1, "b": 1}


# ---- fault injection: the step writer (issue 24) ------------------------------------


async def read_all(log: MemoryTokenLog, stream_id: str) -> list[LogEntry | StreamEnd]:
    """The stream's items up to its end (bounded: a stream that never ends fails)."""
    async with asyncio.timeout(HANG_GUARD_S):
        return [item async for item in log.read(stream_id, 0)]


def capped_service(engine: ThreadedEngine, log: MemoryTokenLog) -> Service:
    """One response per principal at a time: a leaked admission slot refuses the next."""
    return Service(
        engine,
        log,
        SessionConfig(),
        secret=b"k",
        admission=Admission(AdmissionConfig(max_active_per_principal=1)),
    )


async def submit_one(
    service: Service, stream_id: str, finished: list[GenerationFinished] | None = None
) -> Submitted | SubmitFailed:
    submit = Submit(
        response_id=f"r-{stream_id}",
        stream_id=stream_id,
        messages=(Message(role="user", content="hi"),),
        params=SamplingParams(max_tokens=4),
    )
    on_finish = None if finished is None else finished.append
    return await service.submit(submit, Owner(principal="p", session_id="sess", on_finish=on_finish), 0.0)


async def test_a_crashed_writer_fails_the_steps_streams_and_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug between the engine's step and the log write (here: the takeover
    # translation) used to end the writer task for good: every stream froze.
    engine, log = ThreadedEngine(), CountingLog()
    service = capped_service(engine, log)
    await service.start()
    finished: list[GenerationFinished] = []
    assert isinstance(await submit_one(service, "a", finished), Submitted)
    continued = service._outputs.continued
    calls = iter([RuntimeError("injected")])

    def crash_once(output: RequestOutput) -> RequestOutput:
        for exc in calls:
            raise exc
        return continued(output)

    monkeypatch.setattr(service._outputs, "continued", crash_once)
    engine.run_steps([[out("a", 0, "Hel")]])
    items = await read_all(log, "a")  # the reader gets an end, not a hang
    end = items[-1]
    assert isinstance(end, StreamEnd) and end.finish_reason == "error"
    assert end.error is not None and end.error.code == "internal_error"
    assert ("a", FinishReason.ERROR) in engine.aborted  # its KV blocks are freed
    assert [(f.stream_id, f.finish_reason) for f in finished] == [("a", FinishReason.ERROR)]
    assert service.health.not_ready() and "token-log-writer" in service.health.not_ready()[0]
    # The writer came back, and the admission slot with it: the next request goes through.
    assert isinstance(await submit_one(service, "b", finished), Submitted)
    engine.run_steps([[out("b", 0, "Yo", finished=True)]])
    assert [i.text for i in await read_all(log, "b") if isinstance(i, LogEntry)] == ["Yo"]
    await wait_until(lambda: not service.health.not_ready(), "the writer to report healthy")
    await service.stop()


async def test_a_stream_the_log_dropped_fails_alone() -> None:
    # A stream past the memory log's live TTL makes the whole step's write
    # raise StreamNotFound; the other streams of the step must go on.
    now = [0.0]
    log = MemoryTokenLog(live_ttl_s=10.0, clock=lambda: now[0])
    engine = ThreadedEngine()
    service = Service(engine, log, SessionConfig(), secret=b"k")
    await service.start()
    finished: list[GenerationFinished] = []
    assert isinstance(await submit_one(service, "old", finished), Submitted)
    now[0] = 5.0
    assert isinstance(await submit_one(service, "new"), Submitted)
    now[0] = 11.0  # "old" expired, "new" lives
    engine.run_steps([[out("old", 0, "a"), out("new", 0, "b")], [out("new", 1, "c", finished=True)]])
    items = await read_all(log, "new")
    assert [i.text for i in items if isinstance(i, LogEntry)] == ["b", "c"]
    assert isinstance(items[-1], StreamEnd) and items[-1].finish_reason == "stop"
    assert ("old", FinishReason.ERROR) in engine.aborted
    assert [(f.stream_id, f.finish_reason) for f in finished] == [("old", FinishReason.ERROR)]
    await service.stop()


class RefusingLog(MemoryTokenLog):
    """A log whose writes all raise (a bug in a backend) while ``broken``."""

    broken = True

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        if self.broken:
            raise RuntimeError("injected: write_step is broken")
        await super().write_step(writes)


async def test_a_log_that_refuses_every_write_reports_the_writer_and_ends_its_readers() -> None:
    engine, log = ThreadedEngine(), RefusingLog()
    service = capped_service(engine, log)
    await service.start()
    finished: list[GenerationFinished] = []
    await submit_one(service, "a", finished)
    reader = asyncio.create_task(read_all(log, "a"))
    await asyncio.sleep(0)
    engine.run_steps([[out("a", 0, "Hel")]])
    with pytest.raises(TokenLogUnavailable):  # not even an error end fits: a retryable read error
        await reader
    assert ("a", FinishReason.ERROR) in engine.aborted
    assert [f.finish_reason for f in finished] == [FinishReason.ERROR]
    assert "token-log-writer: crashed (RuntimeError" in service.health.not_ready()[0]
    log.broken = False  # the log works again: so do the writer and the node
    await submit_one(service, "b")
    engine.run_steps([[out("b", 0, "Yo", finished=True)]])
    assert isinstance((await read_all(log, "b"))[-1], StreamEnd)
    await wait_until(lambda: not service.health.not_ready(), "the writer to report healthy")
    await service.stop()
