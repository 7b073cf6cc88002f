"""Issue 37 at the engine: a prefix-cache hit never changes a request's tokens or logits.

A request runs on a fresh engine (empty prefix cache), then on an engine
where an earlier request left some of its prompt's blocks cached: a prompt
sharing its first ``k`` tokens, for ``k`` on and off the 16-token block
boundaries and the whole prompt (only the last token recomputed), either
finished before the request arrives or still decoding beside it; and a next
turn whose cached blocks hold the first turn's answer, whose K/V was
computed by decode steps, not by a prefill; and a takeover's re-prefill of
the logged tokens, on a node with and without them cached. The prefill of
the uncached tail (chunked 1 to 512 tokens) attends over the cached blocks.
Its tokens, greedy and seeded, and its logits bit for bit must equal the
run without the cache, in the DEFAULT format (``quantization`` ``auto``),
like ``test_batch_invariance.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams
from tests.engine.test_batch_invariance import Recorder

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
MAX_TOKENS = 8
PROMPT = (
    "You are a careful assistant. The user is planning a walk along the coast at night and asks "
    "about the tides, the moon, the weather and what to bring. Answer in a friendly tone, with "
    "a short list of items and one sentence about safety near the water."
)
NEXT_TURN = "\nThank you. And what should I do if the fog comes in?"


def modes() -> dict[str, SamplingParams]:
    """Fresh params objects each call: ``Recorder`` tells requests apart by identity."""
    return {
        "greedy": SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        "seeded": SamplingParams(temperature=0.8, seed=77, max_tokens=MAX_TOKENS, ignore_eos=True),
    }


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    """The default model in the default format (auto), on the CPU's torch kernels."""
    config = ModelConfig(device="cpu", backend="torch", dtype="float32")
    return ModelRunner(
        config, CacheConfig(num_blocks=4 * MAX_MODEL_LEN // BLOCK_SIZE, block_size=BLOCK_SIZE), MAX_MODEL_LEN
    )


@pytest.fixture(scope="module")
def prompt(runner: ModelRunner) -> tuple[int, ...]:
    ids = tuple(runner.tokenizer(PROMPT)["input_ids"])
    assert len(ids) > 3 * BLOCK_SIZE + 1, len(ids)
    return ids


def scheduler(chunk: int) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_batched_tokens=max(256, chunk), prefill_chunk_size=chunk, max_model_len=MAX_MODEL_LEN
    )


def run(
    engine: LLMEngine, me: EngineRequest, warm: EngineRequest | None = None, *, beside: bool = False
) -> tuple[list[int], torch.Tensor, int]:
    """Add ``warm`` (if any) and step until it finished (``beside``: until its
    first token, so that its prompt's blocks are cached and it decodes beside
    me), add ``me``, step until idle. Returns me's output tokens, its logits
    ``[MAX_TOKENS, vocab]`` and its cached prompt tokens."""
    recorder = engine.sampler = Recorder(me.params)
    if warm is not None:
        engine.add_request(warm)
        first_token = False
        while engine.has_unfinished_requests() and not (beside and first_token):
            first_token = any(out.new_token_ids for out in engine.step())
        assert not beside or engine.has_unfinished_requests(), "warm must still decode beside me"
    engine.add_request(me)
    tokens: list[int] = []
    cached = -1
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == me.request_id:
                tokens.extend(out.new_token_ids)
                cached = out.num_cached_tokens
    logits = torch.stack([recorder.logits[p] for p in sorted(recorder.logits)])
    return tokens, logits, cached


Result = tuple[list[int], torch.Tensor]
_uncached: dict[tuple[tuple[int, ...], str], Result] = {}


def uncached(runner: ModelRunner, ids: tuple[int, ...], mode: str) -> Result:
    """The request alone on a fresh engine (nothing cached), default step
    limits; computed once per prompt and mode."""
    if (ids, mode) not in _uncached:
        _uncached[ids, mode] = _run_uncached(runner, ids, mode)
    return _uncached[ids, mode]


def _run_uncached(runner: ModelRunner, ids: tuple[int, ...], mode: str) -> Result:
    me = EngineRequest(request_id="me", prompt_token_ids=ids, params=modes()[mode])
    tokens, logits, cached = run(LLMEngine(runner, SchedulerConfig(max_model_len=MAX_MODEL_LEN)), me)
    assert cached == 0 and len(tokens) == MAX_TOKENS
    return tokens, logits


