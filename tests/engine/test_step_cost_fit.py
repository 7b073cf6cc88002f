"""The step-time model on synthetic steps: the fit, its prior, forgetting, the budget's answers."""

from __future__ import annotations

import random

import pytest

from bargein.engine.step_budget import CPU_PRIOR, StepBudget, StepCostCoefficients
from bargein.engine.step_cost_fit import StepCostFit, StepCostFitConfig

TRUE = StepCostCoefficients(
    base_s=0.02, per_decode_s=0.001, per_prefill_token_s=0.0005, per_context_token_s=2e-7
)


def feed(
    model: StepCostFit, truth: StepCostCoefficients, num_steps: int, *, seed: int = 0, noise: float = 0.02
) -> None:
    """Steps of a mixed load (decodes, some prefill, growing contexts), each
    timed by ``truth`` with ``noise`` relative jitter."""
    rng = random.Random(seed)
    for _ in range(num_steps):
        decodes = rng.randint(0, 48)
        prefill = rng.choice((0, 0, rng.randint(1, 256)))
        context = decodes * rng.randint(16, 1024)
        t = truth.predict(decodes, prefill, context) * (1 + rng.uniform(-noise, noise))
        model.observe(decodes, prefill, context, t)


def test_fit_recovers_the_coefficients_of_synthetic_steps() -> None:
    model = StepCostFit()
    feed(model, TRUE, 600)
    fit = model.refit()
    for got, want in zip(fit.as_tuple(), TRUE.as_tuple(), strict=True):
        assert got == pytest.approx(want, rel=0.1)
    assert fit.predict(32, 64, 16_000) == pytest.approx(TRUE.predict(32, 64, 16_000), rel=0.02)


def test_before_samples_the_prior_answers() -> None:
    model = StepCostFit()
    assert model.current == CPU_PRIOR
    model.observe(1, 0, 10, 5.0)  # warm-up steps (compilation) are not learned from
    model.observe(1, 0, 10, 5.0)
    assert model.num_samples == 0 and model.refit() == CPU_PRIOR


def test_a_term_the_data_never_saw_keeps_its_prior() -> None:
    """Decode-only steps say nothing of prefill: its coefficient stays the prior's."""
    model = StepCostFit()
    rng = random.Random(1)
    for _ in range(400):
        decodes = rng.randint(1, 32)
        model.observe(decodes, 0, decodes * 100, TRUE.predict(decodes, 0, decodes * 100))
    fit = model.refit()
    assert fit.per_prefill_token_s == pytest.approx(CPU_PRIOR.per_prefill_token_s, rel=0.05)
    assert fit.per_decode_s == pytest.approx(TRUE.per_decode_s, rel=0.2)


def test_coefficients_are_never_negative() -> None:
    """Steps that get faster with more decodes (noise, another process
    leaving) would give a negative slope to plain least squares."""
    model = StepCostFit(StepCostFitConfig(prior_weight=0.01))
    for i in range(300):
        decodes = i % 40
        model.observe(decodes, 0, 0, 0.1 - 0.002 * decodes)
    fit = model.refit()
    assert min(fit.as_tuple()) >= 0.0
    assert fit.per_decode_s == 0.0
    assert fit.base_s == pytest.approx(0.06, rel=0.2)  # the mean, with no slope


def test_forgetting_follows_a_machine_that_slowed_down() -> None:
    model = StepCostFit(StepCostFitConfig(half_life_steps=50))
    feed(model, TRUE, 400)
    slower = StepCostCoefficients(**{name: 3 * getattr(TRUE, name) for name in TRUE.__slots__})
    feed(model, slower, 400, seed=2)
    fit = model.refit()
    assert fit.predict(16, 0, 4000) == pytest.approx(slower.predict(16, 0, 4000), rel=0.05)
    assert model.effective_samples == pytest.approx(50 / 0.693, rel=0.05)


def test_one_outlier_moves_the_fit_little() -> None:
    model = StepCostFit()
    feed(model, TRUE, 400)
    before = model.refit().predict(8, 0, 800)
    model.observe(8, 0, 800, 30.0)  # a 30 s stall (swap, a debugger)
    after = model.refit().predict(8, 0, 800)
    assert after < 1.5 * before


