"""The scheduler's time budget on a fake step-time model (no model, no clock).

Each test plays the model by passing sampled tokens to ``update``; the cost
model is a fixed :class:`StepCostCoefficients`, so every plan's budget is computable by hand.
"""

from __future__ import annotations

from bargein.engine.config import SchedulerConfig
from bargein.engine.kv_cache import BlockPool
from bargein.engine.request import EngineRequest, SamplingParams
from bargein.engine.scheduler import Scheduler, SchedulerOutput
from bargein.engine.step_budget import StepCostCoefficients

# 10 ms a step, 2 ms a decode, 0.5 ms a prefill token, context free:
# a 50 ms target leaves (40 - 2 n) ms for prefill after n decodes.
COST = StepCostCoefficients(
    base_s=0.010, per_decode_s=0.002, per_prefill_token_s=0.0005, per_context_token_s=0.0
)
TARGET_S = 0.050


def make(
    *, target_s: float = TARGET_S, max_num_seqs: int = 64, cost: StepCostCoefficients = COST
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
        prefill_chunk_size=256,
        max_model_len=2048,
        enable_prefix_caching=False,
        target_itl_s=target_s,
        min_prefill_tokens=8,
    )
    return Scheduler(config, BlockPool(1024, 16), eos_token_ids=[2], step_cost=lambda: cost)


def request(request_id: str, num_prompt: int, max_tokens: int = 200) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompt = tuple(100 + (i % 50) for i in range(num_prompt))
    return EngineRequest(request_id=request_id, prompt_token_ids=prompt, params=params)


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sched.update(out, [7] * out.num_sample)
    return out


def decoding(out: SchedulerOutput) -> set[str]:
    return {s.seq.request_id for s in out.scheduled if len(s.token_ids) == 1}


def test_prefill_gets_what_the_decodes_leave_of_the_target() -> None:
    sched = make()
    for i in range(4):
        sched.add(request(f"run{i}", 10))
    while not all(s.num_output_tokens for s in sched.running) or len(sched.running) < 4:
        step(sched)
    sched.add(request("long", 1000))
    out = step(sched)
    # 4 decodes: 10 + 8 = 18 ms, 32 ms left: 64 prompt tokens at 0.5 ms
    assert decoding(out) == {f"run{i}" for i in range(4)}
    assert out.prefill_budget == 64 and out.num_prefill_tokens == 64
    assert out.predicted_s is not None and out.predicted_s <= TARGET_S
    without_target = make(target_s=0.0)
    assert without_target.step_budget() is None


def test_a_burst_of_long_prompts_never_stretches_a_running_stream() -> None:
    """Every step decodes the running stream and stays within the target;
    the prompts still go in, a budget's worth per step."""
    sched = make()
    sched.add(request("stream", 10, max_tokens=400))
    step(sched)
    for i in range(6):
        sched.add(request(f"burst{i}", 700, max_tokens=4))
    prefilled = 0
    for _ in range(300):
        if len(sched.running) + len(sched.waiting) == 1:
            break
        out = step(sched)
        assert "stream" in decoding(out)  # its next token every step: gap of one step
        assert out.prefill_budget is not None
        assert out.num_prefill_tokens <= out.prefill_budget
        assert out.predicted_s is not None and out.predicted_s <= TARGET_S
        prefilled += out.num_prefill_tokens
    assert prefilled == 6 * 700  # all six prompts went in meanwhile
    assert len(sched.running) == 1 and not sched.waiting


def test_without_a_target_a_burst_takes_whole_chunks() -> None:
    """The old behaviour, for comparison: the same burst makes steps of 512 tokens."""
    sched = make(target_s=0.0)
    sched.add(request("stream", 10, max_tokens=400))
    step(sched)
    for i in range(6):
        sched.add(request(f"burst{i}", 700, max_tokens=4))
    out = step(sched)
    assert out.budget is None and out.prefill_budget is None
    assert out.num_prefill_tokens == 511
    assert COST.predict(out.num_decode_seqs, out.num_prefill_tokens, 0) > 5 * TARGET_S


def test_the_running_batch_follows_the_budget_not_max_num_seqs() -> None:
    # one decode costs 5 ms: 10 + 8 * 0.5 + 5 n <= 50 -> at most 7 decoding
    cost = StepCostCoefficients(
        base_s=0.010, per_decode_s=0.005, per_prefill_token_s=0.0005, per_context_token_s=0.0
    )
    sched = make(cost=cost)
    for i in range(12):
        sched.add(request(f"r{i}", 4, max_tokens=3))
    out = step(sched)
    assert len(sched.running) == 7 and len(sched.waiting) == 5
    assert [s.seq.request_id for s in out.scheduled] == [f"r{i}" for i in range(7)]
    while len(sched.running) == 7 and sched.waiting:
        out = step(sched)
        assert len(sched.running) <= 7
    # the first seven finished (3 tokens each): the next ones joined in their place
    assert sched.get("r0") is None and sched.get("r7") is not None


def test_context_counts_against_the_batch() -> None:
    """Long conversations decode slower: fewer of them fit one step."""
    cost = StepCostCoefficients(
        base_s=0.010, per_decode_s=0.001, per_prefill_token_s=0.0001, per_context_token_s=1e-5
    )
    short, long_ = make(cost=cost), make(cost=cost)
    for i in range(10):
        short.add(request(f"s{i}", 20, max_tokens=50))
        long_.add(request(f"l{i}", 500, max_tokens=50))
    for _ in range(40):
        step(short)
        step(long_)
    assert len(short.running) == 10
    assert 1 <= len(long_.running) < 10


def test_a_prompt_in_prefill_progresses_when_the_decodes_alone_fill_the_budget() -> None:
    """The model got slower than the target: the running prompt still gets
    the minimum of prefill a step, and nothing new joins the batch."""
    sched = make()
    for i in range(4):
        sched.add(request(f"run{i}", 4))
    step(sched)
    sched.add(request("long", 100))
    step(sched)  # 4 decodes, and the first 64 tokens of the long prompt
    assert sched.get("long") is not None and sched.get("long").num_computed_tokens == 64  # type: ignore[union-attr]
    sched.add(request("new", 4))
    sched.step_cost = lambda: StepCostCoefficients(
        base_s=0.050, per_decode_s=0.002, per_prefill_token_s=0.0005, per_context_token_s=0.0
    )
    out = step(sched)
    assert decoding(out) == {f"run{i}" for i in range(4)}
    assert out.prefill_budget == 8 and out.num_prefill_tokens == 8
    assert [s.request_id for s in sched.waiting] == ["new"]
