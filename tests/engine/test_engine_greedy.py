"""The engine's greedy tokens equal transformers' ``generate``, token for token.

Sixteen chat prompts of different lengths (shorter and longer than a 16-token
block and than the 32-token prefill chunk) arrive two per step, so steps mix
prefill chunks with decodes; then the same with a KV pool so small that
sequences get preempted and recomputed. The default model, fp32, with
prefix caching on (the default): the prompts share the template's system
prompt, so later ones start their prefill after cached blocks.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from tests.engine.conftest import RunnerFactory

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
MAX_MODEL_LEN = 256
CONFIG = SchedulerConfig(
    max_num_seqs=16, max_num_batched_tokens=96, prefill_chunk_size=32, max_model_len=MAX_MODEL_LEN
)
QUESTIONS = [
    "Hi!",
    "What is 2+2?",
    "Name a color.",
    "Say hello in French.",
    "What is the capital of Italy?",
    "Give me one word that rhymes with cat.",
    "Explain in one sentence what a CPU does.",
    "Write a haiku about the sea at night.",
    "List three fruits that are red, and say why you like each of them.",
    "What is the difference between a list and a tuple in Python? Answer briefly.",
    "Translate to Spanish: The weather is nice today and we are going to the beach.",
    "Tell me a short story about a robot who learns to paint, in exactly three sentences.",
    "Summarize the plot of a detective novel where the butler did not do it, but the "
    "gardener did, and the detective only found out because of a muddy boot print.",
    "You are planning a trip to Japan for two weeks in spring. Suggest an itinerary that "
    "covers Tokyo, Kyoto and Osaka, with one day trip from each city, and mention what food "
    "to try in each place. Keep it short.",
    "Here is a list of numbers: 4, 8, 15, 16, 23, 42. Compute their sum, their mean, and say "
    "which of them are prime. Then explain how you checked whether each number is prime, "
    "step by step, for someone who has never heard of prime numbers before.",
    "Write a polite email to a colleague asking them to review a pull request that changes "
    "the scheduler of an inference engine: it adds chunked prefill, preemption of the newest "
    "sequence when the KV cache runs out of blocks, and an abort path that frees blocks at "
    "the start of the next step. Ask for feedback on fairness and on the tests.",
]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    out = []
    for question in QUESTIONS:
        ids = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


@pytest.fixture(scope="module")
def expected(hf_model: PreTrainedModel, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, one prompt at a time."""
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            gen = hf_model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False
            )
            out.append(gen[0, len(prompt) :].tolist())
    return out


def run_staggered(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, list[RequestOutput]]:
    """Submit two prompts per step; step until every request finished."""
    outputs: dict[str, list[RequestOutput]] = defaultdict(list)
    pending = list(enumerate(prompts))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    steps = 0
    while pending or engine.has_unfinished_requests():
        for i, prompt in pending[:2]:
            engine.add_request(
                EngineRequest(request_id=f"p{i}", prompt_token_ids=tuple(prompt), params=params)
            )
        pending = pending[2:]
        for out in engine.step():
            outputs[out.request_id].append(out)
        steps += 1
        assert steps < 2000
    return outputs


def check(outputs: dict[str, list[RequestOutput]], expected: list[list[int]]) -> None:
    for i, want in enumerate(expected):
        outs = outputs[f"p{i}"]
        assert [t for o in outs for t in o.new_token_ids] == want, f"prompt {i}"
        assert sum(o.finished for o in outs) == 1 and outs[-1].finished
        assert outs[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_prompts_span_blocks_and_chunks(prompts: list[list[int]]) -> None:
    lengths = sorted(len(p) for p in prompts)
    assert len(set(lengths)) >= 12
    assert lengths[-1] > 3 * CONFIG.prefill_chunk_size and lengths[0] < 3 * 16


def test_greedy_equals_transformers_generate(
    model_runner_factory: RunnerFactory, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    engine = LLMEngine(model_runner_factory(num_blocks=256, max_model_len=MAX_MODEL_LEN), CONFIG)
    outputs = run_staggered(engine, prompts)
    check(outputs, expected)
    stats = engine.stats()
    assert stats.num_preemptions == 0 and stats.num_free_blocks == 256
    # prefix caching is on by default: later prompts reuse the chat template's system prompt
    assert stats.num_prefix_cache_hits > 0


def test_greedy_equals_transformers_generate_under_preemption(
    model_runner_factory: RunnerFactory, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    num_blocks = MAX_MODEL_LEN // 16  # room for one longest sequence only
    engine = LLMEngine(model_runner_factory(num_blocks=num_blocks, max_model_len=MAX_MODEL_LEN), CONFIG)
    outputs = run_staggered(engine, prompts)
    check(outputs, expected)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == num_blocks
