"""Continuous batching: which tokens of which sequences run in the next step.

Token-budget scheduling after vLLM v1 (``vllm/v1/core/sched/scheduler.py``):
every sequence's computed tokens catch up with its tokens, a few at a time.
Each step spends at most ``max_num_batched_tokens`` tokens:

1. decodes first: every running sequence with one token to compute;
2. then prefill chunks of running sequences still in their prompt (oldest
   first), at most ``prefill_chunk_size`` tokens each;
3. then new sequences from the waiting queue, FIFO, while fewer than
   ``max_num_seqs`` run and blocks allow (none admitted in a step that
   preempted).

With an inter-token latency target (``SchedulerConfig.target_itl_s``) and
a step-time model (the ``step_cost`` callable, the engine's fit of
engine/step_budget.py), time is the budget too: after the decodes, prefill
chunks (2. and 3.) share only the prefill tokens the model says fit the
target after them (at least ``min_prefill_tokens``), so a burst of long
prompts never stretches the running streams' next token past the target;
and a waiting sequence joins the running batch only while the decodes of
the batch it makes (every running sequence, and it, once their prompts are
in) still fit the target with ``min_prefill_tokens`` of prefill: the
running set follows the budget, ``max_num_seqs`` is only a cap. A running
batch over the budget (the machine slowed down) is not preempted for time:
preemption recomputes, which costs more time, and the batch shrinks as its
streams finish because nothing joins it.

When the block pool cannot cover a running sequence's next tokens, the
newest running sequence is preempted: its blocks are freed and it goes back
to the front of the waiting queue to be recomputed (prompt plus output so
far) when blocks allow. Pure Python, no torch: tests step it with
hand-made sampled tokens.

With prefix caching (``SchedulerConfig.enable_prefix_caching``), admission
first looks up the longest registered chain of the sequence's full blocks
(never all its tokens: the last one is computed, its logits sample the next
token), takes those blocks and starts the prefill after them; a preempted
sequence may hit its own blocks. After each step every block a sequence's
computed tokens filled is registered, prompt and output alike.

Prefill-only requests (``EngineRequest.prefill_only``) fill the prefix cache
at the lowest priority: they live in their own queues
(engine/speculative_prefill.py), take only the budget, slots and blocks the
real requests left, and are dropped, never preempted and requeued, when a
real sequence needs their blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bargein.engine.config import SchedulerConfig
from bargein.engine.kv_cache import BlockPool, extend_block_hashes
from bargein.engine.request import EngineRequest, FinishReason
from bargein.engine.sequence import Sequence, SequenceStatus
from bargein.engine.speculative_prefill import SpeculativePrefills
from bargein.engine.step_budget import StepBudget, StepCostCoefficients


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledSeq:
    """One sequence's slice of the next step (the model runner's ``SeqInput``).

    Attributes:
        seq: the sequence (mutable; the scheduler updates it).
        token_ids: tokens to compute this step, positions ``start_pos...``.
        start_pos: tokens already in the KV cache.
        block_table: KV block ids covering ``start_pos + len(token_ids)``.
        sample: whether the step ends the sequence's known tokens, so a new
            token is sampled from the last position's logits.
    """

    seq: Sequence
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    sample: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerOutput:
    """The plan of one step.

    Attributes:
        scheduled: decodes first, then prefill chunks; sampled rows come in
            this order among those with ``sample``.
        preempted_ids: request ids preempted while planning this step.
        num_batched_tokens: total tokens computed this step.
        budget: the step budget it was planned against (None: no target).
        prefill_budget: of it, the prefill tokens the step could take after
            its decodes (None: no target; the token limits alone).
    """

    scheduled: tuple[ScheduledSeq, ...]
    preempted_ids: tuple[str, ...] = ()
    num_batched_tokens: int = 0
    budget: StepBudget | None = None
    prefill_budget: int | None = None

    @property
    def num_decode_seqs(self) -> int:
        """One-token slices: the step-time model's decodes."""
        return sum(1 for s in self.scheduled if len(s.token_ids) == 1)

    @property
    def num_context_tokens(self) -> int:
        """KV tokens the decodes attend to (each one's ``start_pos + 1``)."""
        return sum(s.start_pos + 1 for s in self.scheduled if len(s.token_ids) == 1)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of the slices longer than one (prompt chunks)."""
        return self.num_batched_tokens - self.num_decode_seqs

    @property
    def predicted_s(self) -> float | None:
        """The step's duration as the model predicts it; None without a target."""
        if self.budget is None:
            return None
        return self.budget.cost.predict(
            self.num_decode_seqs, self.num_prefill_tokens, self.num_context_tokens
        )

    @property
    def num_sample(self) -> int:
        """Rows of logits the model returns (sequences sampling this step)."""
        return sum(1 for s in self.scheduled if s.sample)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute (no sequences, or none fit)."""
        return not self.scheduled


@dataclass(slots=True)
class _StepPlan:
    """Working state of one ``schedule()`` call."""

    budget: int  # tokens left to plan
    num_tokens: dict[Sequence, int] = field(default_factory=dict)  # insertion order
    preempted: list[Sequence] = field(default_factory=list)
    time: StepBudget | None = None  # the target's budget, if any
    prefill_budget: int | None = None


class Scheduler:
    """Waiting and running queues over one :class:`BlockPool`.

    Args:
        config: step limits.
        pool: the KV block pool (shared with nobody else).
        eos_token_ids: tokens that end a sequence unless ``ignore_eos``.
        step_cost: the current step-time model (called once per plan);
            with ``config.target_itl_s`` it sizes each step. None: the token
            limits alone, whatever the target.

    Misuse (a duplicate id, a prompt that cannot fit the context, sampled
    tokens that do not match the plan) is an ``AssertionError``: the engine
    validates requests before they get here.

    Attributes:
        num_preemptions: sequences preempted since start.
        num_prefix_cache_queries: tokens of admitted sequences looked up in
            the prefix cache (a prompt; prompt plus output after a preemption).
        num_prefix_cache_hits: of those, tokens whose K/V were reused.
        speculative: the prefill-only sequences, their queues and counters.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        pool: BlockPool,
        eos_token_ids: Iterable[int] = (),
        step_cost: Callable[[], StepCostCoefficients] | None = None,
    ) -> None:
        self.config = config
        self.step_cost = step_cost
        self.pool = pool
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._live: dict[str, Sequence] = {}
        self._next_seq_no = 0
        self.caching = config.enable_prefix_caching
        self.num_preemptions = 0
        self.num_prefix_cache_queries = 0
        self.num_prefix_cache_hits = 0
        self.speculative = SpeculativePrefills(pool.block_size, max_tracked_blocks=2 * pool.num_total_blocks)

    # ---- requests in and out -------------------------------------------

    def add(self, request: EngineRequest) -> Sequence:
        """Queue a request at the back of the waiting queue."""
        assert request.request_id not in self._live, request.request_id
        assert len(request.prompt_token_ids) < self.config.max_model_len
        seq = Sequence(request, self._next_seq_no)
        self._next_seq_no += 1
        if self.caching:
            seq.hash_root = self.pool.root_hash(request.cache_salt)
        self._live[request.request_id] = seq
        if request.prefill_only:
            assert self.caching, "a prefill-only request needs prefix caching"
            self.speculative.waiting.append(seq)
        else:
            self.waiting.append(seq)
        return seq

    def finish(
        self, request_id: str, reason: FinishReason, *, keep_tokens: int | None = None
    ) -> Sequence | None:
        """End a live sequence in any state and free its blocks.

        Used for aborts and for stop strings found after ``update``.
        ``keep_tokens``: only the full blocks within the sequence's first
        ``keep_tokens`` tokens (prompt plus output) stay in the prefix cache
        (:meth:`BlockPool.free`); ``None`` keeps all.

        Returns:
            the finished sequence, or ``None`` when the id is unknown or
            already finished (a no-op).
        """
        seq = self._live.get(request_id)
        if seq is None:
            return None
        if seq.request.prefill_only:
            spec = self.speculative
            (spec.running if seq.status is SequenceStatus.RUNNING else spec.waiting).remove(seq)
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._release(seq, reason, keep_tokens)
        return seq

    def abort(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.INTERRUPTED,
        *,
        keep_tokens: int | None = None,
    ) -> Sequence | None:
        """Abort a request wherever it is; see :meth:`finish`."""
        return self.finish(request_id, reason, keep_tokens=keep_tokens)

    def get(self, request_id: str) -> Sequence | None:
        """The live sequence with this id, if any."""
        return self._live.get(request_id)

    @property
    def num_unfinished(self) -> int:
        """Sequences waiting or running."""
        return len(self._live)

    def has_unfinished(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self._live)

    # ---- planning a step --------------------------------------------------

    def step_budget(self) -> StepBudget | None:
        """The time budget of the next step (None: no target or no model)."""
        cfg = self.config
        if not cfg.target_itl_s or self.step_cost is None:
            return None
        return StepBudget(
            target_s=cfg.target_itl_s,
            cost=self.step_cost(),
            max_tokens=cfg.max_num_batched_tokens,
            min_prefill_tokens=cfg.min_prefill_tokens,
            slow_headroom=cfg.slow_headroom,
        )

    def schedule(self) -> SchedulerOutput:
        """Plan the next step: decodes, then prefill chunks, then admissions."""
        plan = _StepPlan(budget=self.config.max_num_batched_tokens, time=self.step_budget())
        self._schedule_running(plan, decodes=True)
        if plan.time is not None:
            decodes = [seq for seq, n in plan.num_tokens.items() if n == 1]
            context = sum(seq.num_computed_tokens + 1 for seq in decodes)
            plan.prefill_budget = plan.time.prefill_tokens(len(decodes), context)
            plan.budget = min(plan.budget, plan.prefill_budget)
        self._schedule_running(plan, decodes=False)
        if not plan.preempted:
            self._schedule_waiting(plan)
        if not plan.preempted and not self.waiting:  # a real request waiting is never overtaken
            self._schedule_speculative(plan)
        scheduled = tuple(self._slice(seq, n) for seq, n in plan.num_tokens.items())
        return SchedulerOutput(
            scheduled=scheduled,
            preempted_ids=tuple(s.request_id for s in plan.preempted),
            num_batched_tokens=sum(plan.num_tokens.values()),
            budget=plan.time,
            prefill_budget=plan.prefill_budget,
        )

    def _schedule_running(self, plan: _StepPlan, *, decodes: bool) -> None:
        """Give running sequences their tokens: one-token decodes or chunks."""
        for seq in list(self.running):
            if plan.budget == 0:
                return
            if seq.status is not SequenceStatus.RUNNING or seq in plan.num_tokens:
                continue  # preempted earlier in this loop, or already planned
            num_new = seq.num_tokens - seq.num_computed_tokens
            assert num_new >= 1, seq
            if (num_new == 1) != decodes:
                continue
            num_new = min(num_new, self.config.prefill_chunk_size, plan.budget)
            if self._reserve(seq, seq.num_computed_tokens + num_new, plan):
                plan.num_tokens[seq] = num_new
                plan.budget -= num_new

    def _reserve(self, seq: Sequence, num_tokens: int, plan: _StepPlan) -> bool:
        """Cover ``num_tokens`` of ``seq`` with blocks, preempting the newest.

        Returns ``False`` when ``seq`` itself was the newest and got preempted.
        """
        while not self.pool.append_slots(seq.block_table, num_tokens):
            if self._drop_speculative():
                continue  # a prefill-only sequence gave its blocks back first
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, plan: _StepPlan) -> None:
        """Free ``seq``'s blocks and queue it first for recomputation."""
        self.running.remove(seq)
        planned = plan.num_tokens.pop(seq, 0)
        plan.budget += planned
        self.pool.free(seq.block_table)  # its registered blocks stay cached
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        self.num_preemptions += 1

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        """Admit waiting sequences in FIFO order while limits, blocks and the
        time budget allow."""
        # the decodes of the running batch once every prompt is in
        context = sum(seq.num_tokens for seq in self.running) if plan.time is not None else 0
        while self.waiting and plan.budget > 0:
            if len(self.running) >= self.config.max_num_seqs:
                return
            seq = self.waiting[0]
            if plan.time is not None:
                context += seq.num_tokens
                if self.running and not plan.time.fits(len(self.running) + 1, context):
                    return  # FIFO: it waits for the batch to shrink (one always runs)
            hits = self._cache_hits(seq)
            num_cached = len(hits) * self.pool.block_size
            num_new = min(seq.num_tokens - num_cached, self.config.prefill_chunk_size, plan.budget)
            while not self._allocate(seq, hits, num_cached + num_new):
                if not self._drop_speculative():
                    return  # FIFO: nobody overtakes the head of the queue
                hits = self._cache_hits(seq)  # a dropped prefill's blocks may have been evicted
                num_cached = len(hits) * self.pool.block_size
                num_new = min(seq.num_tokens - num_cached, self.config.prefill_chunk_size, plan.budget)
            seq.num_computed_tokens = num_cached
            self._count_hits(seq, num_cached)
            self.speculative.count_hits(seq.block_hashes[: len(hits)])
            self._drop_overtaken(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            plan.num_tokens[seq] = num_new
            plan.budget -= num_new

    def _cache_hits(self, seq: Sequence, num_blocks: int | None = None) -> list[int]:
        """Blocks of the longest cached prefix of ``seq`` (no reference taken),
        among its first ``num_blocks`` blocks.

        By default never covers the last token: at least one token is
        computed, so the step has logits to sample from (vLLM caps the hit
        the same way).
        """
        if seq.hash_root is None:
            return []
        if num_blocks is None:
            num_blocks = (seq.num_tokens - 1) // self.pool.block_size
        extend_block_hashes(seq.block_hashes, seq.hash_root, seq.token_ids, self.pool.block_size, num_blocks)
        return self.pool.lookup(seq.block_hashes[:num_blocks])

    def _allocate(self, seq: Sequence, hits: list[int], num_tokens: int) -> bool:
        """Give a waiting ``seq`` the ``hits`` then new blocks up to ``num_tokens``.

        Counts only the blocks it really takes from the free count: the new
        ones, and the hits no sequence held (cached-free). Allocates nothing
        and returns ``False`` when they do not fit.
        """
        assert not seq.block_table, seq
        num_new_blocks = self.pool.num_blocks_for(num_tokens) - len(hits)
        if num_new_blocks > self.pool.num_free_after_touch(hits):
            return False
        self.pool.touch(hits)  # first, so allocating cannot evict them
        seq.block_table.extend(hits)
        allocated = self.pool.append_slots(seq.block_table, num_tokens)
        assert allocated, seq
        seq.num_registered_blocks = len(hits)
        return True

    def _count_hits(self, seq: Sequence, num_cached: int) -> None:
        """Prefix-cache counters of one admission; the request's hit at its first."""
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = min(num_cached, seq.num_prompt_tokens)
        if seq.hash_root is not None:
            self.num_prefix_cache_queries += seq.num_tokens
            self.num_prefix_cache_hits += num_cached

    def _register_full_blocks(self, seq: Sequence) -> None:
        """Offer the blocks ``seq``'s computed tokens have filled to the prefix cache."""
        num_full = seq.num_computed_tokens // self.pool.block_size
        if seq.hash_root is None or num_full <= seq.num_registered_blocks:
            return
        extend_block_hashes(seq.block_hashes, seq.hash_root, seq.token_ids, self.pool.block_size, num_full)
        for index in range(seq.num_registered_blocks, num_full):
            registered = self.pool.register(seq.block_table[index], seq.block_hashes[index])
            if registered and seq.request.prefill_only:
                self.speculative.filled(seq.block_hashes[index])
        seq.num_registered_blocks = num_full

    @staticmethod
    def _slice(seq: Sequence, num_new: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        end = start + num_new
        return ScheduledSeq(
            seq=seq,
            token_ids=tuple(seq.token_ids[start:end]),
            start_pos=start,
            block_table=tuple(seq.block_table),
            sample=end == seq.num_tokens and not seq.request.prefill_only,
        )

    # ---- prefill-only sequences (engine/speculative_prefill.py) -------------

    def _schedule_speculative(self, plan: _StepPlan) -> None:
        """Prefill-only sequences take what the real ones left: chunks of the
        admitted ones, then admissions while slots allow. No preemption for
        them: one that cannot get blocks, or whose slot real sequences took
        (newest first), is dropped."""
        spec = self.speculative
        chunk = self.config.prefill_chunk_size
        while spec.running and len(self.running) + len(spec.running) > self.config.max_num_seqs:
            self._end_speculative(spec.running[-1], FinishReason.CANCELLED)
        for seq in list(spec.running):
            if plan.budget == 0:
                return
            num_new = min(spec.target(seq) - seq.num_computed_tokens, chunk, plan.budget)
            if not self.pool.append_slots(seq.block_table, seq.num_computed_tokens + num_new):
                self._end_speculative(seq, FinishReason.CANCELLED)
                continue
            plan.num_tokens[seq] = num_new
            plan.budget -= num_new
        while spec.waiting and plan.budget > 0:
            if len(self.running) + len(spec.running) >= self.config.max_num_seqs:
                return
            seq = spec.waiting[0]
            target = spec.target(seq)
            hits = self._cache_hits(seq, target // self.pool.block_size)
            num_cached = len(hits) * self.pool.block_size
            if num_cached >= target:
                self._end_speculative(seq, FinishReason.STOP)  # all of it is cached already
                continue
            num_new = min(target - num_cached, chunk, plan.budget)
            if not self._allocate(seq, hits, num_cached + num_new):
                self._end_speculative(seq, FinishReason.CANCELLED)
                continue
            spec.waiting.popleft()
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            spec.running.append(seq)
            plan.num_tokens[seq] = num_new
            plan.budget -= num_new

    def _drop_overtaken(self, seq: Sequence) -> None:
        """A real ``seq`` was admitted: a running prefill-only sequence whose
        computed blocks it starts with is dropped (the real one computes the
        rest of what they share; the prefill would compute it twice)."""
        for spec in list(self.speculative.running):
            num_done = spec.num_computed_tokens // self.pool.block_size
            if num_done and num_done <= len(seq.block_hashes):
                if seq.block_hashes[num_done - 1] == spec.block_hashes[num_done - 1]:
                    self._end_speculative(spec, FinishReason.CANCELLED)

    def _drop_speculative(self) -> bool:
        """A real sequence needs blocks: drop the newest running prefill-only
        sequence (its filled blocks stay cached). Returns whether one was."""
        if not self.speculative.running:
            return False
        self._end_speculative(self.speculative.running[-1], FinishReason.CANCELLED)
        return True

    def _end_speculative(self, seq: Sequence, reason: FinishReason) -> None:
        """End a prefill-only sequence: done (``STOP``) or dropped (``CANCELLED``)."""
        spec = self.speculative
        (spec.running if seq.status is SequenceStatus.RUNNING else spec.waiting).remove(seq)
        self._release(seq, reason)
        spec.ended.append(seq)

    # ---- after the step ---------------------------------------------------

    def update(self, output: SchedulerOutput, sampled: list[int]) -> list[Sequence]:
        """Advance sequences by the step's results and apply token stops.

        Args:
            output: the plan that was executed.
            sampled: one token id per scheduled sequence with ``sample``, in
                order.

        Returns:
            the sequences that received a token this step, in plan order;
            those that hit EOS, a stop token id, ``max_tokens`` or
            ``max_model_len`` are finished (``finish_reason`` set, blocks
            freed).
        """
        assert len(sampled) == output.num_sample, (len(sampled), output.num_sample)
        rows = iter(sampled)
        updated: list[Sequence] = []
        for item in output.scheduled:
            seq = item.seq
            assert seq.status is SequenceStatus.RUNNING, seq
            seq.num_computed_tokens += len(item.token_ids)
            self._register_full_blocks(seq)  # their K/V are written now
            if seq.request.prefill_only:
                self.speculative.computed(len(item.token_ids))
                if seq.num_computed_tokens >= self.speculative.target(seq):
                    self._end_speculative(seq, FinishReason.STOP)
                continue
            if not item.sample:
                continue
            token_id = next(rows)
            seq.token_ids.append(token_id)
            reason = self._token_stop(seq, token_id)
            if reason is not None:
                self.running.remove(seq)
                self._release(seq, reason)
            updated.append(seq)
        return updated

    def _token_stop(self, seq: Sequence, token_id: int) -> FinishReason | None:
        params = seq.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH
        if seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _release(self, seq: Sequence, reason: FinishReason, keep_tokens: int | None = None) -> None:
        self.pool.free(seq.block_table, keep_tokens)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self._live[seq.request_id]
