"""SmoothQuant (engine/model/smooth.py): the smoothed model is the same function
in fp32, and its int8 quantization is closer to fp32 than the unsmoothed one's."""

from __future__ import annotations

import math

import pytest
import torch

from bargein.engine.config import CacheConfig, ModelConfig
from bargein.engine.kernels import get_ops
from bargein.engine.model import smooth
from bargein.engine.model.linear import int8_kernel_available
from bargein.engine.model.llama import LlamaModel, fused_linear_weights, model_shape
from bargein.engine.model.loader import load_model
from bargein.engine.model_runner import ModelRunner, SeqInput

pytestmark = pytest.mark.slow

TEXT = (
    "Rivers carry water from the hills to the sea, and along the way they shape valleys, feed farms and cities. "
    * 3
)


def test_the_scale_is_the_papers_formula() -> None:
    x = torch.tensor([4.0, 1.0, 0.0])
    w = torch.tensor([[1.0, 2.0, 3.0], [-2.0, 0.5, 1.0]])
    s = smooth.smoothing_scale(x, w, alpha=0.5)
    # s_j = max|X_j|^a / max|W_j|^(1-a), clamped to [0.01, 100]
    assert torch.allclose(s, torch.tensor([math.sqrt(4.0) / math.sqrt(2.0), 1.0 / math.sqrt(2.0), 0.01]))


def test_cached_statistics_round_trip(tmp_path) -> None:
    stats = {(0, "qkv"): torch.rand(8), (3, "down"): torch.rand(4)}
    calls = []
    path = tmp_path / "cache" / "s.pt"
    first = smooth.cached_absmax(path, lambda: calls.append(1) or stats)
    again = smooth.cached_absmax(path, lambda: calls.append(1) or {})
    assert calls == [1] and first is stats
    assert again.keys() == stats.keys() and all(torch.equal(again[k], stats[k]) for k in stats)
    path.write_bytes(b"not a tensor file")  # unreadable: computed again
    assert smooth.cached_absmax(path, lambda: stats) is stats


@pytest.mark.parametrize(
    "saved",
    [
        [1.0, 2.0],  # loadable, not a dict: was an AttributeError at start-up
        {"0.qkv": torch.full((8,), float("nan"))},  # was NaN smoothing scales
        {"0.qkv": torch.full((8,), -1.0)},
        {"0.qkv": torch.ones(8, dtype=torch.float64)},
        {"0.qkv": torch.ones(2, 4)},
        {"0.attn": torch.ones(8)},
        {"x": torch.ones(8)},
        {"0.qkv": [1.0] * 8},
        {"0.qkv": torch.ones(576), "3.down": torch.ones(4)},  # another model's widths
        {"0.qkv": torch.ones(8)},  # an entry missing
    ],
)
def test_unsound_statistics_are_calibrated_again(tmp_path, saved: object) -> None:
    path = tmp_path / "s.pt"
    torch.save(saved, path)
    stats = {(0, "qkv"): torch.rand(8), (3, "down"): torch.rand(4)}
    assert smooth.cached_absmax(path, lambda: stats, {(0, "qkv"): 8, (3, "down"): 4}) is stats
    again = smooth.cached_absmax(path, lambda: {}, {(0, "qkv"): 8, (3, "down"): 4})  # saved over it
    assert all(torch.equal(again[k], stats[k]) for k in stats)


def test_statistics_others_can_write_are_not_trusted(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.pt"
    stats = {(0, "qkv"): torch.rand(8)}
    smooth.cached_absmax(path, lambda: stats)
    path.chmod(0o666)
    fresh = {(0, "qkv"): torch.rand(8)}
    assert smooth.cached_absmax(path, lambda: fresh) is fresh
    assert path.stat().st_mode & 0o777 == 0o644  # written again, by this user
    monkeypatch.setattr(smooth.os, "geteuid", lambda: 12345)  # another user's file
    assert smooth.cached_absmax(path, lambda: stats) is stats


def test_the_cache_key_follows_the_weights(tmp_path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    config = tmp_path / "config.json"
    config.write_text("{}")
    files = [str(weights), str(config)]
    first = smooth.calibration_key(files)
    assert smooth.calibration_key(files) == first
    weights.write_bytes(b"b" * 1000)  # new weights saved over the old, same size
    assert smooth.calibration_key(files) != first
    assert smooth.calibration_key([str(config)]) != smooth.calibration_key(files)
    with pytest.raises(TypeError, match="weight files"):
        smooth.calibration_key(str(tmp_path))  # a folder, as the key once took


@pytest.fixture(scope="module")
def loaded():
    return load_model(ModelConfig())


def _model(loaded, weights, fmt: str = "float32", **formats: str) -> LlamaModel:
    return LlamaModel(
        loaded.config,
        weights,
        get_ops("torch"),
        torch.float32,
        torch.device("cpu"),
        256,
        linear_format=fmt,
        **formats,
    )


def _logprobs(model: LlamaModel, runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Teacher-forced log-probs of every position of ``ids`` (one prefill)."""
    seq = SeqInput(token_ids=ids, start_pos=0, block_table=list(range(-(-len(ids) // 16))), sample=True)
    input_ids, positions, meta = runner._prepare([seq])
    with torch.inference_mode():
        hidden = model.forward(input_ids, positions, meta, runner.kv_caches)
        return torch.log_softmax(model.compute_logits(hidden).double(), -1)


def _kl(ref: torch.Tensor, other: torch.Tensor) -> float:
    return float((ref.exp() * (ref - other)).sum(-1).mean())


def test_smoothing_keeps_the_fp32_function_and_helps_int8(loaded) -> None:
    runner = ModelRunner(
        ModelConfig(quantization="none", linear_dtype="float32"),
        CacheConfig(num_blocks=16, block_size=16),
        256,
    )
    ids = runner.tokenizer(TEXT)["input_ids"][:160]
    fp32 = runner.model
    absmax = smooth.activation_absmax(fp32, lambda: _logprobs(fp32, runner, ids))
    shape = model_shape(loaded.config)
    assert absmax.keys() == {(i, k) for i in range(shape.num_layers) for k in smooth.LINEAR_KINDS}
    smoothed, smoothings = smooth.smooth_weights(loaded.weights, absmax, shape)
    # each fused linear's scales say what was done to it: W' = diag(1/out) W diag(in)
    for i in range(shape.num_layers):
        before, after = fused_linear_weights(loaded.weights, i), fused_linear_weights(smoothed, i)
        for kind in smooth.LINEAR_KINDS:
            scaling = smoothings[(i, kind)]
            expected = before[kind][0].float() * scaling.in_scale
            if scaling.out_scale is not None:
                expected = expected / scaling.out_scale[:, None]
            torch.testing.assert_close(after[kind][0], expected, rtol=1e-6, atol=0)
    ref = _logprobs(fp32, runner, ids)
    same = _logprobs(_model(loaded, smoothed), runner, ids)
    assert _kl(ref, same) < 1e-6  # the same function, up to fp32 rounding
    assert torch.equal(ref.argmax(-1), same.argmax(-1))
    if not int8_kernel_available():
        pytest.skip("torch without fbgemm")
    plain = _kl(ref, _logprobs(_model(loaded, loaded.weights, "int8", head_format="float32"), runner, ids))
    smoothed_kl = _kl(ref, _logprobs(_model(loaded, smoothed, "int8", head_format="float32"), runner, ids))
    print(f"int8 KL vs fp32: plain {plain:.4f}, smoothed {smoothed_kl:.4f}")
    assert smoothed_kl < 0.8 * plain