def test_budget_sizes_prefill_to_what_is_left_after_the_decodes() -> None:
    budget = StepBudget(target_s=0.1, cost=TRUE, max_tokens=512, min_prefill_tokens=16)
    # 0.1 - (0.02 + 20 * 0.001 + 4000 * 2e-7) = 0.0592 s left: 118 tokens at 0.5 ms
    assert budget.prefill_tokens(20, 4000) == 118
    assert TRUE.predict(20, 118, 4000) <= 0.1 < TRUE.predict(20, 119, 4000)
    # decodes over the budget: prompts still progress by the minimum
    assert budget.prefill_tokens(200, 0) == 16
    # a fast model: the token limit binds
    assert budget.prefill_tokens(2, 0) < 512 - 2 or TRUE.predict(2, 510, 0) <= 0.1
    fast = StepBudget(target_s=10.0, cost=TRUE, max_tokens=512)
    assert fast.prefill_tokens(12, 0) == 500


def test_budget_bounds_the_decoding_batch() -> None:
    budget = StepBudget(target_s=0.1, cost=TRUE, max_tokens=512, min_prefill_tokens=16)
    n = budget.max_decode_seqs(context_per_seq=500)
    assert budget.fits(n, n * 500) and not budget.fits(n + 1, (n + 1) * 500)
    assert budget.max_decode_seqs(500, share=0.5) < n
    strict = StepBudget(target_s=0.01, cost=TRUE, max_tokens=512, slow_headroom=1.0)
    assert strict.max_decode_seqs(0) == 1  # past the target alone: one stream, no more


def test_a_machine_too_slow_for_the_target_batches_within_the_headroom_of_one_stream() -> None:
    """One stream's step (29 ms) is past the 10 ms target: streams still join
    while the step stays within 1.5x of that one's (43.5 ms), not refused."""
    budget = StepBudget(target_s=0.01, cost=TRUE, max_tokens=512)
    alone = TRUE.predict(1, 16, 0)
    n = budget.max_decode_seqs(0)
    assert n == 15  # (1.5 * 29 ms - 20 ms - 8 ms) / 1 ms
    assert budget.fits(n, 0) and not budget.fits(n + 1, 0)
    assert TRUE.predict(n, 16, 0) <= 1.5 * alone < TRUE.predict(n + 1, 16, 0)


def test_invalid_coefficients_and_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="per_decode_s"):
        StepCostCoefficients(base_s=0.0, per_decode_s=-1.0, per_prefill_token_s=0.0, per_context_token_s=0.0)
    with pytest.raises(ValueError, match="half_life_steps"):
        StepCostFitConfig(half_life_steps=0)


def neighboured(model: StepCostFit, num_steps: int, *, share: float, factor: float, seed: int = 3) -> None:
    """Steps of a steady batch (8 to 11 decodes, a 64-token prefill every tenth
    step, the context growing) timed by ``TRUE``, ``share`` of them slowed
    ``factor`` times by another process on the machine (a noisy neighbour)."""
    rng = random.Random(seed)
    context = 0
    for i in range(num_steps):
        decodes = 8 + (i // 100) % 4
        context = (context + decodes) % 20_000
        prefill = 0 if i % 10 else 64
        slowed = factor if rng.random() < share else 1.0
        model.observe(decodes, prefill, context, TRUE.predict(decodes, prefill, context) * slowed)


def test_a_noisy_neighbour_slowing_most_steps_moves_the_fit_little() -> None:
    """60% of steps 3x slower: a mean would predict 2.2x; the low quantile of
    each shape's recent ratios keeps the engine's own cost."""
    robust, mean = StepCostFit(), StepCostFit(StepCostFitConfig(robust_quantile=1.0))
    for model in (robust, mean):
        neighboured(model, 600, share=0.6, factor=3.0)
    want = TRUE.predict(8, 0, 2000)
    assert robust.refit().predict(8, 0, 2000) == pytest.approx(want, rel=0.1)
    assert mean.refit().predict(8, 0, 2000) > 1.8 * want


def test_a_neighbour_on_every_step_is_followed() -> None:
    """When every step is slower the machine is slower: the fit follows."""
    model = StepCostFit(StepCostFitConfig(half_life_steps=50))
    neighboured(model, 600, share=1.0, factor=3.0)
    assert model.refit().predict(8, 0, 2000) == pytest.approx(3 * TRUE.predict(8, 0, 2000), rel=0.1)
