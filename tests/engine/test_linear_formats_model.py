"""The bundled model in bf16 and int8 generates, and agrees with exact fp32.

Agreement is teacher-forced on fp32's own greedy continuation (32 tokens of
each prompt, decoded one row at a time): the share of steps whose argmax is
fp32's token. That does not compound after one differing token as free
greedy runs do. Measured here (4 prompts x 32 tokens): bf16 0.977, int8
0.891; asserted >= 0.95 and >= 0.85 (AGREEMENT_MIN).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from bargein.engine.config import CacheConfig, ModelConfig
from bargein.engine.model.linear import Bf16Linear, Int8Linear, Linear, cpu_has_bf16, int8_kernel_available
from bargein.engine.model_runner import ModelRunner, SeqInput

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Photosynthesis is the process by which plants",
    "To make a simple tomato sauce, start by",
    "The history of the bicycle begins in",
]
TOKENS = 32
# measured: bf16 0.977, int8 0.891 (of 128 steps); asserted a little lower
AGREEMENT_MIN = {"bfloat16": 0.95, "int8": 0.85}


def _runner(cfg: ModelConfig) -> ModelRunner:
    return ModelRunner(cfg, CacheConfig(num_blocks=32, block_size=16), 256)


@torch.inference_mode()
def _steps(runner: ModelRunner, prompt: list[int], forced: list[int] | None) -> list[int]:
    """Greedy argmax of each of TOKENS steps; fed ``forced`` tokens when given, else its own."""
    table = list(range(8))
    logits = runner.execute([SeqInput(token_ids=prompt, start_pos=0, block_table=table, sample=True)])
    out: list[int] = []
    for i in range(TOKENS):
        out.append(int(logits[0].argmax()))
        nxt = out[-1] if forced is None else forced[i]
        logits = runner.execute(
            [SeqInput(token_ids=[nxt], start_pos=len(prompt) + i, block_table=table, sample=True)]
        )
    return out


@pytest.fixture(scope="module")
def fp32_greedy(model_config: ModelConfig) -> tuple[ModelRunner, list[list[int]], list[list[int]]]:
    runner = _runner(model_config)
    prompts = [runner.tokenizer(p)["input_ids"] for p in PROMPTS]
    return runner, prompts, [_steps(runner, p, None) for p in prompts]


@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_format_generates_and_agrees_with_fp32(model_config: ModelConfig, fp32_greedy, fmt: str) -> None:
    if fmt == "int8" and not int8_kernel_available():
        pytest.skip("torch without fbgemm")
    cfg = replace(model_config, quantization="int8" if fmt == "int8" else "none", linear_dtype="bfloat16")
    runner = _runner(cfg)
    assert runner.linear_format == fmt
    kind = Int8Linear if fmt == "int8" else Bf16Linear
    assert isinstance(runner.model.layers[1].qkv, kind)
    if fmt == "int8":  # the head and the first and last layers stay in bf16 (or fp32 without it)
        keep = Bf16Linear if cpu_has_bf16() else Linear
        edges = (runner.model.lm_head, runner.model.layers[0].qkv, runner.model.layers[-1].down)
        assert all(isinstance(linear, keep) for linear in edges)
    else:
        assert isinstance(runner.model.layers[0].qkv, kind) and isinstance(runner.model.lm_head, kind)
    assert runner.model.embed.dtype == torch.float32  # the lookup keeps fp32
    _, prompts, want = fp32_greedy
    free = _steps(runner, prompts[0], None)
    assert len(free) == TOKENS and runner.tokenizer.decode(free[:3]).strip().startswith("Paris")
    same = sum(a == b for p, w in zip(prompts, want) for a, b in zip(_steps(runner, p, w), w))
    agreement = same / (len(prompts) * TOKENS)
    print(f"{fmt}: teacher-forced agreement with fp32 greedy {agreement:.3f}")
    assert agreement >= AGREEMENT_MIN[fmt]
