"""Attention over the paged KV cache: batched decode and varlen prefill.

Scaled dot-product attention (Vaswani et al. 2017) where each sequence's keys
and values live in fixed-size blocks named by its block table (Kwon et al.
2023, vLLM PagedAttention). Grouped-query attention: query head ``h`` reads KV
head ``h // (Hq // Hk)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``cache[block_ids]`` flattened over blocks: ``[..., n * block_size, Hk, D]``."""
    out = cache[block_ids]
    return out.flatten(-4, -3)


def paged_attention_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference of decode attention: one query token per sequence.

    All sequences' blocks are gathered at once into ``[B, max_len, Hk, D]``
    and positions past each ``seq_len`` are masked (one batched SDPA call
    beats a Python loop over sequences on the CPU).

    Args:
        q: ``[B, Hq, D]``, the query of each sequence's newest token.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]``.
        block_tables: ``[B, max_blocks]`` int32; entries past a sequence's
            last block must be valid block ids (they are masked).
        seq_lens: ``[B]`` int32, tokens in the cache (including the new one).
        scale: softmax scale, usually ``D ** -0.5``.

    Returns:
        ``[B, Hq, D]`` in ``q.dtype``. No input is mutated.
    """
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    block_ids = block_tables[:, :num_blocks].long()
    k = _gather(k_cache, block_ids).transpose(1, 2)  # [B, Hk, L, D]
    v = _gather(v_cache, block_ids).transpose(1, 2)
    positions = torch.arange(k.shape[2], device=q.device)
    mask = (positions[None, :] < seq_lens[:, None]).view(q.shape[0], 1, 1, -1)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(2)


def _prefill_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal SDPA of ``q [n, Hq, D]`` over ``k, v [L, Hk, D]``, ``L >= n``."""
    n, seq_len = q.shape[0], k.shape[0]
    gqa = q.shape[1] != k.shape[1]
    qt, kt, vt = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if n == seq_len:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        # query j sits at position seq_len - n + j (bottom-right aligned causal mask)
        rows = torch.arange(seq_len - n, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows[:, None]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(0, 1)


def paged_attention_prefill_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference of varlen (chunked) prefill attention.

    Sequence ``s`` owns query rows ``query_start_loc[s]:query_start_loc[s+1]``;
    its query token ``j`` sits at position ``seq_lens[s] - query_len[s] + j``
    and attends to cache positions ``<=`` it (its cached prefix and the chunk,
    which must already be written to the cache).

    Args:
        q: ``[T, Hq, D]`` queries of all sequences, concatenated.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]``.
        block_tables: ``[S, max_blocks]`` int32.
        query_start_loc: ``[S + 1]`` int32 cumulative query lengths.
        seq_lens: ``[S]`` int32 total tokens of each sequence after the chunk.
        scale: softmax scale.

    Returns:
        ``[T, Hq, D]`` in ``q.dtype``. No input is mutated.
    """
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    out = torch.empty_like(q)
    for s, seq_len in enumerate(seq_lens.tolist()):
        block_ids = block_tables[s, : -(-seq_len // block_size)].long()
        k = _gather(k_cache, block_ids)[:seq_len]
        v = _gather(v_cache, block_ids)[:seq_len]
        out[starts[s] : starts[s + 1]] = _prefill_one(q[starts[s] : starts[s + 1]], k, v, scale)
    return out
