"""Prefix caching on the real model: the same greedy tokens with the cache on and off.

Two chat conversations of three turns each run side by side (steps mix
decodes with prefills that start after cached blocks). Each next turn's
prompt is the previous prompt, the part of the answer the user heard and the
next user message, at the token level; the second turn of each conversation
is barged in on after a few tokens and aborted with ``keep_tokens`` at the
heard prefix. The default model in the default format (int4 on x86; issue 37: the cache
must change no token in the arithmetic users run).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import PreTrainedTokenizerBase

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from tests.engine.conftest import RunnerFactory

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
CONFIG = SchedulerConfig(
    max_num_seqs=4, max_num_batched_tokens=96, prefill_chunk_size=48, max_model_len=MAX_MODEL_LEN
)
MAX_TOKENS = 20
BARGE_IN_AFTER = 9  # the second turn is cut after this many tokens...
HEARD = 5  # ...of which the user heard this many
CONVERSATIONS = [
    ["Name three colors.", "Why is the sky blue?", "And why are sunsets red?"],
    ["What is Python?", "Tell me about lists.", "How do I sort one?"],
]


def user_turn(tokenizer: PreTrainedTokenizerBase, text: str, *, first: bool) -> list[int]:
    """The template's tokens of one user message, then the assistant's header."""
    if first:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    suffix = f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(suffix, add_special_tokens=False))


class Player:
    """Plays the conversations on one engine, collecting every step's outputs."""

    def __init__(self, engine: LLMEngine, tokenizer: PreTrainedTokenizerBase) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.outputs: dict[str, list[int]] = {}
        self.cached: dict[str, int] = {}
        self.prompts: dict[str, list[int]] = {}

    def step(self) -> None:
        for out in self.engine.step():
            self.outputs[out.request_id].extend(out.new_token_ids)
            self.cached[out.request_id] = out.num_cached_tokens

    def barge_in(self, request_id: str) -> None:
        """Abort ``request_id`` once it said ``BARGE_IN_AFTER`` tokens, keeping what was heard."""
        seq = self.engine.scheduler.get(request_id)
        if seq is not None and seq.num_output_tokens >= BARGE_IN_AFTER:
            keep = seq.num_prompt_tokens + HEARD
            self.engine.abort_request(request_id, FinishReason.INTERRUPTED, keep_tokens=keep)

    def play(self) -> None:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        context: list[list[int]] = [[] for _ in CONVERSATIONS]
        for turn in range(3):
            for c, conv in enumerate(CONVERSATIONS):
                context[c] = context[c] + user_turn(self.tokenizer, conv[turn], first=turn == 0)
                request_id = f"c{c}t{turn}"
                self.prompts[request_id] = context[c]
                self.outputs[request_id] = []
                self.engine.add_request(
                    EngineRequest(request_id=request_id, prompt_token_ids=tuple(context[c]), params=params)
                )
                self.step()  # staggered: the second conversation's prefill joins the first's decodes
            while self.engine.has_unfinished_requests():
                if turn == 1:
                    for c in range(len(CONVERSATIONS)):
                        self.barge_in(f"c{c}t{turn}")
                self.step()
            for c in range(len(CONVERSATIONS)):
                output = self.outputs[f"c{c}t{turn}"]
                context[c] = context[c] + output[: HEARD if turn == 1 else len(output)]


def test_greedy_tokens_are_the_same_with_the_prefix_cache_on_and_off(
    default_runner_factory: RunnerFactory, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    players = {}
    for caching in (True, False):
        runner = default_runner_factory(num_blocks=128, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
        engine = LLMEngine(runner, replace(CONFIG, enable_prefix_caching=caching))
        players[caching] = player = Player(engine, hf_tokenizer)
        player.play()
        assert engine.stats().num_free_blocks == 128
        engine.pool.assert_consistent([])
    on, off = players[True], players[False]
    assert on.prompts == off.prompts
    assert on.outputs == off.outputs
    assert all(len(out) == (BARGE_IN_AFTER if "t1" in rid else MAX_TOKENS) for rid, out in on.outputs.items())
    assert set(off.cached.values()) == {0}
    for request_id, cached in on.cached.items():
        prompt = on.prompts[request_id]
        assert cached % BLOCK_SIZE == 0 and cached < len(prompt)
        if request_id.endswith("t0"):
            continue  # the conversations share only the template's system prompt
        # a later turn reuses all its previous turn's full blocks (the heard part, after a barge-in)
        previous = request_id[:-1] + str(int(request_id[-1]) - 1)
        prev_tokens = on.prompts[previous] + on.outputs[previous]
        kept = len(on.prompts[previous]) + (HEARD if previous.endswith("t1") else MAX_TOKENS - 1)
        assert prompt[:kept] == prev_tokens[:kept]
        assert cached == kept // BLOCK_SIZE * BLOCK_SIZE, request_id
    stats = on.engine.stats()
    assert stats.num_prefix_cache_hits == sum(on.cached.values())
    assert stats.num_prefix_cache_queries == sum(len(p) for p in on.prompts.values())


@pytest.mark.parametrize("prompt_len", [BLOCK_SIZE + 1, 2 * BLOCK_SIZE, 2 * BLOCK_SIZE + 1, 100])
def test_a_repeated_prompt_continues_the_same_after_its_cached_blocks(
    default_runner_factory: RunnerFactory, prompt_len: int
) -> None:
    # A hit that leaves one token to compute runs it through the decode kernel
    # at position prompt_len - 1 (17, 33); longer remainders through prefill.
    prompt = tuple(range(1000, 1000 + prompt_len))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine = LLMEngine(
        default_runner_factory(num_blocks=64, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN), CONFIG
    )
    got = []
    for request_id in ("miss", "hit"):
        engine.add_request(EngineRequest(request_id=request_id, prompt_token_ids=prompt, params=params))
        outs = []
        while engine.has_unfinished_requests():
            outs.extend(engine.step())
        got.append(([t for o in outs for t in o.new_token_ids], outs[-1].num_cached_tokens))
    (miss, miss_cached), (hit, hit_cached) = got
    assert miss_cached == 0 and hit_cached == (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert hit == miss
