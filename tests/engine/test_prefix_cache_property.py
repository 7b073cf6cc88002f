"""Property test: prefix caching changes no token, over random multi-turn conversations.

Each conversation starts from a shared system prompt; each next turn's
prompt is the previous prompt, a kept part of the previous output (none, all,
or a cut inside it, as after a barge-in) and new user tokens. Turns may be
aborted after a few output tokens with ``keep_tokens`` at the cut; a small
KV pool makes sequences preempt. The same scenario runs on two engines over
the fake runner (which reads every earlier token back through the block
table, so a wrong or stale cached block changes the tokens): with caching on
and off. Outputs must be equal token for token, ``num_cached_tokens`` must be
a block multiple no longer than the prefix shared with an earlier sequence,
and an idle engine must hold no reference and no block outside free or
cached-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from tests.engine.fake_runner import FakeRunner, reference

BLOCK_SIZE = 4
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, prefill_chunk_size=8, max_model_len=48)
SYSTEM = (5, 6, 7, 8, 9, 10)  # every conversation's first tokens


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: new tokens, how long the answer may get, when and where it is cut."""

    user: tuple[int, ...]
    max_tokens: int
    abort_after: int | None  # abort once this many tokens came out (0: before any step)
    cut: str  # "zero", "full" or "inside": how much of the answer the next prompt keeps
    cut_seed: int


@dataclass(frozen=True, slots=True)
class Conversation:
    salt: str | None
    turns: tuple[Turn, ...]


turns = st.builds(
    Turn,
    user=st.lists(st.integers(1, 31), min_size=1, max_size=9).map(tuple),
    max_tokens=st.integers(1, 14),
    abort_after=st.none() | st.integers(0, 8),
    cut=st.sampled_from(["zero", "full", "inside"]),
    cut_seed=st.integers(0, 1000),
)
conversations = st.builds(
    Conversation,
    salt=st.sampled_from([None, None, "tenant-b"]),
    turns=st.lists(turns, min_size=1, max_size=5).map(tuple),
)


@dataclass(slots=True)
class Record:
    """What one request got."""

    salt: str | None
    prompt: tuple[int, ...]
    max_tokens: int
    submitted: int  # submission order
    output: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    keep_tokens: int | None = None


@dataclass(slots=True)
class _Live:
    conv: int
    turn: int
    request_id: str


def _cut(turn: Turn, output: list[int]) -> int:
    """How many output tokens the next prompt keeps."""
    if turn.cut == "zero":
        return 0
    if turn.cut == "full":
        return len(output)
    return turn.cut_seed % (len(output) + 1)


def drive(engine: LLMEngine, convs: list[Conversation]) -> dict[str, Record]:
    """Play every conversation to its end on ``engine``; return each request's record.

    Every decision reads only the requests' own outputs, so two engines that
    produce the same tokens play exactly the same scenario.
    """
    records: dict[str, Record] = {}
    prompts = [SYSTEM for _ in convs]  # the prompt the next turn extends
    next_turn = [0] * len(convs)
    live: dict[int, _Live] = {}
    aborted: set[str] = set()
    for _ in range(3000):
        for c, conv in enumerate(convs):
            if c in live or next_turn[c] >= len(conv.turns):
                continue
            turn = conv.turns[next_turn[c]]
            prompt = prompts[c] + turn.user
            if len(prompt) >= CONFIG.max_model_len:
                next_turn[c] = len(conv.turns)  # the context is full: the conversation ends
                continue
            request_id = f"c{c}t{next_turn[c]}"
            params = SamplingParams(temperature=0, max_tokens=turn.max_tokens)
            engine.add_request(
                EngineRequest(
                    request_id=request_id, prompt_token_ids=prompt, params=params, cache_salt=conv.salt
                )
            )
            records[request_id] = Record(conv.salt, prompt, turn.max_tokens, len(records))
            live[c] = _Live(c, next_turn[c], request_id)
        if not live:
            return records
        _abort_due(engine, convs, live, records, aborted)
        for out in engine.step():
            record = records[out.request_id]
            record.output.extend(out.new_token_ids)
            record.num_cached_tokens = out.num_cached_tokens
            if out.finished:
                record.finish_reason = out.finish_reason
                c = int(out.request_id[1 : out.request_id.index("t")])
                turn = convs[c].turns[live[c].turn]
                prompts[c] = record.prompt + tuple(record.output[: _cut(turn, record.output)])
                next_turn[c] += 1
                del live[c]
        held = [seq.block_table for seq in engine.scheduler.running]
        engine.pool.assert_consistent(held)
    raise AssertionError("the conversations did not end")


def _abort_due(
    engine: LLMEngine,
    convs: list[Conversation],
    live: dict[int, _Live],
    records: dict[str, Record],
    aborted: set[str],
) -> None:
    """Barge in on live turns that produced ``abort_after`` tokens, keeping the heard prefix."""
    for c, item in live.items():
        turn = convs[c].turns[item.turn]
        record = records[item.request_id]
        if turn.abort_after is None or item.request_id in aborted or len(record.output) < turn.abort_after:
            continue
        record.keep_tokens = len(record.prompt) + _cut(turn, record.output)
        engine.abort_request(item.request_id, FinishReason.INTERRUPTED, keep_tokens=record.keep_tokens)
        aborted.add(item.request_id)


def common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convs=st.lists(conversations, min_size=1, max_size=4), num_blocks=st.sampled_from([12, 14, 64]))
def test_prefix_caching_changes_no_token(convs: list[Conversation], num_blocks: int) -> None:
    on = LLMEngine(FakeRunner(num_blocks=num_blocks, block_size=BLOCK_SIZE), CONFIG)
    off = LLMEngine(
        FakeRunner(num_blocks=num_blocks, block_size=BLOCK_SIZE), replace(CONFIG, enable_prefix_caching=False)
    )
    got, want = drive(on, convs), drive(off, convs)

    # by request id: the turns of different conversations may start in another order
    assert {i: (r.prompt, r.output, r.finish_reason) for i, r in got.items()} == {
        i: (r.prompt, r.output, r.finish_reason) for i, r in want.items()
    }
    for record in want.values():
        assert record.num_cached_tokens == 0
        if record.finish_reason is not FinishReason.INTERRUPTED:
            assert record.output == reference(record.prompt, record.max_tokens, CONFIG.max_model_len)

    earlier: list[Record] = []
    for record in sorted(got.values(), key=lambda r: r.submitted):
        cached = record.num_cached_tokens
        assert cached % BLOCK_SIZE == 0 and cached < len(record.prompt)
        shared = max(
            (common_prefix(record.prompt, [*e.prompt, *e.output]) for e in earlier if e.salt == record.salt),
            default=0,
        )
        assert cached <= shared, (record, shared)
        earlier.append(record)
        if cached:
            event("prefix cache hit")
            if cached > len(SYSTEM):
                event("hit past the shared system prompt")
        if record.keep_tokens is not None and record.keep_tokens % BLOCK_SIZE:
            event("abort cut inside a block")

    for engine in (on, off):
        stats = engine.stats()
        assert not engine.has_unfinished_requests()
        assert stats.num_free_blocks == num_blocks
        engine.pool.assert_consistent([])  # every reference count is back to 0
        if stats.num_preemptions:
            event("preempted")
    stats = on.stats()
    assert stats.num_prefix_cache_hits <= stats.num_prefix_cache_queries
    assert stats.num_prefix_cache_hits >= sum(r.num_cached_tokens for r in got.values())
    assert stats.num_cached_free_blocks == on.pool.num_cached_blocks
