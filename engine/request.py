"""What goes into the engine and what comes out of it, one step at a time.

These types are the seam between the engine and everything above it: the
session layer builds an :class:`EngineRequest`, the runner hands back a list
of :class:`RequestOutput` per engine step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bargein.engine.grammar_spec import GrammarSpec


class FinishReason(str, enum.Enum):
    """Why a sequence stopped generating (names as in docs/protocol.md)."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    INTERRUPTED = "interrupted"  # aborted by the client (barge-in)
    CANCELLED = "cancelled"  # aborted by disconnect policy or the server
    ERROR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """Per-request sampling, validated on construction.

    Attributes:
        max_tokens: most new tokens (>= 1).
        temperature: 0 means greedy (argmax); > 0 scales logits.
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; 0 disables.
        seed: keys the request's sampling noise with the position of each
            token sampled (``sampler.noise_seed``): the same seed gives the
            same tokens whatever else shares the batch, after a preemption
            or on another node. ``None``: nondeterministic.
        stop: stop strings, matched on text across token boundaries; the
            output text never contains them.
        stop_token_ids: token ids that end the sequence (besides EOS).
        ignore_eos: keep generating past EOS (benchmarks).
        min_tokens: fewest new tokens, in [0, max_tokens] (vLLM's
            ``min_tokens``): while fewer were generated, EOS and the stop
            token ids cannot be sampled (their logits are masked) and no stop
            string can end in the text of those first tokens.
        grammar: what the output must match (engine/grammar.py): each
            sampled token is drawn from the tokens the grammar allows next,
            greedy or not, and the request ends (``stop``) when the grammar
            is complete and allows nothing but EOS. ``None``: unconstrained.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"{self.max_tokens=} must be >= 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"{self.min_tokens=} must be in [0, max_tokens={self.max_tokens}]")
        if self.temperature < 0:
            raise ValueError(f"{self.temperature=} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"{self.top_p=} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"{self.top_k=} must be >= 0")

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature == 0 or self.top_k == 1


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRequest:
    """One generation request.

    Attributes:
        request_id: unique among live requests of this engine.
        prompt_token_ids: the full prompt (chat template already applied).
        params: sampling parameters.
        arrival_time: ``time.monotonic()`` seconds when it was received, for
            queue-time and TTFT accounting.
        num_replayed_tokens: the last this many prompt tokens are output a
            previous run generated (a takeover continues a stream with its
            logged tokens in the prompt): a grammar consumes them first.
        cache_salt: isolates this request's prefix cache: only requests with
            the same salt share KV blocks (e.g. one salt per tenant, so no
            tenant can probe another's prompts through time to first token).
            ``None``: shared with every other unsalted request.
        prefill_only: only compute the K/V of the prompt's full blocks into
            the prefix cache, at the lowest priority (dropped by any real
            work that needs its budget, slot or blocks), and sample nothing;
            it ends with one finished output without tokens (``stop`` once
            done, ``cancelled`` when dropped). ``params`` are ignored. A
            later request whose prompt starts with the same tokens (and
            salt) hits those blocks (engine/speculative_prefill.py).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    cache_salt: str | None = None
    num_replayed_tokens: int = 0
    prefill_only: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestOutput:
    """What one engine step produced for one request.

    ``new_token_ids`` are the tokens sampled this step (usually one);
    ``text`` is the text they complete, UTF-8 safe and with any text that
    could still be a stop string held back. When ``finished`` is true this is
    the request's last output: ``finish_reason`` says why, and ``text`` holds
    whatever was held back and turned out not to be a stop string.

    Attributes:
        request_id: the request.
        new_token_ids: tokens sampled this step, in order.
        text: text delta these tokens complete (may be empty).
        num_prompt_tokens: prompt length.
        num_output_tokens: output tokens so far, these included (offset of
            the next token in the response stream).
        finished: whether the request ended this step.
        finish_reason: set when ``finished``.
        num_cached_tokens: prompt tokens whose K/V came from the prefix cache
            when the request was first scheduled (a multiple of the block
            size, at most ``num_prompt_tokens - 1``); 0 without a hit.
        prefill_only: the output of a prefill-only request (no response:
            never tokens, and not counted as a finished request).
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    prefill_only: bool = False
