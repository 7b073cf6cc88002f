"""Prefix caching, unit by unit: the block pool's refcounts, hash chain,
LRU eviction and keep-a-prefix release; then the scheduler's admission over
cached blocks and the engine's outputs and counters (fake runner, no model).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.kv_cache import BlockPool, extend_block_hashes, hash_block
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from bargein.engine.scheduler import Scheduler, SchedulerOutput
from tests.engine.fake_runner import FakeRunner, reference

BS = 4


def hashes_of(pool: BlockPool, tokens: list[int], salt: str | None = None) -> list[bytes]:
    """Hashes of every full block of ``tokens``."""
    out: list[bytes] = []
    extend_block_hashes(out, pool.root_hash(salt), tokens, pool.block_size, len(tokens) // pool.block_size)
    return out


def computed(pool: BlockPool, tokens: list[int], salt: str | None = None) -> list[int]:
    """A table holding ``tokens`` whose full blocks are computed and registered (as after a prefill)."""
    hashes = hashes_of(pool, tokens, salt)
    hits = pool.lookup(hashes)
    pool.touch(hits)
    table = list(hits)
    assert pool.append_slots(table, len(tokens))
    for block_id, block_hash in zip(table, hashes):
        pool.register(block_id, block_hash)
    return table


TOKENS = list(range(1, 4 * BS + 3))  # 4 full blocks and 2 tokens


# ---- the pool ---------------------------------------------------------------------


def test_hash_chain_is_stable_and_names_the_whole_prefix() -> None:
    pool = BlockPool(8, BS, model_id="m")
    hashes = hashes_of(pool, TOKENS)
    assert len(hashes) == 4 and len(set(hashes)) == 4
    assert all(isinstance(h, bytes) and len(h) == 32 for h in hashes)
    assert hashes == hashes_of(BlockPool(2, BS, model_id="m"), TOKENS)  # no per-pool randomness
    assert hashes[1] == hash_block(hashes[0], TOKENS[BS : 2 * BS])
    # the same block after a different first block is a different block
    other = hashes_of(pool, [99, *TOKENS[1:]])
    assert not set(other) & set(hashes)


def test_salt_and_model_identity_isolate_the_cache() -> None:
    pool = BlockPool(16, BS, model_id="m")
    computed(pool, TOKENS, salt=None)
    assert len(pool.lookup(hashes_of(pool, TOKENS, None))) == 4
    for salt in ("tenant-a", ""):  # "" is a salt too, not "shared"
        assert pool.lookup(hashes_of(pool, TOKENS, salt)) == []
    assert pool.root_hash(None) != BlockPool(1, BS, model_id="other").root_hash(None)
    computed(pool, TOKENS, salt="tenant-a")
    assert len(pool.lookup(hashes_of(pool, TOKENS, "tenant-a"))) == 4
    assert pool.lookup(hashes_of(pool, TOKENS, "tenant-b")) == []


@pytest.mark.parametrize("changed", [0, 3, BS, 2 * BS + 1, 4 * BS - 1])
def test_a_change_inside_a_block_misses_it_and_all_after(changed: int) -> None:
    pool = BlockPool(16, BS)
    table = computed(pool, TOKENS)
    edited = list(TOKENS)
    edited[changed] += 100
    hits = pool.lookup(hashes_of(pool, edited))
    assert hits == table[: changed // BS]


def test_refcounts_share_blocks_and_free_them_only_when_nobody_holds_them() -> None:
    pool = BlockPool(8, BS)
    a = computed(pool, TOKENS)  # 5 blocks, 4 registered
    assert pool.num_free_blocks == 3 and pool.num_cached_blocks == 4
    b = computed(pool, TOKENS[: 3 * BS + 1])  # hits 3, 1 new block
    assert b[:3] == a[:3] and b[3] not in a
    assert [pool.ref_count(x) for x in a] == [2, 2, 2, 1, 1]
    assert pool.num_free_blocks == 2
    pool.free(a)
    assert a == [] and [pool.ref_count(x) for x in b] == [1, 1, 1, 1]
    # a's 4th block is cached-free, its partial 5th plain free
    assert pool.num_free_blocks == 4 and pool.num_cached_free_blocks == 1
    pool.free(b)
    assert pool.num_free_blocks == 8 and pool.num_cached_free_blocks == 4
    pool.assert_consistent([])


def test_touching_cached_free_blocks_takes_them_off_the_free_count() -> None:
    pool = BlockPool(6, BS)
    table = computed(pool, TOKENS[: 3 * BS])
    pool.free(table)
    hits = pool.lookup(hashes_of(pool, TOKENS[: 3 * BS]))
    assert len(hits) == 3 and pool.num_free_blocks == 6
    assert pool.num_free_after_touch(hits) == 3
    pool.touch(hits)
    assert pool.num_free_blocks == 3 and pool.num_cached_free_blocks == 0
    held = computed(pool, TOKENS[: 2 * BS])  # hits on held blocks cost nothing
    assert pool.num_free_after_touch(held[:2]) == pool.num_free_blocks == 3
    pool.assert_consistent([hits, held])


def test_eviction_takes_plain_free_blocks_first_then_the_least_recently_freed() -> None:
    pool = BlockPool(7, BS)
    old = computed(pool, [1] * (2 * BS))
    new = computed(pool, [2] * (2 * BS))
    table: list[int] = []
    assert pool.append_slots(table, 3 * BS)  # the 3 never-registered blocks
    old, new, plain = list(old), list(new), list(table)
    for held in (computed_old := old.copy(), new.copy(), table):
        pool.free(held)
    assert computed_old == []
    assert pool.num_cached_free_blocks == 4
    got: list[int] = []
    assert pool.append_slots(got, 3 * BS)
    assert sorted(got) == sorted(plain) and pool.num_evictions == 0
    assert pool.append_slots(got, 4 * BS)
    # the oldest table's tail goes first: its head can still hit without it
    assert got[3] == old[1] and pool.num_evictions == 1
    assert pool.lookup(hashes_of(pool, [1] * (2 * BS))) == old[:1]
    assert pool.append_slots(got, 6 * BS)
    assert got[4:] == [old[0], new[1]]
    assert pool.lookup(hashes_of(pool, [1] * (2 * BS))) == []
    assert pool.lookup(hashes_of(pool, [2] * (2 * BS))) == new[:1]
    assert pool.num_cached_blocks == 1
    pool.assert_consistent([got])


def test_a_hit_refreshes_a_block_in_the_lru_order() -> None:
    pool = BlockPool(2, BS)
    a, b = computed(pool, [1] * BS), computed(pool, [2] * BS)
    block_a = a[0]
    pool.free(a)
    pool.free(b)
    again = computed(pool, [1] * BS)  # a hit: a's block, now the most recently freed
    assert again == [block_a]
    pool.free(again)
    got: list[int] = []
    assert pool.append_slots(got, BS)
    assert pool.lookup(hashes_of(pool, [2] * BS)) == []  # b was older
    assert len(pool.lookup(hashes_of(pool, [1] * BS))) == 1


@pytest.mark.parametrize(
    ("keep_tokens", "num_kept"),
    [
        (0, 0),
        (1, 0),
        (BS - 1, 0),
        (BS, 1),
        (2 * BS + 2, 2),
        (4 * BS, 4),
        (len(TOKENS), 4),
        (999, 4),
        (None, 4),
    ],
)
def test_free_with_keep_tokens_keeps_only_the_blocks_before_the_cut(
    keep_tokens: int | None, num_kept: int
) -> None:
    pool = BlockPool(8, BS)
    table = computed(pool, TOKENS)
    blocks = list(table)
    pool.free(table, keep_tokens)
    assert table == [] and pool.num_free_blocks == 8
    assert pool.lookup(hashes_of(pool, TOKENS)) == blocks[:num_kept]
    assert pool.num_cached_free_blocks == num_kept
    assert all(not pool.is_registered(b) for b in blocks[num_kept:])
    pool.assert_consistent([])
    # the uncached ones are reused before any block the cut kept
    got: list[int] = []
    assert pool.append_slots(got, (8 - num_kept) * BS)
    assert pool.num_evictions == 0


def test_keep_tokens_spares_blocks_another_sequence_holds() -> None:
    pool = BlockPool(8, BS)
    a = computed(pool, TOKENS)
    b = computed(pool, TOKENS[: 2 * BS + 1])
    shared = b[:2]
    pool.free(a, keep_tokens=0)
    assert pool.lookup(hashes_of(pool, TOKENS)) == shared  # still b's, still valid
    pool.free(b)
    assert pool.num_cached_free_blocks == 2
    pool.assert_consistent([])


def test_misuse_asserts() -> None:
    pool = BlockPool(4, BS)
    table = computed(pool, TOKENS[:BS])
    copy = list(table)
    pool.free(table)
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(copy)
    with pytest.raises(AssertionError):
        pool.free([], keep_tokens=-1)
    with pytest.raises(AssertionError, match="while free"):
        pool.register(3, b"x" * 32)
    with pytest.raises(AssertionError, match="not registered"):
        pool.touch([3])
    held = computed(pool, [7] * BS)
    with pytest.raises(AssertionError, match="two hashes"):
        pool.register(held[0], b"y" * 32)


def test_a_second_block_with_a_registered_hash_stays_plain() -> None:
    pool = BlockPool(4, BS)
    h = hashes_of(pool, TOKENS[:BS])[0]
    a: list[int] = []
    b: list[int] = []
    pool.append_slots(a, BS)
    pool.append_slots(b, BS)  # both computed the same block at once
    assert pool.register(a[0], h)
    assert not pool.register(b[0], h)
    assert pool.lookup([h]) == a
    pool.free(b)
    assert pool.num_cached_free_blocks == 0 and pool.num_free_blocks == 3
    pool.free(a)
    assert pool.num_cached_free_blocks == 1
    assert pool.reset_prefix_cache() == 1 and pool.num_cached_blocks == 0
    pool.assert_consistent([])


# ---- the scheduler ---------------------------------------------------------------------


def make(num_blocks: int = 32, *, caching: bool = True, chunk: int = 16) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=32,
        prefill_chunk_size=chunk,
        max_model_len=64,
        enable_prefix_caching=caching,
    )
    return Scheduler(config, BlockPool(num_blocks, BS), eos_token_ids=[0])


def request(
    request_id: str, prompt: list[int], max_tokens: int = 8, salt: str | None = None
) -> EngineRequest:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(
        request_id=request_id, prompt_token_ids=tuple(prompt), params=params, cache_salt=salt
    )


def run_step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    out = sched.schedule()
    sched.update(out, [token] * out.num_sample)
    return out


def run_until_done(sched: Scheduler) -> None:
    for _ in range(200):
        if not sched.has_unfinished():
            return
        run_step(sched)
    raise AssertionError("did not finish")


def plan_of(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [(s.seq.request_id, s.start_pos, len(s.token_ids), s.sample) for s in out.scheduled]


@pytest.mark.parametrize(
    ("prompt_len", "num_cached"),
    [(1, 0), (BS, 0), (BS + 1, BS), (2 * BS, BS), (2 * BS + 1, 2 * BS), (10, 2 * BS)],
)
def test_a_repeated_prompt_starts_after_its_cached_blocks_but_computes_one_token(
    prompt_len: int, num_cached: int
) -> None:
    sched = make()
    prompt = list(range(1, prompt_len + 1))
    sched.add(request("a", prompt, max_tokens=1))
    run_until_done(sched)
    sched.add(request("b", prompt, max_tokens=1))
    out = sched.schedule()
    assert plan_of(out) == [("b", num_cached, prompt_len - num_cached, True)]
    seq = out.scheduled[0].seq
    assert seq.num_cached_tokens == num_cached and seq.num_computed_tokens == num_cached
    assert sched.num_prefix_cache_hits == num_cached
    assert sched.num_prefix_cache_queries == 2 * prompt_len


def test_generated_tokens_fill_blocks_that_the_next_turn_hits() -> None:
    sched = make()
    prompt = list(range(1, 7))  # 6 tokens; 8 generated -> 14 tokens, 13 computed
    sched.add(request("a", prompt, max_tokens=8))
    run_until_done(sched)
    assert sched.pool.num_cached_blocks == 3  # 13 // 4 computed full blocks
    turn2 = prompt + [7] * 7 + [50, 51, 52]  # heard 7 of the 8 output tokens
    sched.add(request("b", turn2))
    out = sched.schedule()
    assert plan_of(out)[0][1] == 3 * BS


def test_admission_counts_only_the_blocks_it_takes() -> None:
    # a holds 4 blocks; b shares 3 of them and needs 2 more: fits in 2 free blocks
    sched = make(num_blocks=6, chunk=32)
    prompt = list(range(1, 15))  # 14 tokens: 3 full blocks + 2
    sched.add(request("a", prompt, max_tokens=2))
    run_step(sched)
    assert sched.pool.num_free_blocks == 2
    sched.add(request("b", prompt + [60, 61, 62, 63, 64]))  # 19 tokens, 5 blocks
    out = sched.schedule()
    assert plan_of(out) == [("a", 14, 1, True), ("b", 12, 7, True)]
    assert sched.pool.num_free_blocks == 0


def test_cached_free_hits_cost_a_free_block_at_admission() -> None:
    sched = make(num_blocks=4, chunk=32)
    sched.add(request("a", list(range(1, 13)), max_tokens=1))  # 3 blocks, cached-free after
    run_until_done(sched)
    sched.add(request("hog", [40] * 5, max_tokens=8))  # 2 blocks: the plain one, then it evicts
    run_step(sched)
    assert sched.pool.num_free_blocks == 2
    # 14 tokens: 4 blocks; hits a's first 2 (its tail was evicted), both cached-free
    sched.add(request("b", list(range(1, 13)) + [9] * 2, max_tokens=2))
    out = sched.schedule()
    assert [p[0] for p in plan_of(out)] == ["hog"]  # 4 - 2 hits + 2 cached-free hits > 2 free
    sched.update(out, [7])
    run_until_done(sched)
    assert sched.num_prefix_cache_hits == BS  # hog's third block evicted a's second meanwhile
    assert sched.pool.num_free_blocks == 4
    sched.pool.assert_consistent([])


def test_a_preempted_sequence_hits_its_own_blocks() -> None:
    # a grows to 20 tokens (5 blocks), b to 21 (6): 7 blocks preempt b, the newest
    sched = make(num_blocks=7, chunk=16)
    sched.add(request("a", list(range(1, 9)), max_tokens=12))
    sched.add(request("b", [30] * 9, max_tokens=12))
    for _ in range(40):
        out = run_step(sched)
        if out.preempted_ids:
            break
    assert out.preempted_ids == ("b",)
    seq = sched.get("b")
    assert seq is not None and seq.num_preemptions == 1 and seq.num_output_tokens > 0
    hits = sched.num_prefix_cache_hits
    for _ in range(40):
        out = run_step(sched)
        item = next((s for s in out.scheduled if s.seq is seq), None)
        if item is not None:
            break
    assert item is not None
    # its head blocks outlived the eviction of its tail: a's growth took only those
    assert item.start_pos == 2 * BS == sched.num_prefix_cache_hits - hits
    assert seq.num_cached_tokens == 0  # reported for the first admission only
    run_until_done(sched)
    assert sched.pool.num_free_blocks == 7
    sched.pool.assert_consistent([])


def test_caching_off_never_hashes() -> None:
    sched = make(caching=False)
    prompt = list(range(1, 11))
    for request_id in ("a", "b"):
        sched.add(request(request_id, prompt, max_tokens=3))
        out = sched.schedule()
        assert plan_of(out) == [(request_id, 0, 10, True)]
        sched.update(out, [7])
        run_until_done(sched)
    assert sched.pool.num_cached_blocks == 0 and sched.num_prefix_cache_queries == 0


# ---- the engine ---------------------------------------------------------------------

ENGINE_CONFIG = SchedulerConfig(
    max_num_seqs=8, max_num_batched_tokens=24, prefill_chunk_size=8, max_model_len=48
)


def run(engine: LLMEngine, req: EngineRequest) -> list[int]:
    engine.add_request(req)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
            last = out
    assert last.finished
    return tokens


def test_engine_reports_cached_tokens_and_counters() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), ENGINE_CONFIG)
    prompt = tuple(range(1, 19))  # 18 tokens
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = run(engine, EngineRequest(request_id="a", prompt_token_ids=prompt, params=params))
    turn2 = prompt + tuple(first) + (3, 4)
    engine.add_request(EngineRequest(request_id="b", prompt_token_ids=turn2, params=params))
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    assert [t for o in outs for t in o.new_token_ids] == reference(turn2, 6, 48, ignore_eos=True)
    assert {o.num_cached_tokens for o in outs} == {20}  # 23 of a's tokens computed: 5 blocks
    stats = engine.stats()
    assert (stats.num_prefix_cache_queries, stats.num_prefix_cache_hits) == (18 + 26, 20)
    assert stats.num_free_blocks == 20 and stats.num_cached_free_blocks == 7  # 31 computed // 4
    off = LLMEngine(FakeRunner(num_blocks=20), replace(ENGINE_CONFIG, enable_prefix_caching=False))
    run(off, EngineRequest(request_id="a", prompt_token_ids=prompt, params=params))
    assert off.stats().num_cached_free_blocks == 0 and off.stats().num_prefix_cache_queries == 0


def test_engine_abort_keep_tokens_keeps_the_heard_prefix_only() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), ENGINE_CONFIG)
    prompt = tuple(range(1, 11))  # 10 tokens
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    engine.add_request(EngineRequest(request_id="a", prompt_token_ids=prompt, params=params))
    while (seq := engine.scheduler.get("a")) is not None and seq.num_output_tokens < 10:
        engine.step()
    assert seq is not None and seq.num_computed_tokens == 19
    assert engine.pool.num_cached_blocks == 4
    with pytest.raises(ValueError, match="keep_tokens"):
        engine.abort_request("a", keep_tokens=-1)
    engine.abort_request("a", FinishReason.INTERRUPTED, keep_tokens=13)  # heard 3 output tokens
    (out,) = engine.step()
    assert out.finished and out.finish_reason is FinishReason.INTERRUPTED
    assert engine.stats().num_cached_free_blocks == 3 and engine.stats().num_free_blocks == 20
    engine.pool.assert_consistent([])
