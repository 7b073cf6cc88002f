"""Scatter the step's keys and values into the paged KV cache."""

from __future__ import annotations

import torch


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
