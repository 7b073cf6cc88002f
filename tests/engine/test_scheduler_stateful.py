"""Stateful property test of the scheduler and block pool together.

Random arrivals, aborts (in any state, including unknown and finished ids,
some keeping a prefix cached) and steps; the "model" is a fake sampler
drawing token ids, some of them EOS. Every request must end exactly once,
blocks must never leak, reference counts must equal the tables holding each
block, no step crashes. Run with prefix caching on (prompts that share
prefixes, two salts) and off, and with a time budget that binds (at most
two sequences decode in a step, a few prefill tokens after them): no step
takes more prefill than the budget allowed, and still every request ends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bargein.engine.config import SchedulerConfig
from bargein.engine.kv_cache import BlockPool
from bargein.engine.request import EngineRequest, SamplingParams
from bargein.engine.scheduler import Scheduler
from bargein.engine.sequence import SequenceStatus
from bargein.engine.step_budget import StepCostCoefficients

EOS = 0
NUM_BLOCKS = 10
BLOCK_SIZE = 4
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=12, prefill_chunk_size=6, max_model_len=32)


class SchedulerMachine(RuleBasedStateMachine):
    config = CONFIG

    def __init__(self) -> None:
        super().__init__()
        self.sched = Scheduler(self.config, BlockPool(NUM_BLOCKS, BLOCK_SIZE), eos_token_ids=[EOS])
        self.ids: list[str] = []
        self.ended: Counter[str] = Counter()

    @rule(
        num_prompt=st.integers(1, CONFIG.max_model_len - 1),
        max_tokens=st.integers(1, 12),
        ignore_eos=st.booleans(),
        first=st.integers(1, 3),
        salt=st.sampled_from([None, "a"]),
    )
    def arrive(
        self, num_prompt: int, max_tokens: int, ignore_eos: bool, first: int, salt: str | None
    ) -> None:
        request_id = f"r{len(self.ids)}"
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=0)
        prompt = tuple(range(first, first + num_prompt))  # shared prefixes when `first` repeats
        request = EngineRequest(
            request_id=request_id, prompt_token_ids=prompt, params=params, cache_salt=salt
        )
        self.sched.add(request)
        self.ids.append(request_id)

    @rule(index=st.integers(0, 40), keep_tokens=st.none() | st.integers(0, CONFIG.max_model_len))
    def abort(self, index: int, keep_tokens: int | None) -> None:
        request_id = self.ids[index] if index < len(self.ids) else "unknown"
        seq = self.sched.abort(request_id, keep_tokens=keep_tokens)
        if seq is not None:
            self.ended[request_id] += 1

    @rule(tokens=st.lists(st.integers(0, 5), min_size=CONFIG.max_num_seqs, max_size=CONFIG.max_num_seqs))
    def step(self, tokens: list[int]) -> None:
        hits = self.sched.num_prefix_cache_hits
        out = self.sched.schedule()
        if self.sched.num_prefix_cache_hits > hits:
            event("prefix cache hit")
        assert out.num_batched_tokens <= CONFIG.max_num_batched_tokens
        if out.prefill_budget is not None:
            event("time budget")
            assert out.num_prefill_tokens <= out.prefill_budget
        assert len(out.scheduled) <= CONFIG.max_num_seqs
        if out.preempted_ids:
            event("preempted")
        for item in out.scheduled:
            assert len(item.block_table) * BLOCK_SIZE >= item.start_pos + len(item.token_ids)
        for seq in self.sched.update(out, tokens[: out.num_sample]):
            if seq.is_finished:
                self.ended[seq.request_id] += 1

    @invariant()
    def blocks_are_accounted_for(self) -> None:
        tables = [seq.block_table for seq in self.sched.running]
        held = {block_id for table in tables for block_id in table}
        assert len(held) + self.sched.pool.num_free_blocks == NUM_BLOCKS
        self.sched.pool.assert_consistent(tables)
        if not self.config.enable_prefix_caching:
            assert self.sched.pool.num_cached_blocks == 0
            assert sum(map(len, tables)) == len(held)
        assert all(not seq.block_table for seq in self.sched.waiting)
        assert all(seq.status is SequenceStatus.RUNNING for seq in self.sched.running)
        assert len(self.sched.running) <= CONFIG.max_num_seqs
        assert all(count == 1 for count in self.ended.values())

    def teardown(self) -> None:
        for _ in range(2000):  # every live request must finish on its own
            if not self.sched.has_unfinished():
                break
            self.step([1] * CONFIG.max_num_seqs)
        assert not self.sched.has_unfinished()
        assert self.ended == Counter(self.ids)
        assert self.sched.pool.num_free_blocks == NUM_BLOCKS
        self.sched.pool.assert_consistent([])


class SchedulerMachineWithoutPrefixCaching(SchedulerMachine):
    config = replace(CONFIG, enable_prefix_caching=False)


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
SchedulerMachineWithoutPrefixCaching.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None
)


class SchedulerMachineWithTimeBudget(SchedulerMachine):
    # 40 ms a step: 10 ms, 10 ms a decode, 5 ms a prefill token; two prefill tokens at least
    config = replace(CONFIG, target_itl_s=0.04, min_prefill_tokens=2)
    cost = StepCostCoefficients(
        base_s=0.01, per_decode_s=0.01, per_prefill_token_s=0.005, per_context_token_s=0.0
    )

    def __init__(self) -> None:
        super().__init__()
        self.sched.step_cost = lambda: self.cost


SchedulerMachineWithTimeBudget.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None
)
test_scheduler_state_machine_with_time_budget = SchedulerMachineWithTimeBudget.TestCase
test_scheduler_state_machine = SchedulerMachine.TestCase
test_scheduler_state_machine_without_prefix_caching = SchedulerMachineWithoutPrefixCaching.TestCase
