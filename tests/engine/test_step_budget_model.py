"""A burst of long prompts does not stretch a running stream (real engine, bundled model).

The engine first measures this machine (a calibration engine's step-time
fit); the engine under test starts from that fit and gets a target that
leaves room for about 48 prefill tokens after one decode. Then one stream
decodes while three long prompts arrive at once. Asserted is the mechanism,
not wall-clock bounds (they flake on a loaded 2-core box): the stream gets
its next token in every step (its gap is one step), each step's prefill is
within what the model said fits the target after the step's decodes, and a
step is predicted over the target only by the minimum prefill a prompt
always gets. Without a target the same burst takes whole chunks.
"""

from __future__ import annotations

import pytest

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine, StepStats
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams
from bargein.engine.step_cost_fit import StepCostFitConfig
from tests.engine.conftest import RunnerFactory

pytestmark = pytest.mark.slow

LIMITS = {"max_num_seqs": 16, "max_num_batched_tokens": 512, "prefill_chunk_size": 256, "max_model_len": 1024}
PROMPT_LEN = 100
NUM_BURST = 3


def request(request_id: str, num_prompt: int, max_tokens: int, offset: int = 0) -> EngineRequest:
    prompt = tuple(1000 + offset + (i * 7) % 3000 for i in range(num_prompt))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(request_id=request_id, prompt_token_ids=prompt, params=params)


@pytest.fixture(scope="module")
def runner(default_runner_factory: RunnerFactory) -> ModelRunner:
    """One model for the module's engines (each has its own block pool; a
    block's K/V is written before it is read, so what an earlier engine left
    in the tensors is never seen)."""
    return default_runner_factory()


def run_burst(engine: LLMEngine, decodes_first: int = 1) -> list[StepStats]:
    """One stream decoding (alone for ``decodes_first`` steps), then three long
    prompts at once; the steps until they are in."""
    engine.add_request(request("stream", 20, max_tokens=400))
    for _ in range(decodes_first):
        engine.step()  # its prompt and first token, then decodes alone
    for i in range(NUM_BURST):
        engine.add_request(request(f"burst{i}", PROMPT_LEN, max_tokens=2, offset=100 * (i + 1)))
    steps = []
    while any(engine.scheduler.get(f"burst{i}") is not None for i in range(NUM_BURST)):
        engine.step()
        assert engine.last_step is not None
        steps.append(engine.last_step)
    return steps


def test_a_burst_of_long_prompts_keeps_the_running_stream_within_the_target(runner: ModelRunner) -> None:
    calibration = LLMEngine(
        runner,
        SchedulerConfig(**LIMITS),  # type: ignore[arg-type]
        StepCostFitConfig(warmup_steps=1, refit_every=1),
    )
    run_burst(calibration, decodes_first=12)  # decodes alone, then with chunks: the fit sees both
    measured = calibration.step_cost.refit()
    assert measured.per_prefill_token_s > 0 and measured.predict(1, 0, 32) > 0
    target_s = measured.predict(1, 48, 32)
    config = SchedulerConfig(**LIMITS, target_itl_s=target_s, min_prefill_tokens=16)  # type: ignore[arg-type]
    engine = LLMEngine(runner, config, StepCostFitConfig(prior=measured))

    steps = run_burst(engine)

    assert len(steps) >= NUM_BURST * PROMPT_LEN // 64  # the burst took several steps
    for step in steps:
        assert step.num_decode_seqs >= 1  # the stream's token, every step
        assert step.prefill_budget is not None and step.predicted_s is not None
        assert step.num_model_prefill_tokens <= step.prefill_budget
        budget = step.engine.step_budget
        assert budget is not None and budget.target_s == target_s
        if step.num_model_prefill_tokens > config.min_prefill_tokens:
            assert step.predicted_s <= target_s * (1 + 1e-9)
    # the budget bound the burst: no step took a whole chunk
    assert max(s.num_model_prefill_tokens for s in steps) < LIMITS["prefill_chunk_size"]
    assert sum(s.num_model_prefill_tokens for s in steps) >= NUM_BURST * (
        PROMPT_LEN - 16
    )  # prefix hits at most


def test_without_a_target_the_same_burst_takes_whole_chunks(runner: ModelRunner) -> None:
    """The old policy, for comparison (and so the test above can fail)."""
    engine = LLMEngine(runner, SchedulerConfig(**LIMITS))  # type: ignore[arg-type]
    steps = run_burst(engine)
    assert all(s.prefill_budget is None for s in steps)
    assert max(s.num_model_prefill_tokens for s in steps) >= LIMITS["prefill_chunk_size"]
