"""The step-time model of an engine, learned online from its measured steps.

:class:`StepCostFit` fits the four coefficients of
:class:`bargein.engine.step_budget.StepCostCoefficients` (the model's terms are
described there) to each step's measured wall time by exponentially
forgotten least squares: a sample's weight halves every ``half_life_steps``
steps, so the fit follows the machine as its load changes. Coefficients are
non-negative, and a ridge pull towards a prior (:data:`CPU_PRIOR`, this
project's 2-core CPU box, docs/perf/engine-step.md) dominates until there
are samples and keeps a coefficient the data cannot see (no prefill yet) at
a sane value.

Pure: no torch, no clock (durations are arguments); numpy for the fit.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from bargein.engine.step_budget import CPU_PRIOR, StepCostCoefficients

NUM_TERMS = 4
# Feature scales (one step's typical decodes, prefill tokens, context
# tokens): the fit runs on features divided by these, so its normal
# equations are well conditioned and the prior's weight means the same for
# every coefficient.
_SCALES = np.array([1.0, 16.0, 256.0, 16384.0])


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCostFitConfig:
    """How :class:`StepCostFit` learns.

    Attributes:
        prior: the coefficients before any sample.
        prior_weight: how many samples the prior counts as, on each
            coefficient (at its feature's typical scale), before the first
            sample; after ``n`` samples it counts ``prior_weight / (1 + n)``
            (a prior 10 times off, as the CPU one on a GPU, would otherwise
            bias the fit for long: its pseudo-samples have large residuals),
            plus ``prior_floor``, which pins a coefficient the data never
            see (no prefill yet) to the prior.
        prior_floor: the prior's weight that is never forgotten.
        half_life_steps: a sample's weight halves after this many later ones.
        warmup_steps: first steps not learned from (compilation, caches).
        refit_every: observations between two refits.
        max_outlier_ratio: a duration over this many times the prediction
            (plus 10 ms) is clipped to it: a GC pause or a burst of another
            process's work must not move the fit much.
        robust_window: the last steps among which those of one shape
            (decodes, prefill and context tokens, each within a factor of 2)
            bound the next sample of that shape (see ``robust_quantile``).
        robust_quantile: a duration is learned as at most this quantile of
            its shape's recent measured-over-predicted ratios times its
            prediction (a low one: 0.25). A noisy neighbour slows some steps,
            not the engine's own work: the steps it inflates (up to three in
            four) are learned at the ratio of the unslowed ones, so they move
            the fit little, while a machine that really slowed down raises
            every ratio and is followed within ``robust_window`` steps. Per
            shape: where the fit is still off for a shape, its steps agree on
            it and are not clipped. 1: off (the maximum).
    """

    prior: StepCostCoefficients = CPU_PRIOR
    prior_weight: float = 2.0
    prior_floor: float = 1e-3
    half_life_steps: float = 200.0
    warmup_steps: int = 2
    refit_every: int = 8
    max_outlier_ratio: float = 4.0
    robust_window: int = 64
    robust_quantile: float = 0.25

    def __post_init__(self) -> None:
        if self.robust_window < 1 or not 0 < self.robust_quantile <= 1:
            raise ValueError(
                f"robust_window={self.robust_window} must be >= 1, "
                f"robust_quantile={self.robust_quantile} in (0, 1]"
            )
        if (
            self.prior_floor <= 0
            or self.prior_weight <= 0
            or self.half_life_steps <= 0
            or self.max_outlier_ratio <= 1
        ):
            raise ValueError(
                f"prior_floor={self.prior_floor}, prior_weight={self.prior_weight} and half_life_steps={self.half_life_steps} "
                f"must be > 0, max_outlier_ratio={self.max_outlier_ratio} > 1"
            )
        if self.warmup_steps < 0 or self.refit_every < 1:
            raise ValueError(f"warmup_steps={self.warmup_steps} >= 0, refit_every={self.refit_every} >= 1")


class StepCostFit:
    """The step-time model of one engine, fitted online.

    Call :meth:`observe` after every step that ran the model; read
    :attr:`current` (a frozen :class:`StepCostCoefficients`, replaced whole on refit, so
    another thread may read it without a lock).

    Attributes:
        current: the latest fit.
        num_samples: samples learned from since start.
        effective_samples: their forgotten weight (at most about
            ``1.44 * half_life_steps``).
    """

    def __init__(self, config: StepCostFitConfig | None = None) -> None:
        self.config = config or StepCostFitConfig()
        self.current = self.config.prior
        self.num_samples = 0
        self.effective_samples = 0.0
        self._decay = 0.5 ** (1.0 / self.config.half_life_steps)
        self._prior_scaled = np.array(self.config.prior.as_tuple()) * _SCALES
        self._xtx = np.zeros((NUM_TERMS, NUM_TERMS))  # forgotten normal equations
        self._xty = np.zeros(NUM_TERMS)
        self._seen = 0
        # per shape, its steps of the last robust_window (see _typical):
        # (step number, seconds, decodes, prefill tokens, context tokens)
        self._recent: dict[tuple[int, int, int], deque[tuple[int, float, int, int, int]]] = {}

    def observe(self, decode_seqs: int, prefill_tokens: int, context_tokens: int, duration_s: float) -> None:
        """Learn from one step: what it computed and how long it took (seconds)."""
        self._seen += 1
        if self._seen <= self.config.warmup_steps or not math.isfinite(duration_s) or duration_s < 0:
            return
        predicted = self.current.predict(decode_seqs, prefill_tokens, context_tokens)
        typical = self._typical((decode_seqs, prefill_tokens, context_tokens), duration_s, predicted)
        duration_s = min(duration_s, typical, self.config.max_outlier_ratio * predicted + 0.01)
        x = np.array([1.0, decode_seqs, prefill_tokens, context_tokens]) / _SCALES
        self._xtx *= self._decay
        self._xty *= self._decay
        self._xtx += np.outer(x, x)
        self._xty += x * duration_s
        self.effective_samples = self._decay * self.effective_samples + 1.0
        self.num_samples += 1
        if self.num_samples % self.config.refit_every == 0:
            self.refit()

    def _typical(self, shape: tuple[int, int, int], duration_s: float, predicted_s: float) -> float:
        """The most a step of ``shape`` (decodes, prefill tokens, context
        tokens) predicted at ``predicted_s`` is learned as, seconds: the
        ``robust_quantile`` of its shape's recent steps' measured-over-predicted
        ratios (this one's included; all predicted by the current fit, so a
        refit never makes old ratios stale) times its prediction."""
        if predicted_s <= 0:
            return duration_s
        key = (shape[0].bit_length(), shape[1].bit_length(), shape[2].bit_length())  # within 2x
        recent = self._recent.get(key)
        if recent is None:  # at most 9 x 14 x 25 shapes (int32 counts): bounded
            recent = self._recent[key] = deque()
        while recent and recent[0][0] <= self._seen - self.config.robust_window:
            recent.popleft()  # older than the window: the machine may have changed since
        recent.append((self._seen, duration_s, *shape))
        predict = self.current.predict
        ratios = sorted(t / max(predict(d, p, c), 1e-9) for _, t, d, p, c in recent)
        return ratios[math.ceil(self.config.robust_quantile * len(ratios)) - 1] * predicted_s

    def refit(self) -> StepCostCoefficients:
        """Solve for the coefficients now (``observe`` does every ``refit_every``)."""
        cfg = self.config
        w = cfg.prior_weight / (1 + self.num_samples) + cfg.prior_floor
        a = self._xtx + w * np.eye(NUM_TERMS)
        b = self._xty + w * self._prior_scaled
        theta = _nonnegative_quadratic_min(a, b) / _SCALES
        self.current = StepCostCoefficients(
            base_s=float(theta[0]),
            per_decode_s=float(theta[1]),
            per_prefill_token_s=float(theta[2]),
            per_context_token_s=float(theta[3]),
        )
        return self.current


def _nonnegative_quadratic_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin over θ >= 0 of ``θᵀaθ - 2bᵀθ`` for a positive definite ``a`` [n, n].

    Non-negative least squares in its normal-equations form. With n = 4 every
    active set is tried (16 solves of at most 4x4): the constrained optimum is
    the unconstrained optimum on its free set, so the best feasible candidate
    is it (exact, where Lawson-Hanson's iteration would be the general tool).
    """
    n = len(b)
    best, best_value = np.zeros(n), 0.0
    for size in range(1, n + 1):
        for free in itertools.combinations(range(n), size):
            idx = list(free)
            theta_free = np.linalg.solve(a[np.ix_(idx, idx)], b[idx])
            if np.any(theta_free < 0):
                continue
            theta = np.zeros(n)
            theta[idx] = theta_free
            value = float(theta @ a @ theta - 2 * b @ theta)
            if value < best_value:
                best, best_value = theta, value
    return best
