"""Prefill-only requests (engine/speculative_prefill.py): the prefix cache
filled ahead, at the lowest priority, without a token.

The scheduler is stepped by hand (no model) for the priority rules: what a
prefill-only request computes, what real work takes from it (step budget,
running slots, KV blocks) and the counters; the engine with the real model
for what a user of the cache relies on: a real request that hits the
speculatively prefilled blocks gives the same tokens and logits as one on an
empty cache, and the prefill-only request produces no token.
"""

from __future__ import annotations

import pytest
import torch

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.kv_cache import BlockPool
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from bargein.engine.scheduler import Scheduler, SchedulerOutput
from tests.engine.test_batch_invariance import Recorder

BLOCK = 4


def make(*, num_blocks: int = 64, max_num_seqs: int = 8, budget: int = 64, chunk: int = 16) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        prefill_chunk_size=chunk,
        max_model_len=128,
        enable_prefix_caching=True,
    )
    return Scheduler(config, BlockPool(num_blocks, BLOCK), eos_token_ids=[2])


def prompt(num: int, first: int = 100) -> tuple[int, ...]:
    return tuple(first + i for i in range(num))


def real(request_id: str, ids: tuple[int, ...]) -> EngineRequest:
    params = SamplingParams(max_tokens=50, temperature=0.0)
    return EngineRequest(request_id=request_id, prompt_token_ids=ids, params=params)


def prefill(request_id: str, ids: tuple[int, ...]) -> EngineRequest:
    return EngineRequest(request_id=request_id, prompt_token_ids=ids, prefill_only=True)


