"""Scatter the step's keys and values into the paged KV cache."""

from __future__ import annotations

import torch

from bargein.engine.kernels._triton import check_tensor, lazy_jit, next_power_of_2, tl


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Torch reference: ``cache[slot // block_size, slot % block_size] = x``.

    Args:
        k, v: ``[T, Hk, D]`` this step's keys and values.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]``, written in place.
        slot_mapping: ``[T]`` int64, ``block_id * block_size + offset``.
    """
    num_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


@lazy_jit
def _write_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_token_stride,
    k_head_stride,
    v_token_stride,
    v_head_stride,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    num_heads,
    head_dim,
    block_size,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per token: copy its ``[Hk, D]`` key and value to ``slot_mapping[token]``."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (dims < head_dim)
    dst = (slot // block_size) * cache_block_stride + (slot % block_size) * cache_slot_stride
    dst += heads * cache_head_stride + dims
    k = tl.load(k_ptr + token * k_token_stride + heads * k_head_stride + dims, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + token * v_token_stride + heads * v_head_stride + dims, mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton scatter of keys and values into their slots; same contract as ``write_kv_cache_ref``.

    Raises:
        AssertionError: mismatched shapes, a ``slot_mapping`` that is not
            int64, or K and V caches with different strides.
    """
    check_tensor("k", k, 3)
    check_tensor("v", v, 3)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4, k_cache.dtype)
    check_tensor("slot_mapping", slot_mapping, 1, torch.int64)
    num_tokens, num_heads, head_dim = k.shape
    assert v.shape == k.shape, f"v {tuple(v.shape)} != k {tuple(k.shape)}"
    assert k_cache.shape[2:] == (num_heads, head_dim), f"cache {tuple(k_cache.shape)} vs k {tuple(k.shape)}"
    assert v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(), (
        "K and V caches must match"
    )
    assert slot_mapping.shape == (num_tokens,), f"slot_mapping {tuple(slot_mapping.shape)} != ({num_tokens},)"
    if num_tokens == 0:
        return
    _write_kv_cache_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_heads,
        head_dim,
        k_cache.shape[1],
        BLOCK_H=next_power_of_2(num_heads),
        BLOCK_D=next_power_of_2(head_dim),
    )
