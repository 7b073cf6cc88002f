"""``LLMEngine.last_step``: per-step timings and counts for metrics, over the fake runner.

Summed over a whole run they must agree with what the requests got: one TTFT,
one queue time and one end-to-end time per request, one inter-token time per
later token, every computed token counted once as prefill or decode.
"""

from __future__ import annotations

import random
import time

import pytest

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine, StepStats
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from tests.engine.fake_runner import FakeRunner

CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, prefill_chunk_size=8, max_model_len=48)


def request(request_id: str, prompt_len: int, max_tokens: int) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(range(1, prompt_len + 1)),
        params=SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
        arrival_time=time.monotonic(),
    )


@pytest.mark.parametrize("num_blocks", [100, 14])
def test_step_stats_add_up_to_what_the_requests_got(num_blocks: int) -> None:
    rng = random.Random(num_blocks)
    runner = FakeRunner(num_blocks=num_blocks)
    engine = LLMEngine(runner, CONFIG)
    requests = [request(f"r{i}", rng.randrange(1, 30), rng.randrange(1, 12)) for i in range(12)]
    for r in requests:
        engine.add_request(r)
    steps: list[StepStats] = []
    num_output = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            num_output[out.request_id] = out.num_output_tokens
        assert engine.last_step is not None
        steps.append(engine.last_step)
    total_tokens = sum(num_output.values())
    assert total_tokens == sum(r.params.max_tokens for r in requests)
    assert sum(len(s.ttfts_s) for s in steps) == len(requests)
    assert sum(len(s.queue_times_s) for s in steps) == len(requests)
    assert sum(len(s.e2e_s) for s in steps) == len(requests)
    assert sum(len(s.inter_token_s) for s in steps) == total_tokens - len(requests)
    assert sum(s.num_generated_tokens for s in steps) == total_tokens
    assert sum(s.num_prompt_tokens for s in steps) == sum(len(r.prompt_token_ids) for r in requests)
    computed = sum(len(seq.token_ids) for call in runner.calls for seq in call)
    assert sum(s.num_prefill_tokens + s.num_decode_tokens for s in steps) == computed
    assert sum(s.num_preempted for s in steps) == engine.stats().num_preemptions
    # the prompts share their first tokens: the steps' prefix-cache counts add up to the totals
    assert sum(s.num_prefix_cache_hits for s in steps) == engine.stats().num_prefix_cache_hits > 0
    assert sum(s.num_prefix_cache_queries for s in steps) == engine.stats().num_prefix_cache_queries
    assert (engine.stats().num_preemptions > 0) == (num_blocks == 14)
    times = [
        t for s in steps for t in (*s.ttfts_s, *s.queue_times_s, *s.inter_token_s, *s.e2e_s, s.duration_s)
    ]
    assert min(times) >= 0
    assert steps[-1].engine == engine.stats()


def test_a_request_aborted_before_its_first_step_only_ends() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=100), CONFIG)
    engine.add_request(request("gone", 5, 4))
    engine.abort_request("gone", FinishReason.INTERRUPTED)
    engine.step()
    step = engine.last_step
    assert step is not None
    assert (len(step.e2e_s), step.queue_times_s, step.ttfts_s) == (1, (), ())
    assert step.num_prefill_tokens == step.num_decode_tokens == 0