def plan_of(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    """(id, start_pos, num_tokens, sample) per scheduled sequence, in order."""
    return [(s.seq.request_id, s.start_pos, len(s.token_ids), s.sample) for s in out.scheduled]


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sched.update(out, [7] * out.num_sample)
    return out


def ended(sched: Scheduler) -> dict[str, FinishReason | None]:
    return {seq.request_id: seq.finish_reason for seq in sched.speculative.take_ended()}


def test_a_prefill_only_request_fills_the_cache_samples_nothing_and_a_real_request_hits_it() -> None:
    sched = make()
    sched.add(prefill("p", prompt(10)))
    out = step(sched)
    # its two full blocks, no sample; the partial last block is not computed
    assert plan_of(out) == [("p", 0, 8, False)]
    assert ended(sched) == {"p": FinishReason.STOP}
    assert not sched.has_unfinished()
    assert sched.pool.num_cached_blocks == 2 and sched.pool.num_free_blocks == sched.pool.num_total_blocks
    # the real turn: the partial text's tokens, then more
    me = sched.add(real("me", prompt(10) + (5, 6, 7)))
    assert plan_of(step(sched)) == [("me", 8, 5, True)]
    assert me.num_cached_tokens == 8
    spec = sched.speculative
    assert (spec.num_prefilled_tokens, spec.num_hit_tokens) == (8, 8)
    # the real request's own hits are the prefix cache's; the prefill's lookups are not counted there
    assert (sched.num_prefix_cache_queries, sched.num_prefix_cache_hits) == (13, 8)


def test_blocks_past_where_the_final_text_departs_are_not_hit_and_count_as_dropped() -> None:
    sched = make()
    sched.add(prefill("p", prompt(12)))
    step(sched)
    # the final turn departs inside the second block
    me = sched.add(real("me", prompt(6) + (1, 2, 3, 4, 5, 6, 7)))
    step(sched)
    assert me.num_cached_tokens == 4
    assert (sched.speculative.num_prefilled_tokens, sched.speculative.num_hit_tokens) == (12, 4)


def test_real_work_comes_first_in_the_step_and_the_prefill_takes_what_is_left() -> None:
    sched = make(budget=12, chunk=12)
    sched.add(prefill("p", prompt(16, first=500)))
    sched.add(real("r", prompt(10)))
    assert plan_of(step(sched)) == [("r", 0, 10, True), ("p", 0, 2, False)]
    # r decodes; p goes on with the rest of the budget
    assert plan_of(step(sched)) == [("r", 10, 1, True), ("p", 2, 11, False)]


def test_a_waiting_real_request_is_never_overtaken() -> None:
    sched = make(max_num_seqs=1)
    sched.add(real("r1", prompt(5)))
    step(sched)  # r1 runs and holds the only slot
    sched.add(real("r2", prompt(5, first=300)))
    sched.add(prefill("p", prompt(8, first=500)))
    for _ in range(3):
        assert [s.seq.request_id for s in step(sched).scheduled] == ["r1"]
    assert sched.get("p") is not None  # still waiting: nothing dropped it, nothing ran it


def test_a_real_request_takes_the_slot_of_a_running_prefill() -> None:
    sched = make(max_num_seqs=1, chunk=4)
    sched.add(prefill("p", prompt(16, first=500)))
    step(sched)  # p prefills its first chunk and holds the only slot
    sched.add(real("r", prompt(5)))
    out = step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["r"]
    assert ended(sched) == {"p": FinishReason.CANCELLED}
    # what p filled before it was dropped stays cached
    assert sched.pool.num_cached_blocks >= 1


def test_a_real_request_short_of_blocks_drops_the_prefill_and_preempts_no_real_one() -> None:
    sched = make(num_blocks=8, chunk=8)
    sched.add(real("r1", prompt(6)))
    step(sched)  # r1: 2 blocks
    sched.add(prefill("p", prompt(24, first=500)))
    step(sched)  # p: 2 blocks computed (chunk 8)
    step(sched)  # p: 4 blocks
    assert sched.pool.num_free_blocks == 2  # 8 - r1's 2 - p's 4
    sched.add(real("r2", prompt(20, first=300)))  # its first chunk needs 2 blocks, r1 its third
    out = step(sched)
    assert "r2" in [s.seq.request_id for s in out.scheduled]
    assert ended(sched) == {"p": FinishReason.CANCELLED}
    assert sched.num_preemptions == 0 and not out.preempted_ids


def test_a_prefill_the_real_request_overtakes_is_dropped_not_computed_twice() -> None:
    sched = make(chunk=4)
    sched.add(prefill("p", prompt(20)))
    step(sched)  # p computed its first block
    sched.add(real("me", prompt(20) + (9,)))
    out = step(sched)
    assert plan_of(out) == [("me", 4, 4, False)]  # me goes on from p's block; p is gone
    assert ended(sched) == {"p": FinishReason.CANCELLED}


def test_an_aborted_prefill_ends_like_any_request() -> None:
    sched = make(chunk=4)
    seq = sched.add(prefill("p", prompt(20)))
    step(sched)
    assert sched.abort("p", FinishReason.CANCELLED) is seq
    assert not sched.has_unfinished()
    assert not ended(sched)  # an abort's output is the engine's, not a drop
    sched.pool.assert_consistent(held=[])


def test_a_prefill_of_a_prompt_already_cached_ends_at_once() -> None:
    sched = make()
    sched.add(real("r", prompt(9)))
    step(sched)  # its prompt: two full blocks registered
    sched.finish("r", FinishReason.STOP)
    sched.add(prefill("p", prompt(8)))
    assert step(sched).is_empty
    assert ended(sched) == {"p": FinishReason.STOP}
    assert sched.speculative.num_prefilled_tokens == 0


# ---- the engine with the real model ---------------------------------------------

MAX_MODEL_LEN = 512
MAX_TOKENS = 8
CONVERSATION = (
    "<|im_start|>system\nYou are a helpful voice assistant. Answer briefly.<|im_end|>\n"
    "<|im_start|>user\nI'd like to book a table for"
)
FINAL = " two people at seven tonight, somewhere quiet near the river.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    """The default model in the default format (auto), block size 16."""
    config = ModelConfig(device="cpu", backend="torch", dtype="float32")
    return ModelRunner(config, CacheConfig(num_blocks=4 * MAX_MODEL_LEN // 16, block_size=16), MAX_MODEL_LEN)


def generate(engine: LLMEngine, request: EngineRequest) -> tuple[list[int], torch.Tensor, int]:
    """Step until idle; request's tokens, its logits ``[MAX_TOKENS, vocab]``, its cached tokens."""
    recorder = engine.sampler = Recorder(request.params)
    engine.add_request(request)
    tokens: list[int] = []
    cached = -1
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request.request_id:
                tokens.extend(out.new_token_ids)
                cached = out.num_cached_tokens
    logits = torch.stack([recorder.logits[p] for p in sorted(recorder.logits)])
    return tokens, logits, cached


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=77, max_tokens=MAX_TOKENS, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_a_real_request_over_speculatively_prefilled_blocks_gives_the_same_tokens_and_logits(
    runner: ModelRunner, params: SamplingParams
) -> None:
    tok = runner.tokenizer
    partial = tuple(tok(CONVERSATION, add_special_tokens=False)["input_ids"])
    full = tuple(tok(CONVERSATION + FINAL, add_special_tokens=False)["input_ids"])
    assert full[: len(partial)] == partial and len(partial) > 16
    config = SchedulerConfig(max_model_len=MAX_MODEL_LEN, prefill_chunk_size=7)
    want = generate(
        LLMEngine(runner, config), EngineRequest(request_id="me", prompt_token_ids=full, params=params)
    )
    assert want[2] == 0

    engine = LLMEngine(runner, config)
    engine.add_request(EngineRequest(request_id="spec", prompt_token_ids=partial, prefill_only=True))
    outputs: list[tuple[tuple[int, ...], bool, FinishReason | None]] = []
    while engine.has_unfinished_requests():
        outputs += [(o.new_token_ids, o.finished, o.finish_reason) for o in engine.step()]
    assert outputs == [((), True, FinishReason.STOP)]  # one output, no token
    stats = engine.stats()
    assert stats.num_generated_tokens == 0 and stats.num_finished_by_reason == {}
    filled = len(partial) // 16 * 16
    assert stats.num_speculative_prefill_tokens == filled

    got = generate(engine, EngineRequest(request_id="me", prompt_token_ids=full, params=params))
    assert got[2] == filled  # the real request's prefill starts after the prefilled blocks
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1]), "a speculatively prefilled block changed a logit"
    assert engine.stats().num_speculative_prefill_hits == filled
