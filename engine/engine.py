"""One engine step: drain aborts -> schedule -> forward -> sample -> outputs.

``LLMEngine`` is synchronous and single-threaded (the runner's thread drives
it). It owns the scheduler and block pool, the sampler (a seeded request's
noise keyed by its seed and the token's position), one incremental
detokenizer per live request, and applies the stop rules
that need text (stop strings) after the scheduler applied the token ones
(EOS, stop token ids, ``max_tokens``, ``max_model_len``).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from bargein.engine.config import EngineConfig, SchedulerConfig
from bargein.engine.detokenizer import IncrementalDetokenizer
from bargein.engine.errors import DuplicateRequestError, GrammarError, PromptTooLongError
from bargein.engine.grammar import GrammarCompiler, MaskFiller
from bargein.engine.kv_cache import BlockPool
from bargein.engine.model_runner import ModelRunner, SeqInput
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput
from bargein.engine.sampler import Sampler
from bargein.engine.scheduler import Scheduler, SchedulerOutput
from bargein.engine.sequence import Sequence
from bargein.engine.step_budget import StepBudget, StepCostCoefficients
from bargein.engine.step_cost_fit import StepCostFit, StepCostFitConfig


class ModelRunnerLike(Protocol):
    """What the engine needs of ``bargein.engine.model_runner.ModelRunner``."""

    num_blocks: int
    block_size: int
    kv_bytes_per_token: int
    eos_token_ids: frozenset[int]
    tokenizer: Any
    device: torch.device

    def execute(self, seqs: list[SeqInput]) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """A snapshot of the engine's counters (monotonic ones since start).

    Attributes:
        num_free_blocks / num_total_blocks: KV block pool occupancy; free
            counts the cached-free blocks too (they are allocatable).
        num_running / num_waiting: scheduler queues.
        num_generated_tokens: sampled tokens.
        num_prompt_tokens: prompt tokens of requests whose prefill finished.
        num_preemptions: sequences preempted for blocks.
        num_steps: steps that ran the model.
        last_step_s: wall time of the last step, seconds.
        num_finished_by_reason: finished requests per ``FinishReason`` value.
        num_prefix_cache_queries: counter, tokens looked up in the prefix
            cache at admission (vLLM's ``prefix_cache_queries``: a prompt, or
            prompt plus output when a preempted sequence is readmitted).
        num_prefix_cache_hits: counter, of those the tokens whose K/V were
            reused (vLLM's ``prefix_cache_hits``); hits / queries is the hit rate.
        num_cached_free_blocks: gauge, blocks no sequence holds that are
            still registered for reuse (included in ``num_free_blocks``).
        num_decoding: running sequences whose prompt is in (they decode).
        num_decoding_tokens: prompt plus output tokens of those (the KV
            their decodes attend to).
        running_remaining_tokens: per running sequence, the most tokens it
            may still generate (``max_tokens``, the context), ascending.
        step_cost: the step-time model's fit now (engine/step_cost_fit.py).
        step_cost_samples: the fit's forgotten sample weight (0: the prior).
        step_budget: the next step's time budget; None without
            ``target_itl_s`` (admission then does not use the model).
        num_speculative_prefill_tokens: counter, tokens computed by
            prefill-only requests (engine/speculative_prefill.py).
        num_speculative_prefill_hits: counter, of those the tokens a later
            real request reused from the prefix cache.
        num_speculative_prefills: gauge, prefill-only requests waiting or running
            (not in ``num_running`` / ``num_waiting``).
    """

    num_free_blocks: int
    num_total_blocks: int
    num_running: int
    num_waiting: int
    num_generated_tokens: int
    num_prompt_tokens: int
    num_preemptions: int
    num_steps: int
    last_step_s: float
    num_finished_by_reason: Mapping[str, int]
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    num_cached_free_blocks: int = 0
    num_decoding: int = 0
    num_decoding_tokens: int = 0
    running_remaining_tokens: tuple[int, ...] = ()
    step_cost: StepCostCoefficients | None = None
    step_cost_samples: float = 0.0
    step_budget: StepBudget | None = None
    num_speculative_prefill_tokens: int = 0
    num_speculative_prefill_hits: int = 0
    num_speculative_prefills: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStats:
    """What one step did, for metrics. Latencies are seconds between
    ``time.monotonic()`` readings, from ``EngineRequest.arrival_time`` on.

    Attributes:
        duration_s: wall time of the step (aborts, plan, forward, sample, detokenize).
        num_prefill_tokens: prompt tokens (or tokens recomputed after a
            preemption) computed this step; 0 in a decode-only step.
        num_decode_tokens: one-token decodes computed this step.
        num_preempted: sequences preempted while planning the step.
        num_prompt_tokens: prompt tokens of the requests that got their first token.
        num_generated_tokens: tokens sampled.
        queue_times_s: arrival -> first scheduled, one per request first scheduled.
        ttfts_s: arrival -> first token sampled, one per request that got it.
        inter_token_s: previous token -> this one, one per request that got a later token.
        e2e_s: arrival -> finished, one per request that ended (any reason).
        engine: the counters as of the end of the step.
        num_prefix_cache_queries / num_prefix_cache_hits: tokens looked up
            in the prefix cache by the sequences admitted this step, and of
            those the tokens reused (the step's share of the
            :class:`EngineStats` counters).
        num_decode_seqs / num_context_tokens / num_model_prefill_tokens:
            the step-time model's features of the step (one-token slices,
            the KV they attend to, the other tokens), as it learned them.
        predicted_s: the step's duration as the model predicted it when
            planning (None without a target).
        prefill_budget: prefill tokens the budget allowed after the step's
            decodes (None without a target).
        num_speculative_prefill_tokens / num_speculative_prefill_hits: the
            step's share of the :class:`EngineStats` counters of the same names.
    """

    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_prompt_tokens: int
    num_generated_tokens: int
    queue_times_s: tuple[float, ...]
    ttfts_s: tuple[float, ...]
    inter_token_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    engine: EngineStats
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    num_decode_seqs: int = 0
    num_context_tokens: int = 0
    num_model_prefill_tokens: int = 0
    predicted_s: float | None = None
    prefill_budget: int | None = None
    num_speculative_prefill_tokens: int = 0
    num_speculative_prefill_hits: int = 0


@dataclass(slots=True)
class _StepRecord:
    """Per-request timings collected during one step (becomes a ``StepStats``)."""

    num_prompt_tokens: int = 0
    queue_times_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)


class LLMEngine:
    """Continuous-batching engine over one model runner.

    Args:
        runner: loads the model and owns the KV tensors (``ModelRunner``).
        config: scheduler limits, the prefix-caching switch and the
            inter-token latency target.
        step_cost: how the step-time model learns (its prior above all).

    Attributes:
        step_cost: the step-time model, fitted to every step that ran the
            model (its ``current`` may be read from any thread).

    Raises:
        ValueError: the KV pool cannot hold one sequence of ``max_model_len``
            tokens (preemption could then never make room).
    """

    def __init__(
        self, runner: ModelRunnerLike, config: SchedulerConfig, step_cost: StepCostFitConfig | None = None
    ) -> None:
        capacity = runner.num_blocks * runner.block_size
        if capacity < config.max_model_len:
            raise ValueError(f"KV pool holds {capacity} tokens < {config.max_model_len=}")
        self.runner = runner
        self.config = config
        self.pool = BlockPool(runner.num_blocks, runner.block_size, model_id=_model_identity(runner))
        self.step_cost = StepCostFit(step_cost)
        self.scheduler = Scheduler(
            config, self.pool, runner.eos_token_ids, step_cost=lambda: self.step_cost.current
        )
        self.sampler = Sampler()
        self._grammars: GrammarCompiler | None = None  # built at the first constrained request
        self._mask_filler: MaskFiller | None = None
        self._detoks: dict[str, IncrementalDetokenizer] = {}
        # (request id, reason, only if never scheduled yet, tokens whose blocks stay cached)
        self._pending_aborts: list[tuple[str, FinishReason, bool, int | None]] = []
        self._num_generated_tokens = 0
        self._num_prompt_tokens = 0
        self._num_steps = 0
        self._last_step_s = 0.0
        self._finished: Counter[str] = Counter()
        self.time_by_phase: defaultdict[str, float] = defaultdict(float)  # seconds, for profiling
        self._record = _StepRecord()
        self.last_step: StepStats | None = None  # set by every step()

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """Load the model and build the engine (slow: seconds)."""
        runner = ModelRunner(config.model, config.cache, config.scheduler.max_model_len)
        return cls(runner, config.scheduler)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.runner.tokenizer

    @property
    def grammars(self) -> GrammarCompiler:
        """The grammar compiler and its cache (built at the first use)."""
        if self._grammars is None:
            vocab_size = getattr(self.runner, "vocab_size", None) or len(self.runner.tokenizer)
            self._grammars = GrammarCompiler(self.runner.tokenizer, vocab_size, self.runner.eos_token_ids)
        return self._grammars

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        return self.config.max_model_len

    # ---- requests -----------------------------------------------------------

    def validate(self, request: EngineRequest) -> None:
        """Refuse a request the engine could never run.

        Raises:
            ValueError: empty prompt; a prefill-only request without prefix caching.
            PromptTooLongError: no room for one new token within the context.
        """
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError(f"request {request.request_id!r} has an empty prompt")
        if request.prefill_only and not self.config.enable_prefix_caching:
            raise ValueError("a prefill-only request needs prefix caching (enable_prefix_caching)")
        if num_prompt >= self.config.max_model_len:
            raise PromptTooLongError(num_prompt, self.config.max_model_len)

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request (no block is allocated here).

        Raises:
            ValueError, PromptTooLongError: see :meth:`validate`.
            DuplicateRequestError: the id is live.
        """
        self.validate(request)
        request_id = request.request_id
        if self.scheduler.get(request_id) is not None:
            raise DuplicateRequestError(request_id)
        params = request.params
        if not request.prefill_only:  # it produces no text
            self._detoks[request_id] = IncrementalDetokenizer(
                self.runner.tokenizer, request.prompt_token_ids, params.stop, min_tokens=params.min_tokens
            )
        seq = self.scheduler.add(request)
        if params.grammar is not None:
            self._start_grammar(seq)

    def _start_grammar(self, seq: Sequence) -> None:
        """Give ``seq`` its matcher, with the replayed output tokens consumed;
        a grammar that does not compile or refuses them ends it (``error``)
        at the next step instead of failing the engine thread."""
        request = seq.request
        assert request.params.grammar is not None
        try:
            matcher = self.grammars.matcher(request.params.grammar)
        except GrammarError:
            self.abort_request(request.request_id, FinishReason.ERROR)
            return
        replayed = request.prompt_token_ids[len(request.prompt_token_ids) - request.num_replayed_tokens :]
        if request.num_replayed_tokens and not matcher.consume_tokens(list(replayed)):
            self.abort_request(request.request_id, FinishReason.ERROR)
            return
        seq.grammar = matcher

    def abort_request(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.INTERRUPTED,
        *,
        only_if_waiting: bool = False,
        keep_tokens: int | None = None,
    ) -> None:
        """End a request at the start of the next step (no-op if not live).

        ``only_if_waiting``: only if it has never been scheduled (a queue
        deadline: a request whose prefill has begun holds KV blocks and
        computed work, and goes on).

        ``keep_tokens``: how many of the sequence's tokens (prompt, then
        output) may stay in the prefix cache: the full blocks wholly within
        them stay cached, the later blocks are freed and uncached at once
        (barge-in: the next turn's prompt repeats what the user heard, not
        the rest). ``None`` keeps every full block, as a normal finish does;
        a value past the sequence's length keeps all too. Only whole blocks
        are ever cached, so a cut inside a block keeps the blocks before it.

        Raises:
            ValueError: ``keep_tokens < 0``.
        """
        if keep_tokens is not None and keep_tokens < 0:
            raise ValueError(f"{keep_tokens=} must be >= 0")
        self._pending_aborts.append((request_id, reason, only_if_waiting, keep_tokens))

    def has_unfinished_requests(self) -> bool:
        """Whether a step has work (live sequences or pending aborts)."""
        return self.scheduler.has_unfinished() or bool(self._pending_aborts)

    def finish_all(self, reason: FinishReason) -> list[RequestOutput]:
        """End every live request now (shutdown); returns their final outputs."""
        spec = self.scheduler.speculative
        live = [*self.scheduler.running, *self.scheduler.waiting, *spec.running, *spec.waiting]
        for seq in live:
            self.abort_request(seq.request_id, reason)
        return self._drain_aborts()

    # ---- the step -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step; return one output per request that advanced or ended.

        Aborts queued before the step end first (blocks freed before the
        scheduler plans). A step whose plan is empty runs no model. The
        step's record (:class:`StepStats`) also counts the ends of aborts
        drained by :meth:`drain_aborts` since the last step.
        """
        start = time.perf_counter()
        outputs = self._drain_aborts()
        queries, hits = self.scheduler.num_prefix_cache_queries, self.scheduler.num_prefix_cache_hits
        spec = self.scheduler.speculative
        spec_tokens, spec_hits = spec.num_prefilled_tokens, spec.num_hit_tokens
        plan = self.scheduler.schedule()
        outputs.extend(self._prefill_ended(seq) for seq in spec.take_ended())  # dropped, or all cached
        self._note_first_scheduled(plan)
        t_sched = time.perf_counter()
        if not plan.is_empty:
            sampled = self._execute(plan)
            t_model = time.perf_counter()
            updated = self.scheduler.update(plan, sampled)
            outputs.extend(self._output(seq) for seq in updated)
            outputs.extend(self._prefill_ended(seq) for seq in spec.take_ended())
            self._num_steps += 1
            self.time_by_phase["schedule"] += t_sched - start
            self.time_by_phase["postprocess"] += time.perf_counter() - t_model
        self._last_step_s = time.perf_counter() - start
        if not plan.is_empty:
            self.step_cost.observe(
                plan.num_decode_seqs, plan.num_prefill_tokens, plan.num_context_tokens, self._last_step_s
            )
        self.last_step = self._step_stats(
            plan,
            num_prefix_cache_queries=self.scheduler.num_prefix_cache_queries - queries,
            num_prefix_cache_hits=self.scheduler.num_prefix_cache_hits - hits,
            num_speculative_prefill_tokens=spec.num_prefilled_tokens - spec_tokens,
            num_speculative_prefill_hits=spec.num_hit_tokens - spec_hits,
        )
        self._record = _StepRecord()
        return outputs

    def drain_aborts(self) -> list[RequestOutput]:
        """End the queued aborts now (their blocks are free on return) and
        return their final outputs; ``step`` does it first thing anyway, so a
        caller that wants the ends out before the next forward pass calls this."""
        return self._drain_aborts()

    def _note_first_scheduled(self, plan: SchedulerOutput) -> None:
        """Queue time ends when a request is scheduled for the first time."""
        now = time.monotonic()
        for item in plan.scheduled:
            if item.seq.first_scheduled_time is None and not item.seq.request.prefill_only:
                item.seq.first_scheduled_time = now
                self._record.queue_times_s.append(now - item.seq.request.arrival_time)

    def _note_token(self, seq: Sequence) -> None:
        """TTFT or inter-token latency of the token ``seq`` just got."""
        now = time.monotonic()
        if seq.num_output_tokens == 1:
            self._record.ttfts_s.append(now - seq.request.arrival_time)
            self._record.num_prompt_tokens += seq.num_prompt_tokens
        elif seq.last_token_time is not None:
            self._record.inter_token_s.append(now - seq.last_token_time)
        seq.last_token_time = now

    def _step_stats(
        self,
        plan: SchedulerOutput,
        *,
        num_prefix_cache_queries: int,
        num_prefix_cache_hits: int,
        num_speculative_prefill_tokens: int,
        num_speculative_prefill_hits: int,
    ) -> StepStats:
        """The step's :class:`StepStats` (a decode computes one output token)."""
        record = self._record
        num_decode = sum(
            1
            for item in plan.scheduled
            if len(item.token_ids) == 1 and item.start_pos >= item.seq.num_prompt_tokens
        )
        return StepStats(
            duration_s=self._last_step_s,
            num_prefill_tokens=plan.num_batched_tokens - num_decode,
            num_decode_tokens=num_decode,
            num_preempted=len(plan.preempted_ids),
            num_prompt_tokens=record.num_prompt_tokens,
            num_generated_tokens=len(record.ttfts_s) + len(record.inter_token_s),
            queue_times_s=tuple(record.queue_times_s),
            ttfts_s=tuple(record.ttfts_s),
            inter_token_s=tuple(record.inter_token_s),
            e2e_s=tuple(record.e2e_s),
            engine=self.stats(),
            num_prefix_cache_queries=num_prefix_cache_queries,
            num_prefix_cache_hits=num_prefix_cache_hits,
            num_decode_seqs=plan.num_decode_seqs,
            num_context_tokens=plan.num_context_tokens,
            num_model_prefill_tokens=plan.num_prefill_tokens,
            predicted_s=plan.predicted_s,
            prefill_budget=plan.prefill_budget,
            num_speculative_prefill_tokens=num_speculative_prefill_tokens,
            num_speculative_prefill_hits=num_speculative_prefill_hits,
        )

    def _execute(self, plan: SchedulerOutput) -> list[int]:
        """Forward the plan and sample one token per sampling sequence.

        The constrained rows' bitmasks are filled on the grammar thread while
        the forward pass runs (they depend only on the tokens so far).
        """
        t0 = time.perf_counter()
        inputs = [
            SeqInput(
                token_ids=item.token_ids,
                start_pos=item.start_pos,
                block_table=item.block_table,
                sample=item.sample,
            )
            for item in plan.scheduled
        ]
        seqs = [item.seq for item in plan.scheduled if item.sample]
        constrained = [row for row, seq in enumerate(seqs) if seq.grammar is not None]
        masks = self._start_masks([seqs[row] for row in constrained]) if constrained else None
        logits = self.runner.execute(inputs)  # [num_sample, vocab] float32
        t1 = time.perf_counter()
        assert logits.shape[0] == len(seqs), (logits.shape, len(seqs))
        allowed = None if masks is None else (constrained, masks.result())
        t2 = time.perf_counter()
        if not seqs:
            tokens: list[int] = []
        else:
            params = [seq.params for seq in seqs]
            # the index of each token being sampled: a seeded row's noise is keyed by it
            positions = [seq.num_tokens for seq in seqs]
            banned = [self._banned(seq) for seq in seqs]
            tokens = self.sampler(logits, params, positions, banned if any(banned) else None, allowed)
        self.time_by_phase["model"] += t1 - t0
        self.time_by_phase["mask_wait"] += t2 - t1
        self.time_by_phase["sample"] += time.perf_counter() - t2
        return tokens

    def _start_masks(self, seqs: list[Sequence]) -> Future[torch.Tensor]:
        """Start filling the bitmasks of ``seqs`` (constrained) on the grammar thread."""
        if self._mask_filler is None:
            self._mask_filler = MaskFiller()
        return self._mask_filler.start([seq.grammar for seq in seqs], self.grammars.num_words)

    def _banned(self, seq: Sequence) -> frozenset[int]:
        """Tokens ``seq`` may not sample now: EOS and its stop token ids while
        it has fewer than ``min_tokens`` output tokens (vLLM bans EOS here
        even with ``ignore_eos``, and so does this), else none."""
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            return frozenset()
        return self.scheduler.eos_token_ids.union(params.stop_token_ids)

    def _output(self, seq: Sequence) -> RequestOutput:
        """Detokenize ``seq``'s new token, apply stop strings, build its output."""
        token_id = seq.token_ids[-1]
        self._note_token(seq)
        detok = self._detoks[seq.request_id]
        text = detok.add((token_id,))
        self._num_generated_tokens += 1
        if seq.num_output_tokens == 1:
            self._num_prompt_tokens += seq.num_prompt_tokens
        if seq.grammar is not None and not seq.is_finished:
            reason = _grammar_end(seq.grammar, token_id)
            if reason is not None:
                self.scheduler.finish(seq.request_id, reason)
        if detok.stopped and not seq.is_finished:
            self.scheduler.finish(seq.request_id, FinishReason.STOP)
        elif detok.stopped:
            seq.finish_reason = FinishReason.STOP  # the stop string cut the text
        if seq.is_finished:
            text += self._close(seq)
        return self._make_output(seq, (token_id,), text)

    def _drain_aborts(self) -> list[RequestOutput]:
        """End the aborted requests that are live; ignore the others."""
        outputs: list[RequestOutput] = []
        pending, self._pending_aborts = self._pending_aborts, []
        for request_id, reason, only_if_waiting, keep_tokens in pending:
            if only_if_waiting:
                queued = self.scheduler.get(request_id)
                if queued is None or queued.first_scheduled_time is not None:
                    continue
            seq = self.scheduler.abort(request_id, reason, keep_tokens=keep_tokens)
            if seq is not None:
                outputs.append(self._make_output(seq, (), self._close(seq)))
        return outputs

    def _prefill_ended(self, seq: Sequence) -> RequestOutput:
        """The one finished output of a prefill-only request (no tokens, no text)."""
        return self._make_output(seq, (), self._close(seq))

    def _close(self, seq: Sequence) -> str:
        """Forget a finished sequence's per-request state; return held-back text.

        A prefill-only request has none, and is left out of the finish
        counters (it is no response).
        """
        assert seq.finish_reason is not None
        if seq.request.prefill_only:
            return ""
        self._finished[seq.finish_reason.value] += 1
        self._record.e2e_s.append(time.monotonic() - seq.request.arrival_time)
        return self._detoks.pop(seq.request_id).flush()

    @staticmethod
    def _make_output(seq: Sequence, token_ids: tuple[int, ...], text: str) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=token_ids,
            text=text,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_cached_tokens=seq.num_cached_tokens or 0,
            prefill_only=seq.request.prefill_only,
        )

    def stats(self) -> EngineStats:
        """A snapshot of the counters (call on the engine thread)."""
        running = self.scheduler.running
        decoding = [seq for seq in running if seq.num_tokens - seq.num_computed_tokens == 1]
        max_len = self.config.max_model_len
        remaining = sorted(
            max(0, min(seq.params.max_tokens - seq.num_output_tokens, max_len - seq.num_tokens))
            for seq in running
        )
        return EngineStats(
            num_free_blocks=self.pool.num_free_blocks,
            num_total_blocks=self.pool.num_total_blocks,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_generated_tokens=self._num_generated_tokens,
            num_prompt_tokens=self._num_prompt_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_steps=self._num_steps,
            last_step_s=self._last_step_s,
            num_finished_by_reason=dict(self._finished),
            num_prefix_cache_queries=self.scheduler.num_prefix_cache_queries,
            num_prefix_cache_hits=self.scheduler.num_prefix_cache_hits,
            num_cached_free_blocks=self.pool.num_cached_free_blocks,
            num_decoding=len(decoding),
            num_decoding_tokens=sum(seq.num_tokens for seq in decoding),
            running_remaining_tokens=tuple(remaining),
            step_cost=self.step_cost.current,
            step_cost_samples=self.step_cost.effective_samples,
            step_budget=self.scheduler.step_budget(),
            num_speculative_prefill_tokens=self.scheduler.speculative.num_prefilled_tokens,
            num_speculative_prefill_hits=self.scheduler.speculative.num_hit_tokens,
            num_speculative_prefills=len(self.scheduler.speculative),
        )


def _grammar_end(matcher: Any, token_id: int) -> FinishReason | None:
    """Advance a sequence's matcher by its new token: ``stop`` once the
    grammar is complete and allows nothing more (no EOS step is spent on
    it), ``error`` if the token broke it (a bug: the mask allowed it), else None."""
    if not matcher.consume_token(token_id):
        return FinishReason.ERROR
    return FinishReason.STOP if matcher.is_stopped() else None


def _model_identity(runner: ModelRunnerLike) -> str:
    """What besides the tokens decides a block's K/V: the model, its linears' format and the KV dtype.

    Seeds every prefix-cache hash chain. One pool serves one model, so this
    only matters once hashes leave the process (offloaded or shared KV), but
    it costs nothing to be right from the start.
    """
    kv_caches = getattr(runner, "kv_caches", None)
    dtype = getattr(kv_caches, "dtype", None)
    linears = getattr(runner, "linear_format", None)
    return f"{getattr(runner, 'model_name', type(runner).__name__)}|{linears}|{dtype}|{runner.block_size}"
