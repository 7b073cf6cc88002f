"""RMSNorm with an optional fused residual add.

Formula (Zhang & Sennrich 2019, as in HF ``LlamaRMSNorm``):
``out = (x + residual) / sqrt(mean((x + residual)**2) + eps) * weight``,
computed in float32 and cast back to ``x.dtype``.
"""

from __future__ import annotations

import torch


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of RMSNorm, fused with the residual add.

    Args:
        x: ``[T, H]`` activations.
        weight: ``[H]`` scale.
        eps: added to the mean square before the square root.
        residual: ``[T, H]`` or ``None``; added to ``x`` before the norm.

    Returns:
        ``(out [T, H], residual_out [T, H])``: the normed sum, and the sum
        itself (``x`` when ``residual`` is None), for the next residual add.
        Neither input is mutated.
    """
    residual_out = x if residual is None else x + residual
    h = residual_out.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight.float()).to(x.dtype), residual_out
