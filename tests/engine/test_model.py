"""Our forward's logits equal transformers' for the same tokens.

Sequences go through the ModelRunner the way the scheduler drives it: prefill
in chunks across block boundaries, several sequences of different lengths in
one flat batch (decodes and prefill chunks mixed, given in mixed order), then
decode steps through the paged cache with scattered block ids.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from bargein.engine.model_runner import ModelRunner, SeqInput

ATOL = 1e-3
pytestmark = pytest.mark.slow  # loads the bundled model (or its tokenizer)


def _reference_logits(hf: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(input_ids=torch.tensor([tokens])).logits[0].float()


def _drive(
    runner: ModelRunner,
    hf: PreTrainedModel,
    seqs: list[tuple[int, list[int]]],
    seed: int = 0,
    chunks: tuple[int, ...] = (1, 7, 16, 5),
) -> int:
    """Run ``(prompt_len, tokens)`` sequences step by step; compare every sampled row.

    Each step every unfinished sequence adds a prefill chunk (sizes cycling
    over ``chunks``, capped at the prompt end) or one decode token of
    its fixed continuation. Returns the number of logit rows compared.
    """
    rng = random.Random(seed)
    free = list(range(runner.num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-len(t) // runner.block_size))] for _, t in seqs]
    want = [_reference_logits(hf, t) for _, t in seqs]
    done, compared = [0] * len(seqs), 0
    for step in range(10_000):
        batch, owners = [], []
        for i, (prompt_len, tokens) in enumerate(seqs):
            if done[i] == len(tokens):
                continue
            n = min(chunks[(step + i) % len(chunks)], prompt_len - done[i]) if done[i] < prompt_len else 1
            end = done[i] + n
            batch.append(
                SeqInput(
                    token_ids=tokens[done[i] : end],
                    start_pos=done[i],
                    block_table=tables[i],
                    sample=end >= prompt_len,
                )
            )
            owners.append((i, end))
            done[i] = end
        if not batch:
            return compared
        order = list(range(len(batch)))
        rng.shuffle(order)
        logits = runner.execute([batch[j] for j in order])
        rows = [owners[j] for j in order if batch[j].sample]
        assert logits.shape == (len(rows), runner.vocab_size) and logits.dtype == torch.float32
        for row, (i, end) in zip(logits, rows):
            torch.testing.assert_close(row, want[i][end - 1], atol=ATOL, rtol=0)
            compared += 1
    raise AssertionError("did not finish")


def _sequences(vocab: int, lengths: list[tuple[int, int]], seed: int) -> list[tuple[int, list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    return [(p, torch.randint(0, vocab, (p + d,), generator=gen).tolist()) for p, d in lengths]


def test_default_model_logits_match_transformers(model_runner_factory, hf_model, hf_tokenizer) -> None:
    runner = model_runner_factory(num_blocks=64)
    texts = ["Hi", "What is the capital of France?", "Write a haiku about the sea, the moon and a cat " * 3]
    seqs = []
    for text, num_decode in zip(texts, [2, 4, 3]):
        prompt = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        cont = hf_tokenizer.encode(" The answer is that Paris is lovely.")[:num_decode]
        seqs.append((len(prompt), list(prompt) + cont))
    assert _drive(runner, hf_model, seqs, chunks=(16, 23, 1, 40)) == 2 + 4 + 3 + 3


def test_one_chunk_prefill_then_greedy_decode_says_paris(model_runner_factory, hf_tokenizer) -> None:
    runner = model_runner_factory(num_blocks=8)
    prompt = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    table, out = [5, 2, 7, 0], []
    logits = runner.execute([SeqInput(token_ids=prompt, start_pos=0, block_table=table, sample=True)])
    for pos in range(len(prompt), len(prompt) + 8):
        out.append(int(logits.argmax(-1)))
        logits = runner.execute(
            [SeqInput(token_ids=[out[-1]], start_pos=pos, block_table=table, sample=True)]
        )
    assert hf_tokenizer.decode(out).startswith("The capital of France is Paris")


def test_runner_reports_its_pool(model_runner_factory) -> None:
    runner = model_runner_factory(num_blocks=10, block_size=4)
    assert (runner.num_blocks, runner.block_size) == (10, 4)
    assert runner.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert runner.vocab_size == 49152 and 2 in runner.eos_token_ids
    assert runner.device == torch.device("cpu")
    logits = runner.execute([SeqInput(token_ids=[1, 2, 3], start_pos=0, block_table=[3], sample=False)])
    assert logits.shape == (0, 49152)


def _tiny(arch: str) -> PreTrainedModel:
    common = dict(
        vocab_size=160,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    if arch == "llama-tied-mha":
        return LlamaForCausalLM(LlamaConfig(**{**common, "num_key_value_heads": 4}, tie_word_embeddings=True))
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    else:  # llama-attention-bias: biases on q, k, v and o
        model = LlamaForCausalLM(LlamaConfig(**common, attention_bias=True))
    for name, p in model.named_parameters():
        if name.endswith("proj.bias"):  # HF initialises biases to 0: make them matter
            torch.nn.init.normal_(p, std=0.5)
    return model


@pytest.mark.parametrize("arch", ["llama", "llama-tied-mha", "llama-attention-bias", "qwen2", "mistral"])
def test_tiny_architectures_match_transformers(
    arch: str, tmp_path: Path, model_runner_factory, hf_tokenizer
) -> None:
    hf = _tiny(arch).eval()
    hf.save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    runner = model_runner_factory(num_blocks=40, block_size=4, max_model_len=128, path=str(tmp_path))
    seqs = _sequences(160, [(3, 4), (21, 5), (9, 1), (1, 6), (40, 2)], seed=1)
    assert _drive(runner, hf, seqs, seed=2) == sum(d + 1 for d in (4, 5, 1, 6, 2))
