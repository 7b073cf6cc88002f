"""The engine on the Triton backend: greedy tokens equal transformers' ``generate``.

A small randomly initialised Llama (2 layers, hidden 64, GQA 4/2, head dim
16) saved as a HF folder, with a word-level tokenizer of its 160 ids, runs
through ModelRunner and LLMEngine with ``backend="triton"``: on CPU tensors,
so every kernel runs in Triton's interpreter, or compiled on a GPU. Prompts straddle KV blocks and prefill
chunks, and join while others decode, so steps mix prefill chunks over cached
prefixes with batched decode.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.kernels import get_ops
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams

pytestmark = pytest.mark.slow

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors: the interpreter
MAX_TOKENS = 6
PROMPT_LENGTHS = [3, 9, 17, 30]  # block size 4, chunks of 16: inside, on and past boundaries
SCHEDULER = SchedulerConfig(
    max_num_seqs=4, max_num_batched_tokens=20, prefill_chunk_size=16, max_model_len=64
)


def _word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Token ``i`` is the word ``t{i}``; 1 is BOS, 2 is EOS."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    """A random Llama and its tokenizer in a HF folder; weights scaled up
    (``initializer_range``) so that greedy picks are not near-ties."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder)
    _word_tokenizer(config.vocab_size).save_pretrained(folder)
    model.generation_config.eos_token_id = None  # generate exactly MAX_TOKENS, like ignore_eos
    return folder, model


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 160, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _generate(model: PreTrainedModel, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def _run_engine(folder: Path, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Two prompts join at once, the others one step later, while the first decode."""
    runner = ModelRunner(
        ModelConfig(path=str(folder), device=DEVICE, backend="triton", dtype="float32"),
        CacheConfig(num_blocks=64, block_size=4),
        SCHEDULER.max_model_len,
    )
    assert runner.model.ops == get_ops("triton")
    engine = LLMEngine(runner, SCHEDULER)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = defaultdict(list)
    pending = list(enumerate(prompts))
    for _ in range(200):
        for i, prompt in pending[:2]:
            engine.add_request(
                EngineRequest(request_id=f"p{i}", prompt_token_ids=tuple(prompt), params=params)
            )
        pending = pending[2:]
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
        if not pending and not engine.has_unfinished_requests():
            return tokens
    raise AssertionError("the engine did not finish in 200 steps")


def test_triton_backend_greedy_equals_transformers(tiny_llama: tuple[Path, PreTrainedModel]) -> None:
    folder, model = tiny_llama
    prompts = _prompts()
    got = _run_engine(folder, prompts)
    for i, prompt in enumerate(prompts):
        assert got[f"p{i}"] == _generate(model, prompt), f"prompt {i} ({len(prompt)} tokens)"
