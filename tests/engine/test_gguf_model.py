"""A GGUF a user brings, served from its blocks: Llama and Qwen2 files with
every block type, written in the test with the ``gguf`` package
(``loadtests/gguf_synth.py``: random valid blocks, 2 layers).

Two oracles: transformers' own GGUF loader (``from_pretrained(gguf_file=)``,
which dequantizes with the ``gguf`` package) for bargein's exact fp32 path,
which checks the names, the config and the llama q/k row order; and that fp32
path for the block kernels, which differ from it only by the int8 rounding
of their activations.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from bargein.engine.config import CacheConfig, ModelConfig
from bargein.engine.kernels import cpu_qblock
from bargein.engine.model.gguf_file import GgufError, read_gguf
from bargein.engine.model.loader import load_model
from bargein.engine.model_runner import ModelRunner, SeqInput
from loadtests.gguf_synth import SHAPES, tensor_types, write_gguf

pytestmark = pytest.mark.slow

# every kernel type, a part whose type differs from its fused neighbours'
# (concatenated), and F16 (requantized to Q8_0)
MIXES = {
    "tiny": {
        "blk.0.attn_q.weight": "Q5_K", "blk.0.attn_output.weight": "Q4_0",
        "blk.1.ffn_gate.weight": "Q8_0", "blk.1.ffn_up.weight": "Q8_0",
        "blk.1.attn_output.weight": "F16", "blk.1.ffn_down.weight": "Q4_1",
    },
    "tiny-qwen2": {"blk.0.ffn_up.weight": "Q5_K", "output.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0"},
}  # fmt: skip
PROMPT = list(range(100, 140))


@pytest.fixture(scope="module", params=sorted(MIXES))
def gguf_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    shape = SHAPES[request.param]
    path = tmp_path_factory.mktemp("gguf") / f"{request.param}.gguf"
    write_gguf(path, shape, {**tensor_types(shape, "q4_k_m"), **MIXES[request.param]}, seed=1)
    return path


def last_logits(path: Path, cache_dir: Path, quantization: str) -> torch.Tensor:
    runner = ModelRunner(
        ModelConfig(path=str(path), cache_dir=str(cache_dir), quantization=quantization),
        CacheConfig(num_blocks=16, block_size=16),
        256,
    )
    return runner.execute([SeqInput(token_ids=PROMPT, start_pos=0, block_table=[0, 1, 2], sample=True)])[0]


def test_the_fp32_path_is_transformers_on_the_same_file(gguf_path: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    with torch.no_grad():
        want = model.eval()(torch.tensor([PROMPT])).logits[0, -1]
    got = last_logits(gguf_path, tmp_path, "none")
    assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max())


@pytest.mark.skipif(not cpu_qblock.available(), reason=f"no block kernels: {cpu_qblock.unavailable_reason()}")
def test_the_block_path_runs_the_files_own_types(
    gguf_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bargein.engine.model_runner"):
        blocks = last_logits(gguf_path, tmp_path, "auto")
    built = next(r.getMessage() for r in caplog.records if "the GGUF's own blocks" in r.getMessage())
    for kind in ("Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q8_0"):
        assert f"x {kind}" in built, built
    if "qwen2" not in gguf_path.name:
        assert "x F16 as Q8_0" in built and "x Q4_1" in built, built
    exact = last_logits(gguf_path, tmp_path, "none")
    cosine = torch.nn.functional.cosine_similarity(blocks, exact, dim=0)
    assert cosine > 0.999, f"cosine {float(cosine):.5f} against the fp32 path"
    assert int(blocks.argmax()) == int(exact.argmax())


def test_no_weights_are_cached(gguf_path: Path, tmp_path: Path) -> None:
    loaded = load_model(ModelConfig(path=str(gguf_path), cache_dir=str(tmp_path)))
    cached = sum(f.stat().st_size for f in Path(loaded.folder).iterdir())
    assert cached < 10 * 2**20 and not list(Path(loaded.folder).glob("*.safetensors"))


def test_a_truncated_or_foreign_file_is_a_clear_error(gguf_path: Path, tmp_path: Path) -> None:
    data = gguf_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(GgufError, match="runs past the end of the file"):
        read_gguf(cut)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + data[4:100])
    with pytest.raises(GgufError, match="not a GGUF file"):
        load_model(ModelConfig(path=str(foreign), cache_dir=str(tmp_path)))


def test_an_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'mamba'"):
        load_model(ModelConfig(path=str(path), cache_dir=str(tmp_path)))