def assert_same(got: Result, want: Result) -> None:
    assert got[0] == want[0]
    differ = (got[1] != want[1]).any(dim=-1).nonzero().flatten().tolist()
    assert not differ, f"logits differ at output tokens {differ}"


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
@pytest.mark.parametrize(
    ("shared", "chunk", "beside"),
    [
        (16, 256, False),  # one whole block
        (23, 7, False),  # a block and a part: the part is recomputed
        (32, 1, False),
        (47, 16, True),  # one token short of three blocks, the other request still decoding
        (None, 33, False),  # the whole prompt: all its blocks but the last token's
        (None, 7, True),
        (40, 512, False),  # the tail in one chunk of up to 512
    ],
)
def test_a_cached_prefix_changes_no_token_nor_logit(
    runner: ModelRunner,
    prompt: tuple[int, ...],
    mode: str,
    shared: int | None,
    chunk: int,
    beside: bool,
) -> None:
    k = len(prompt) if shared is None else shared
    vocab = runner.vocab_size
    # a prompt that shares exactly k tokens, then goes its own way
    tail = tuple((prompt[j % len(prompt)] * 31 + 7) % (vocab - 1) + 1 for j in range(k, k + 20))
    warm_ids = prompt[:k] + (() if shared is None else tail)
    warm = EngineRequest(request_id="warm", prompt_token_ids=warm_ids, params=modes()[mode])
    me = EngineRequest(request_id="me", prompt_token_ids=prompt, params=modes()[mode])
    tokens, logits, cached = run(LLMEngine(runner, scheduler(chunk)), me, warm, beside=beside)
    want_cached = (min(k, len(prompt) - 1)) // BLOCK_SIZE * BLOCK_SIZE
    assert cached == want_cached
    assert_same((tokens, logits), uncached(runner, prompt, mode))


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_a_next_turn_over_a_cached_answer_changes_no_token_nor_logit(
    runner: ModelRunner, prompt: tuple[int, ...], mode: str
) -> None:
    """The first turn's answer was computed one token a step (decode); the
    second turn's prompt holds it, cached, and prefills the rest in chunks."""
    engine = LLMEngine(runner, scheduler(7))
    # an answer long enough to fill the prompt's last block and the next one
    params = replace(modes()[mode], max_tokens=2 * BLOCK_SIZE)
    first = EngineRequest(request_id="first", prompt_token_ids=prompt, params=params)
    engine.add_request(first)
    answer: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            answer.extend(out.new_token_ids)
    suffix = tuple(runner.tokenizer(NEXT_TURN, add_special_tokens=False)["input_ids"])
    ids = prompt + tuple(answer) + suffix
    me = EngineRequest(request_id="me", prompt_token_ids=ids, params=modes()[mode])
    tokens, logits, cached = run(engine, me)
    # the K/V of the answer's last token was never computed (it was never fed back)
    assert cached == (len(prompt) + len(answer) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert cached > len(prompt) // BLOCK_SIZE * BLOCK_SIZE, "cached blocks should hold decoded tokens"
    assert_same((tokens, logits), uncached(runner, ids, mode))


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
@pytest.mark.parametrize(("num_logged", "cached"), [(1, False), (5, True)])
def test_a_takeovers_re_prefill_continues_with_the_same_tokens_and_logits(
    runner: ModelRunner, prompt: tuple[int, ...], mode: str, num_logged: int, cached: bool
) -> None:
    """Another node continues a stream from its logged tokens: a new request
    whose prompt is the old prompt and the first ``num_logged`` output tokens,
    prefilled at once (on a node that has the old prompt cached, or not),
    where the owner computed those tokens' K/V one decode step at a time."""
    want_tokens, want_logits = uncached(runner, prompt, mode)
    engine = LLMEngine(runner, scheduler(16))
    if cached:  # the node answered the same prompt before
        run(engine, EngineRequest(request_id="earlier", prompt_token_ids=prompt, params=modes()[mode]))
    params = replace(modes()[mode], max_tokens=MAX_TOKENS - num_logged)
    me = EngineRequest(
        request_id="me", prompt_token_ids=prompt + tuple(want_tokens[:num_logged]), params=params
    )
    tokens, logits, num_cached = run(engine, me)
    # the earlier answer was the same: its blocks hold the logged tokens too
    assert num_cached == ((len(me.prompt_token_ids) - 1) // BLOCK_SIZE * BLOCK_SIZE if cached else 0)
    assert_same((tokens, logits), (want_tokens[num_logged:], want_logits[num_logged:]))
