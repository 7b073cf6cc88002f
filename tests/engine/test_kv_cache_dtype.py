"""Which dtype the KV cache gets (``CacheConfig.dtype``, ``--kv-cache-dtype``)."""

from __future__ import annotations

import pytest
import torch

from bargein.engine.config import CacheConfig
from bargein.engine.model_runner import choose_kv_cache_dtype


@pytest.mark.parametrize(
    ("linear_format", "want"),
    [("int8", torch.bfloat16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)],
)
def test_auto_halves_the_cache_only_where_the_linears_are_not_exact(
    linear_format: str, want: torch.dtype
) -> None:
    """Exact fp32 keeps fp32 K/V (token for token with transformers)."""
    dtype, why = choose_kv_cache_dtype(
        "auto", device_type="cpu", backend="torch", model_dtype="float32", linear_format=linear_format
    )
    assert dtype == want and why.startswith("auto")


@pytest.mark.parametrize(
    ("device", "backend", "model_dtype"),
    [("cuda", "triton", "float32"), ("cpu", "triton", "float32"), ("cuda", "triton", "bfloat16")],
)
def test_auto_is_the_model_dtype_off_the_cpu_kernels(device: str, backend: str, model_dtype: str) -> None:
    dtype, _ = choose_kv_cache_dtype(
        "auto", device_type=device, backend=backend, model_dtype=model_dtype, linear_format=model_dtype
    )
    assert dtype == getattr(torch, model_dtype)


def test_an_explicit_dtype_is_kept_where_the_kernels_read_it() -> None:
    pick = choose_kv_cache_dtype
    fp32 = dict(device_type="cpu", backend="torch", model_dtype="float32")
    assert pick("float32", **fp32, linear_format="int8")[0] == torch.float32
    assert pick("bfloat16", **fp32, linear_format="float32")[0] == torch.bfloat16
    cuda = dict(device_type="cuda", backend="triton", model_dtype="float16")
    assert pick("float16", **cuda, linear_format="float16")[0] == torch.float16


@pytest.mark.parametrize(
    ("requested", "device", "backend", "model_dtype"),
    [
        ("bfloat16", "cuda", "triton", "float32"),  # Triton reads K/V in the query's dtype
        ("float16", "cpu", "torch", "float32"),  # numba reads float32 or bfloat16 only
        ("float32", "cuda", "triton", "bfloat16"),
    ],
)
def test_a_dtype_no_kernel_reads_is_refused_with_the_way_out(
    requested: str, device: str, backend: str, model_dtype: str
) -> None:
    with pytest.raises(ValueError, match="use auto or the model dtype"):
        choose_kv_cache_dtype(
            requested, device_type=device, backend=backend, model_dtype=model_dtype, linear_format=model_dtype
        )


def test_cache_config_names_the_allowed_dtypes() -> None:
    with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
        CacheConfig(dtype="fp8")  # type: ignore[arg-type]
