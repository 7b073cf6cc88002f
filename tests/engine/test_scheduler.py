"""The scheduler stepped by hand: plans, chunking, preemption, aborts, stops.

No model: each test plays the model by passing sampled token ids to
``update`` for the rows the plan asked to sample.
"""

from __future__ import annotations

import pytest

from bargein.engine.config import SchedulerConfig
from bargein.engine.kv_cache import BlockPool
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from bargein.engine.scheduler import Scheduler, SchedulerOutput
from bargein.engine.sequence import SequenceStatus

EOS = 2


def make(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    prefill_chunk_size: int = 16,
    max_model_len: int = 128,
    enable_prefix_caching: bool = False,
) -> Scheduler:
    # Off by default: every request's prompt starts 100, 101, ..., so with
    # caching on later requests would hit earlier ones' blocks and these
    # hand-counted plans would change (test_prefix_cache.py covers that).
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_chunk_size=prefill_chunk_size,
        max_model_len=max_model_len,
        enable_prefix_caching=enable_prefix_caching,
    )
    return Scheduler(config, BlockPool(num_blocks, block_size), eos_token_ids=[EOS])


def request(request_id: str, num_prompt: int, **params: object) -> EngineRequest:
    prompt = tuple(100 + i for i in range(num_prompt))
    sampling = SamplingParams(**{"max_tokens": 50, "temperature": 0.0, **params})  # type: ignore[arg-type]
    return EngineRequest(request_id=request_id, prompt_token_ids=prompt, params=sampling)


def plan_of(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    """(id, start_pos, num_tokens, sample) per scheduled sequence, in order."""
    return [(s.seq.request_id, s.start_pos, len(s.token_ids), s.sample) for s in out.scheduled]


def run_step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    out = sched.schedule()
    sched.update(out, [token] * out.num_sample)
    return out


def test_prompt_is_chunked_and_samples_only_on_its_last_chunk() -> None:
    sched = make(prefill_chunk_size=16)
    sched.add(request("a", 40))
    assert plan_of(run_step(sched)) == [("a", 0, 16, False)]
    assert plan_of(run_step(sched)) == [("a", 16, 16, False)]
    out = run_step(sched, token=9)
    assert plan_of(out) == [("a", 32, 8, True)]
    seq = sched.get("a")
    assert seq is not None and seq.output_token_ids == [9]
    out = sched.schedule()
    assert plan_of(out) == [("a", 40, 1, True)]
    assert out.scheduled[0].token_ids == (9,)  # the decode feeds the sampled token


def test_block_table_covers_the_scheduled_tokens() -> None:
    sched = make(block_size=4, prefill_chunk_size=16)
    sched.add(request("a", 10))
    out = sched.schedule()
    item = out.scheduled[0]
    assert len(item.block_table) == 3  # 10 tokens / 4 per block
    assert item.token_ids == tuple(range(100, 110))
    sched.update(out, [5])
    out = sched.schedule()
    assert len(out.scheduled[0].block_table) == 3  # position 10 fits block 3
    assert sched.pool.num_free_blocks == 64 - 3


def test_decodes_come_first_then_chunks_then_admissions_within_budget() -> None:
    sched = make(max_num_batched_tokens=20, prefill_chunk_size=16)
    sched.add(request("old", 3))
    run_step(sched)  # old: prefill done, now decoding
    sched.add(request("mid", 30))
    sched.add(request("new", 30))
    out = run_step(sched)
    assert plan_of(out) == [("old", 3, 1, True), ("mid", 0, 16, False), ("new", 0, 3, False)]
    assert out.num_batched_tokens == 20
    out = run_step(sched)
    # old decodes; mid's next chunk (14 left) first, then new gets what is left.
    assert plan_of(out) == [("old", 4, 1, True), ("mid", 16, 14, True), ("new", 3, 5, False)]


def test_max_num_seqs_bounds_admission_fifo() -> None:
    sched = make(max_num_seqs=2)
    for name in "abc":
        sched.add(request(name, 2))
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]
    sched.abort("a")
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["b", "c"]


