"""A step's time budget: the step-time model's coefficients and what they allow.

A step's wall time is modelled as linear in what it computes::

    t ≈ base + per_decode · decode_seqs + per_prefill · prefill_tokens
             + per_context · context_tokens

``decode_seqs`` are the one-token slices of a step (decodes),
``prefill_tokens`` every other token it computes (prompt chunks,
recomputation after a preemption; their attention included),
``context_tokens`` the KV tokens the decodes attend to (each decode's
``start_pos + 1``). The form is the usual reading of a transformer step: a
fixed cost (weights read once, launches, Python), a cost per row of the
GEMMs, and attention's reads of the KV cache (the cost models of
Sarathi-Serve, Agrawal et al. 2024, and DistServe, Zhong et al. 2024, have
the same terms).

:class:`StepCostCoefficients` holds the coefficients (fitted online by
:class:`bargein.engine.step_cost_fit.StepCostFit`); :class:`StepBudget`
answers the scheduler's and admission's questions with them: how many
prefill tokens fit a step after its decodes, whether one more decoding
sequence still fits the inter-token latency target. Pure Python (the
scheduler imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TERMS = ("base", "per_decode_seq", "per_prefill_token", "per_context_token")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCostCoefficients:
    """Coefficients of the step-time model, seconds (all >= 0).

    Attributes:
        base_s: a step's fixed cost.
        per_decode_s: per one-token decode.
        per_prefill_token_s: per other token computed (a prompt chunk's).
        per_context_token_s: per KV token a decode attends to.
    """

    base_s: float
    per_decode_s: float
    per_prefill_token_s: float
    per_context_token_s: float

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}={value} must be finite and >= 0")

    def predict(self, decode_seqs: int, prefill_tokens: int, context_tokens: int) -> float:
        """Predicted wall time of a step, seconds."""
        return (
            self.base_s
            + self.per_decode_s * decode_seqs
            + self.per_prefill_token_s * prefill_tokens
            + self.per_context_token_s * context_tokens
        )

    def as_tuple(self) -> tuple[float, float, float, float]:
        """The coefficients in :data:`TERMS` order."""
        return (self.base_s, self.per_decode_s, self.per_prefill_token_s, self.per_context_token_s)


# The bundled model in its default format (int4, the block kernels) on the
# 2-core AVX2 CPU box (docs/perf/step-profile-avx2.md: 8.9 ms at one decode,
# 117 ms at 64 over 128 tokens of context, so about 1.7 ms a decode row; a
# prefill token is a GEMM row without the head, about 1.2 ms). It was the
# fp32 step before (60 ms + 5 ms a row + 4 ms a prompt token): three times
# the default's, so admission predicted a burst's prefill 1.5-2.5x too slow
# and refused what it could serve (docs/perf/bursts.md). A slower machine is
# followed by the fit within tens of steps; pessimistic for a GPU.
CPU_PRIOR = StepCostCoefficients(
    base_s=0.008, per_decode_s=0.0017, per_prefill_token_s=0.0012, per_context_token_s=1e-6
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBudget:
    """One step's time budget against a :class:`StepCostCoefficients`.

    Attributes:
        target_s: the inter-token latency target: what a step may take, seconds.
        cost: the step-time model.
        max_tokens: tokens one step may compute anyway (``max_num_batched_tokens``).
        min_prefill_tokens: prefill tokens a step may always take, whatever
            the model says (prompts must progress even when the decodes alone
            fill the budget; then the step overruns by at most their cost).
        slow_headroom: where one stream's step alone is already past the
            target (a slow or loaded machine: every step slowed, which no
            robust fit can tell from the engine's own cost), the batch is
            bounded by this many times that step instead: a second stream
            barely slows the first (the fixed cost dominates), so refusing
            it would not bring the first back under the target, only leave
            the second user with nothing.
    """

    target_s: float
    cost: StepCostCoefficients
    max_tokens: int
    min_prefill_tokens: int = 16
    slow_headroom: float = 1.5

    def prefill_tokens(self, decode_seqs: int, context_tokens: int) -> int:
        """Prefill tokens a step with these decodes may compute: what the
        model says fits the target after the decodes, at least
        ``min_prefill_tokens``, within ``max_tokens``; all of ``max_tokens``
        when nothing decodes (no stream waits on the step: a prompt alone
        goes in at full speed)."""
        if decode_seqs == 0:
            return self.max_tokens
        room = self.max_tokens - decode_seqs
        left = self.target_s - self.cost.predict(decode_seqs, 0, context_tokens)
        per_token = self.cost.per_prefill_token_s
        fit = room if per_token <= 0 else math.floor(max(0.0, left) / per_token)
        return max(0, min(room, max(self.min_prefill_tokens, fit)))

    def limit_s(self, context_per_seq: float, share: float = 1.0) -> float:
        """The longest step a batch may take, seconds: ``share`` of the
        target, or ``slow_headroom`` times one stream's step (over
        ``context_per_seq`` KV tokens, with ``min_prefill_tokens``) where
        that alone is past it."""
        alone = self.cost.predict(1, self.min_prefill_tokens, math.ceil(context_per_seq))
        return max(share * self.target_s, self.slow_headroom * alone)

    def fits(self, decode_seqs: int, context_tokens: int, share: float = 1.0) -> bool:
        """Whether a step of ``decode_seqs`` decodes over ``context_tokens``
        plus ``min_prefill_tokens`` of prefill is within :meth:`limit_s`."""
        step = self.cost.predict(decode_seqs, self.min_prefill_tokens, context_tokens)
        return step <= self.limit_s(context_tokens / max(1, decode_seqs), share)

    def max_decode_seqs(self, context_per_seq: float, share: float = 1.0) -> int:
        """The most decoding sequences (each over ``context_per_seq`` KV
        tokens) whose step, with ``min_prefill_tokens``, is within :meth:`limit_s`."""
        c = self.cost
        left = (
            self.limit_s(context_per_seq, share) - c.base_s - c.per_prefill_token_s * self.min_prefill_tokens
        )
        per_seq = c.per_decode_s + c.per_context_token_s * context_per_seq
        if left < 0:
            return 0
        return self.max_tokens if per_seq <= 0 else min(self.max_tokens, math.floor(left / per_seq))
