"""EngineLoop on the real model: thread-safe submit/abort, listeners, shutdown, crash.

Aborts are triggered from inside a step (a hook around the real model
runner's ``execute``, on the engine thread) so each lands in a known state:
before the request is scheduled, mid-prefill, while decoding, after finish.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.errors import DuplicateRequestError, EngineStoppedError, PromptTooLongError
from bargein.engine.loop import EngineLoop
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from tests.engine.conftest import RunnerFactory
from tests.waiting import wait_until_sync

pytestmark = pytest.mark.slow

CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, prefill_chunk_size=16, max_model_len=512)
NUM_BLOCKS = 64


class HookedRunner:
    """The real ModelRunner, with a hook called on the engine thread before each forward."""

    def __init__(self, inner: ModelRunner) -> None:
        self._inner = inner
        self.hook: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute(self, seqs: Any) -> Any:
        if self.hook is not None:
            self.hook()
        return self._inner.execute(seqs)


class Collector:
    """A step listener recording every call; waits for requests to end."""

    def __init__(self) -> None:
        self.calls: list[list[RequestOutput]] = []
        self._cond = threading.Condition()

    def __call__(self, outputs: list[RequestOutput]) -> None:
        with self._cond:
            self.calls.append(list(outputs))
            self._cond.notify_all()

    def outputs(self, request_id: str) -> list[RequestOutput]:
        with self._cond:
            return [o for call in self.calls for o in call if o.request_id == request_id]

    def wait_finished(self, *request_ids: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(any(o.finished for o in self.outputs(r)) for r in request_ids):
                assert self._cond.wait(deadline - time.monotonic()), f"timeout waiting for {request_ids}"


@pytest.fixture(scope="module")
def shared_runner(model_runner_factory: RunnerFactory) -> ModelRunner:
    # One model and KV tensor for all engines here (one at a time): every block
    # is written before it is read, so engines need not zero it.
    return model_runner_factory(num_blocks=NUM_BLOCKS, max_model_len=CONFIG.max_model_len)


@pytest.fixture
def setup(shared_runner: ModelRunner) -> Iterator[tuple[EngineLoop, HookedRunner, Collector]]:
    hooked = HookedRunner(shared_runner)
    engine_loop = EngineLoop(LLMEngine(hooked, CONFIG))  # type: ignore[arg-type]
    collector = Collector()
    engine_loop.add_step_listener(collector)
    engine_loop.start()
    yield engine_loop, hooked, collector
    engine_loop.shutdown()


def request(
    tokenizer: PreTrainedTokenizerBase,
    request_id: str,
    text: str = "Tell me about the sea.",
    max_tokens: int = 8,
) -> EngineRequest:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(request_id=request_id, prompt_token_ids=tuple(ids), params=params)


def assert_ended_once(collector: Collector, request_id: str, reason: FinishReason) -> list[RequestOutput]:
    outs = collector.outputs(request_id)
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
    assert outs[-1].finish_reason is reason
    return outs


def when(
    engine: LLMEngine, request_id: str, pred: Callable[[Any], bool], action: Callable[[], None]
) -> Callable[[], None]:
    """A hook running ``action`` once, in the step where ``pred(seq)`` holds for the live request."""
    fired = []

    def hook() -> None:
        seq = engine.scheduler.get(request_id)
        if not fired and seq is not None and pred(seq):
            fired.append(True)
            action()

    return hook


def test_requests_finish_once_and_listener_gets_whole_steps(setup, hf_tokenizer) -> None:
    engine_loop, _, collector = setup
    for i in range(4):
        engine_loop.submit(request(hf_tokenizer, f"r{i}", max_tokens=5 + i))
    collector.wait_finished(*(f"r{i}" for i in range(4)))
    for i in range(4):
        outs = assert_ended_once(collector, f"r{i}", FinishReason.LENGTH)
        assert sum(len(o.new_token_ids) for o in outs) == 5 + i
    # One hand-off per step: requests decoding together arrive in one call.
    assert max(len(call) for call in collector.calls) >= 2
    assert all(len({o.request_id for o in call}) == len(call) for call in collector.calls)
    stats = engine_loop.stats()
    assert stats.num_free_blocks == NUM_BLOCKS and stats.num_running == stats.num_waiting == 0
    assert stats.num_generated_tokens == 5 + 6 + 7 + 8
    assert stats.num_finished_by_reason == {"length": 4}


def test_abort_before_scheduled(setup, hf_tokenizer) -> None:
    engine_loop, hooked, collector = setup
    victim = request(hf_tokenizer, "victim")

    def submit_and_abort() -> None:  # both land in the queues mid-step
        engine_loop.submit(victim)
        engine_loop.abort("victim", FinishReason.CANCELLED)

    hooked.hook = when(engine_loop.engine, "other", lambda seq: True, submit_and_abort)
    engine_loop.submit(request(hf_tokenizer, "other", max_tokens=4))
    collector.wait_finished("victim", "other")
    outs = assert_ended_once(collector, "victim", FinishReason.CANCELLED)
    assert outs == [outs[-1]] and outs[-1].num_output_tokens == 0 and outs[-1].new_token_ids == ()
    assert_ended_once(collector, "other", FinishReason.LENGTH)


@pytest.mark.parametrize(
    ("state", "pred"),
    [
        ("mid_prefill", lambda seq: seq.num_computed_tokens == 0 and seq.block_table),
        ("decoding", lambda seq: seq.num_output_tokens == 3),
    ],
)
def test_abort_mid_prefill_and_decoding(setup, hf_tokenizer, state: str, pred: Callable[[Any], bool]) -> None:
    engine_loop, hooked, collector = setup
    req = request(hf_tokenizer, "victim", max_tokens=100)
    assert len(req.prompt_token_ids) > CONFIG.prefill_chunk_size
    seen: list[int] = []

    def abort() -> None:
        seq = engine_loop.engine.scheduler.get("victim")
        seen.append(seq.num_output_tokens)
        engine_loop.abort("victim")

    hooked.hook = when(engine_loop.engine, "victim", pred, abort)
    engine_loop.submit(req)
    collector.wait_finished("victim")
    outs = assert_ended_once(collector, "victim", FinishReason.INTERRUPTED)
    assert outs[-1].new_token_ids == ()
    # Drained at the start of the next step: the step under way still completes.
    expected_tokens = 0 if state == "mid_prefill" else seen[0] + 1
    assert outs[-1].num_output_tokens == expected_tokens
    assert engine_loop.stats().num_free_blocks == NUM_BLOCKS


def test_abort_keep_tokens_reaches_the_engine(setup, hf_tokenizer) -> None:
    engine_loop, hooked, collector = setup
    req = request(hf_tokenizer, "victim", max_tokens=100)
    keep = len(req.prompt_token_ids) + 2  # the user heard two tokens
    abort = lambda: engine_loop.abort("victim", keep_tokens=keep)  # noqa: E731
    hooked.hook = when(engine_loop.engine, "victim", lambda seq: seq.num_output_tokens == 20, abort)
    with pytest.raises(ValueError, match="keep_tokens"):
        engine_loop.abort("victim", keep_tokens=-1)
    engine_loop.submit(req)
    collector.wait_finished("victim")
    assert_ended_once(collector, "victim", FinishReason.INTERRUPTED)
    stats = engine_loop.stats()
    assert stats.num_free_blocks == NUM_BLOCKS
    assert stats.num_cached_free_blocks == keep // engine_loop.engine.pool.block_size


def test_abort_after_finish_is_a_no_op(setup, hf_tokenizer) -> None:
    engine_loop, _, collector = setup
    engine_loop.submit(request(hf_tokenizer, "done", max_tokens=2))
    collector.wait_finished("done")
    engine_loop.abort("done")
    engine_loop.abort("never-existed")
    engine_loop.submit(request(hf_tokenizer, "next", max_tokens=2))
    collector.wait_finished("next")
    assert_ended_once(collector, "done", FinishReason.LENGTH)
    assert engine_loop.stats().num_finished_by_reason == {"length": 2}


def test_submit_validates_synchronously(setup, hf_tokenizer) -> None:
    engine_loop, _, collector = setup
    with pytest.raises(PromptTooLongError) as info:
        engine_loop.submit(EngineRequest(request_id="long", prompt_token_ids=(1,) * CONFIG.max_model_len))
    assert info.value.num_prompt_tokens == CONFIG.max_model_len
    engine_loop.submit(request(hf_tokenizer, "dup", max_tokens=3))
    with pytest.raises(DuplicateRequestError):
        engine_loop.submit(request(hf_tokenizer, "dup"))
    collector.wait_finished("dup")
    assert_ended_once(collector, "dup", FinishReason.LENGTH)


IDLE_WINDOW_S = 1.0


def test_idle_loop_sleeps(setup, hf_tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle, the engine thread blocks on its condition: it neither steps nor
    checks for work. Counted, not timed: a loop polling every 5 ms would call
    ``step`` (or check ``has_unfinished_requests``) ~200 times in the window,
    however little CPU each poll costs."""
    engine_loop, _, collector = setup
    engine_loop.submit(request(hf_tokenizer, "r", max_tokens=2))
    collector.wait_finished("r")
    steps = engine_loop.stats().num_steps
    calls: Counter[str] = Counter()
    engine = engine_loop.engine
    for name in ("step", "has_unfinished_requests"):
        real = getattr(engine, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(engine, name, counted)  # the engine thread looks it up per call
    # The idle window itself is what is tested (not a wait for something): a poll
    # of any period under it is counted; a loaded box only makes it longer.
    time.sleep(IDLE_WINDOW_S)
    # At most the one check the thread may make on its way back to the wait
    # after the last step's hand-off (the collector saw the end before it).
    assert calls["step"] == 0, calls
    assert calls["has_unfinished_requests"] <= 1, calls
    assert engine_loop.stats().num_steps == steps


def test_shutdown_cancels_live_requests_and_refuses_new_ones(setup, hf_tokenizer) -> None:
    engine_loop, hooked, collector = setup
    started = threading.Event()
    hooked.hook = when(engine_loop.engine, "a", lambda seq: seq.num_output_tokens >= 2, started.set)
    for name in ("a", "b"):
        engine_loop.submit(request(hf_tokenizer, name, max_tokens=400))
    assert started.wait(60)
    engine_loop.shutdown()
    for name in ("a", "b"):
        assert_ended_once(collector, name, FinishReason.CANCELLED)
    assert engine_loop.stats().num_free_blocks == NUM_BLOCKS
    with pytest.raises(EngineStoppedError):
        engine_loop.submit(request(hf_tokenizer, "late"))


def test_crash_ends_live_requests_with_error(setup, hf_tokenizer) -> None:
    engine_loop, hooked, collector = setup

    def boom() -> None:
        raise RuntimeError("injected failure")

    hooked.hook = when(engine_loop.engine, "a", lambda seq: seq.num_output_tokens >= 1, boom)
    engine_loop.submit(request(hf_tokenizer, "a", max_tokens=50))
    engine_loop.submit(request(hf_tokenizer, "b", max_tokens=50))
    collector.wait_finished("a", "b")
    assert_ended_once(collector, "a", FinishReason.ERROR)
    assert_ended_once(collector, "b", FinishReason.ERROR)
    with pytest.raises(EngineStoppedError):
        engine_loop.submit(request(hf_tokenizer, "c"))
    assert isinstance(engine_loop.error, RuntimeError)


async def test_generate_yields_until_finished(setup, hf_tokenizer) -> None:
    engine_loop, _, _ = setup
    outs = [o async for o in engine_loop.generate(request(hf_tokenizer, "g", max_tokens=6))]
    assert [o.finished for o in outs] == [False] * 5 + [True]
    assert [o.num_output_tokens for o in outs] == [1, 2, 3, 4, 5, 6]
    text = "".join(o.text for o in outs)
    ids = [t for o in outs for t in o.new_token_ids]
    assert text == hf_tokenizer.decode(ids, skip_special_tokens=True) and text


async def test_leaving_generate_early_cancels_the_request(setup, hf_tokenizer) -> None:
    engine_loop, _, collector = setup
    agen = engine_loop.generate(request(hf_tokenizer, "g", max_tokens=200))
    async for out in agen:
        if out.num_output_tokens == 2:
            break
    await agen.aclose()
    collector.wait_finished("g")
    outs = assert_ended_once(collector, "g", FinishReason.CANCELLED)
    assert outs[-1].num_output_tokens < 200
    assert Counter(o.request_id for o in collector.outputs("g") if o.finished) == {"g": 1}


def test_shutdown_before_start_cancels_queued_requests(shared_runner: ModelRunner, hf_tokenizer) -> None:
    engine_loop = EngineLoop(LLMEngine(shared_runner, CONFIG))
    collector = Collector()
    engine_loop.add_step_listener(collector)
    engine_loop.submit(request(hf_tokenizer, "queued"))
    engine_loop.shutdown()
    assert_ended_once(collector, "queued", FinishReason.CANCELLED)
    with pytest.raises(EngineStoppedError):
        engine_loop.submit(request(hf_tokenizer, "late"))


def test_build_and_start_steps_the_engine_on_the_thread_that_built_it(
    shared_runner: ModelRunner, hf_tokenizer
) -> None:
    # libgomp throttles every team's spin once its teams outnumber the CPUs:
    # the loading thread must be the stepping thread (EngineLoop.build_and_start)
    threads: dict[str, threading.Thread] = {}

    def build() -> LLMEngine:
        threads["build"] = threading.current_thread()
        return LLMEngine(shared_runner, CONFIG)

    engine_loop = EngineLoop.build_and_start(build)
    collector = Collector()
    engine_loop.add_step_listener(lambda outputs: threads.setdefault("step", threading.current_thread()))
    engine_loop.add_step_listener(collector)
    try:
        engine_loop.submit(request(hf_tokenizer, "b", max_tokens=4))
        collector.wait_finished("b")
        assert_ended_once(collector, "b", FinishReason.LENGTH)
    finally:
        engine_loop.shutdown()
    assert threads["step"] is threads["build"] is not threading.current_thread()
    assert threads["build"].name == "bargein-engine"


def test_build_and_start_raises_what_building_raised_on_the_caller() -> None:
    before = set(threading.enumerate())

    def build() -> LLMEngine:
        raise FileNotFoundError("no such model")

    with pytest.raises(FileNotFoundError, match="no such model"):
        EngineLoop.build_and_start(build)
    # the builder thread ends right after it hands the error over
    wait_until_sync(
        lambda: not [t for t in set(threading.enumerate()) - before if t.name == "bargein-engine"],
        "the builder thread to end",
    )