def test_head_of_queue_that_does_not_fit_blocks_the_rest() -> None:
    sched = make(num_blocks=4, block_size=4, prefill_chunk_size=16, max_model_len=16)
    sched.add(request("a", 10))  # 3 blocks
    run_step(sched)
    sched.add(request("big", 8))  # needs 2 blocks, 1 free
    sched.add(request("small", 2))  # would fit, but FIFO
    out = run_step(sched)
    assert plan_of(out) == [("a", 10, 1, True)]
    assert [s.request_id for s in sched.waiting] == ["big", "small"]


def test_newest_running_sequence_is_preempted_and_recomputed() -> None:
    # 4 blocks of 4 tokens: a and b each hold 2 blocks after prefill (5 tokens).
    sched = make(num_blocks=4, block_size=4, max_model_len=16)
    sched.add(request("a", 4))
    sched.add(request("b", 4))
    run_step(sched, token=11)  # both prefilled: 5 tokens each (4 + 1 sampled)
    assert sched.pool.num_free_blocks == 2
    run_step(sched, token=12)  # both decode token 5 -> need 2nd block each
    assert sched.pool.num_free_blocks == 0
    b = sched.get("b")
    assert b is not None
    for _ in range(3):  # positions 5..7 still in block 2
        run_step(sched, token=13)
    out = sched.schedule()  # a needs a 3rd block at position 8: b (newest) goes
    assert out.preempted_ids == ("b",)
    assert plan_of(out) == [("a", 8, 1, True)]
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert b.num_computed_tokens == 0 and sched.waiting[0] is b
    assert sched.num_preemptions == 1
    sched.update(out, [14])
    sched.abort("a")
    out = sched.schedule()  # b recomputes prompt and output in one chunk
    assert plan_of(out) == [("b", 0, 9, True)]
    assert out.scheduled[0].token_ids == (100, 101, 102, 103, 11, 12, 13, 13, 13)


def test_sequence_preempts_itself_when_it_is_the_newest() -> None:
    sched = make(num_blocks=3, block_size=4, max_model_len=12)
    sched.add(request("a", 4))
    sched.add(request("b", 4))
    run_step(sched)  # a: 1 block + b: 1 block
    out = run_step(sched)  # a takes block 3 for position 4; b (newest) cannot grow: preempted
    assert out.preempted_ids == ("b",)
    assert plan_of(out) == [("a", 4, 1, True)]
    assert sched.pool.num_free_blocks == 1


@pytest.mark.parametrize("when", ["waiting", "mid_prefill", "decoding", "finished"])
def test_abort_in_every_state_frees_blocks(when: str) -> None:
    sched = make(prefill_chunk_size=4)
    sched.add(request("a", 10, max_tokens=2))
    steps = {"waiting": 0, "mid_prefill": 1, "decoding": 3, "finished": 4}[when]
    for _ in range(steps):
        run_step(sched)
    seq = sched.abort("a")
    if when == "finished":
        assert seq is None
    else:
        assert seq is not None and seq.finish_reason is FinishReason.INTERRUPTED
        assert seq.status is SequenceStatus.FINISHED
    assert sched.pool.num_free_blocks == 64
    assert not sched.has_unfinished() and sched.schedule().is_empty
    assert sched.abort("a") is None


@pytest.mark.parametrize(
    ("params", "tokens", "reason", "num_out"),
    [
        ({}, [5, EOS], FinishReason.STOP, 2),
        ({"ignore_eos": True, "max_tokens": 3}, [EOS, EOS, EOS], FinishReason.LENGTH, 3),
        ({"stop_token_ids": (42,)}, [5, 42], FinishReason.STOP, 2),
        ({"max_tokens": 3}, [5, 6, 7], FinishReason.LENGTH, 3),
        ({"max_tokens": 100}, [5] * 20, FinishReason.LENGTH, 8),  # max_model_len 16
    ],
)
def test_token_stops(
    params: dict[str, object], tokens: list[int], reason: FinishReason, num_out: int
) -> None:
    sched = make(max_model_len=16)
    seq = sched.add(request("a", 8, **params))
    for token in tokens:
        out = sched.schedule()
        if out.is_empty:
            break
        sched.update(out, [token])
    assert sched.get("a") is None  # finished: no longer live
    assert sched.pool.num_free_blocks == 64
    assert seq.finish_reason is reason and seq.num_output_tokens == num_out


def test_update_with_wrong_number_of_tokens_is_misuse() -> None:
    sched = make()
    sched.add(request("a", 3))
    out = sched.schedule()
    with pytest.raises(AssertionError):
        sched.update(out, [])
