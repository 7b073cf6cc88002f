"""Triton KV cache write against ``write_kv_cache_ref``."""

from __future__ import annotations

import pytest
import torch

from bargein.engine.kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref
from tests.engine.kernels.helpers import DTYPES


def _check(
    num_tokens: int, hk: int, head_dim: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Caches start NaN-filled: the written slots must hold exactly k and v, the others stay NaN."""
    gen = torch.Generator().manual_seed(num_tokens * 13 + block_size)
    num_blocks = -(-num_tokens // block_size) + 3
    k = torch.randn(num_tokens, hk, head_dim, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(num_tokens, hk, head_dim, generator=gen).to(dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens].to(device)
    shape = (num_blocks, block_size, hk, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    write_kv_cache(k, v, k_cache, v_cache, slots)
    write_kv_cache_ref(k, v, want_k, want_v, slots)
    torch.testing.assert_close(k_cache, want_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, want_v, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [1, 15, 16, 17])
@pytest.mark.parametrize("num_tokens,hk,head_dim", [(1, 1, 1), (19, 3, 64), (5, 2, 24)])
def test_write_kv_cache_matches_reference(
    num_tokens: int, hk: int, head_dim: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> None:
    _check(num_tokens, hk, head_dim, block_size, dtype, device)


def test_write_kv_cache_takes_strided_keys(device: torch.device) -> None:
    qkv = torch.randn(6, 5, 16, device=device)  # k and v as head slices of one projection
    k, v = qkv[:, 1:3], qkv[:, 3:5]
    k_cache, v_cache = torch.zeros(4, 4, 2, 16, device=device), torch.zeros(4, 4, 2, 16, device=device)
    slots = torch.tensor([3, 4, 5, 12, 0, 15], device=device)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache.view(-1, 2, 16)[slots], k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache.view(-1, 2, 16)[slots], v, atol=0, rtol=0)


def test_write_kv_cache_refuses_int32_slots(device: torch.device) -> None:
    k = torch.randn(2, 1, 8, device=device)
    cache = torch.zeros(2, 4, 1, 8, device=device)
    with pytest.raises(AssertionError, match="slot_mapping"):
        write_kv_cache(k, k, cache, cache.clone(), torch.zeros(2, dtype=torch.int32, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_write_kv_cache_large_shapes_on_gpu(dtype: torch.dtype, device: torch.device) -> None:
    _check(4099, 8, 128, 16, dtype, device)
