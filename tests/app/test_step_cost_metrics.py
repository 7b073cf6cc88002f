"""The step-time model's metrics, fed from engine steps (no server)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from bargein.app.metrics import Metrics
from bargein.engine.engine import EngineStats, StepStats
from bargein.engine.step_budget import StepBudget, StepCostCoefficients
from tests.app.test_metrics import Samples

COST = StepCostCoefficients(
    base_s=0.05, per_decode_s=0.004, per_prefill_token_s=0.003, per_context_token_s=1e-6
)


def engine_stats(budget: StepBudget | None) -> EngineStats:
    return EngineStats(
        num_free_blocks=10,
        num_total_blocks=10,
        num_running=1,
        num_waiting=0,
        num_generated_tokens=0,
        num_prompt_tokens=0,
        num_preemptions=0,
        num_steps=1,
        last_step_s=0.1,
        num_finished_by_reason={},
        step_cost=COST,
        step_cost_samples=12.5,
        step_budget=budget,
    )


def step(predicted_s: float | None, budget: StepBudget | None) -> StepStats:
    return StepStats(
        duration_s=0.12,
        num_prefill_tokens=10,
        num_decode_tokens=1,
        num_preempted=0,
        num_prompt_tokens=0,
        num_generated_tokens=1,
        queue_times_s=(),
        ttfts_s=(),
        inter_token_s=(),
        e2e_s=(),
        engine=engine_stats(budget),
        predicted_s=predicted_s,
    )


def test_coefficients_target_and_prediction_error_are_exported() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.on_step(step(0.1, StepBudget(target_s=0.2, cost=COST, max_tokens=512)))
    samples = Samples(metrics.render()[0].decode())
    assert samples.get("bargein_step_cost_seconds", term="base") == 0.05
    assert samples.get("bargein_step_cost_seconds", term="per_prefill_token") == 0.003
    assert samples.get("bargein_step_cost_samples") == 12.5
    assert samples.get("bargein_step_target_seconds") == 0.2
    assert samples.get("bargein_step_cost_error_ratio_count") == 1
    assert samples.get("bargein_step_cost_error_ratio_bucket", le="1.25") == 1  # 0.12 / 0.1
    assert samples.get("bargein_step_cost_error_ratio_bucket", le="1.1") == 0


def test_without_a_target_no_prediction_is_judged() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.on_step(step(None, None))
    samples = Samples(metrics.render()[0].decode())
    assert samples.get("bargein_step_target_seconds") == 0.0
    assert samples.get("bargein_step_cost_error_ratio_count") == 0
    assert samples.get("bargein_step_cost_seconds", term="per_decode_seq") == 0.004
