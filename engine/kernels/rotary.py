"""Rotary position embedding (Su et al. 2021, RoFormer), HF Llama layout.

HF Llama rotates the two halves of the head dimension (``rotate_half``):
``out = x * [cos, cos] + [-x2, x1] * [sin, sin]`` where ``x = [x1, x2]``.
``cos_sin_cache[p] = [cos(p * inv_freq), sin(p * inv_freq)]`` (``D/2`` each).
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
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
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


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
