"""Rotary position embedding (Su et al. 2021, RoFormer), HF Llama layout.

HF Llama rotates the two halves of the head dimension (``rotate_half``):
``out = x * [cos, cos] + [-x2, x1] * [sin, sin]`` where ``x = [x1, x2]``.
``cos_sin_cache[p] = [cos(p * inv_freq), sin(p * inv_freq)]`` (``D/2`` each).
"""

from __future__ import annotations

import torch

from bargein.engine.kernels._triton import check_tensor, lazy_jit, next_power_of_2, tl


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos, sin: [T, 1, D/2]
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def rotary_embedding_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of rotary embedding on queries and keys.

    Args:
        q: ``[T, Hq, D]`` queries.
        k: ``[T, Hk, D]`` keys.
        positions: ``[T]`` int64 token positions.
        cos_sin_cache: ``[max_pos, D]`` float32, cos half then sin half.

    Returns:
        ``(q_out, k_out)``, new tensors of the input shapes and dtypes; the
        inputs are not mutated.
    """
    cos, sin = torch.index_select(cos_sin_cache, 0, positions).unsqueeze(1).chunk(2, dim=-1)
    # one rotation over q and k side by side: half the small ops of the CPU path
    qk = _rotate_ref(torch.cat((q, k), dim=1), cos, sin)
    return qk[:, : q.shape[1]], qk[:, q.shape[1] :]


def build_cos_sin_cache(
    max_pos: int, head_dim: int, inv_freq: torch.Tensor, attention_scaling: float = 1.0
) -> torch.Tensor:
    """Precompute ``[max_pos, head_dim]`` float32 ``[cos | sin]`` for positions.

    ``inv_freq`` (``[head_dim/2]``) comes from transformers' rope init for the
    model's rope type, so scaled variants (llama3, linear, ...) match HF.
    """
    pos = torch.arange(max_pos, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq.float())
    assert freqs.shape[1] * 2 == head_dim, (freqs.shape, head_dim)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_scaling


@lazy_jit
def _rotary_embedding_kernel(
    x_ptr,
    out_ptr,
    positions_ptr,
    cos_sin_ptr,
    x_token_stride,
    x_head_stride,
    out_token_stride,
    out_head_stride,
    cos_sin_row_stride,
    num_heads,
    half_dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per token, all heads: ``[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`` in float32."""
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token)
    dims = tl.arange(0, BLOCK_D)[None, :]
    heads = tl.arange(0, BLOCK_H)[:, None]
    mask = (heads < num_heads) & (dims < half_dim)
    cos = tl.load(cos_sin_ptr + pos * cos_sin_row_stride + dims, mask=dims < half_dim, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * cos_sin_row_stride + half_dim + dims, mask=dims < half_dim, other=0.0)
    src = x_ptr + token * x_token_stride + heads * x_head_stride + dims
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half_dim, mask=mask, other=0.0).to(tl.float32)
    dst = out_ptr + token * out_token_stride + heads * out_head_stride + dims
    tl.store(dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + half_dim, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def _rotate(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Launch the kernel on one of q or k: ``[T, H, D]`` in, a new ``[T, H, D]`` out."""
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    _rotary_embedding_kernel[(num_tokens,)](
        x,
        out,
        positions,
        cos_sin_cache,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        cos_sin_cache.stride(0),
        num_heads,
        head_dim // 2,
        BLOCK_H=next_power_of_2(num_heads),
        BLOCK_D=next_power_of_2(head_dim // 2),
    )
    return out


def rotary_embedding(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton rotary embedding of q and k; same contract as ``rotary_embedding_ref``.

    Raises:
        AssertionError: mismatched shapes, an odd head dim, positions not
            int64 or a cache not float32.
    """
    check_tensor("q", q, 3)
    check_tensor("k", k, 3)
    check_tensor("positions", positions, 1, torch.int64)
    check_tensor("cos_sin_cache", cos_sin_cache, 2, torch.float32)
    num_tokens, _, head_dim = q.shape
    assert head_dim % 2 == 0, f"head dim {head_dim} must be even"
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim, f"k {tuple(k.shape)} vs q {tuple(q.shape)}"
    assert positions.shape == (num_tokens,), f"positions {tuple(positions.shape)} != ({num_tokens},)"
    assert cos_sin_cache.shape[1] == head_dim, (
        f"cos_sin_cache {tuple(cos_sin_cache.shape)} vs head dim {head_dim}"
    )
    return _rotate(q, positions, cos_sin_cache), _rotate(k, positions, cos_sin_cache)
