"""Symmetric per-output-channel int8 quantization of a weight matrix.

One scale per output channel, its absmax over ``qmax``: the W8A8 layers
(``linear.Int8Linear``) quantize with it, and the W8A16 head
(``weight_only.Int8WeightLinear``) starts from the same scale, so both
formats share one definition without either layer module importing the other.
"""

from __future__ import annotations

import torch


def weight_scale_per_channel(weight: torch.Tensor, qmax: int = 127) -> torch.Tensor:
    """``[out]`` fp32: each output channel's absmax / ``qmax`` (the step of
    symmetric int8, 127, or of its 7-bit subset, 63)."""
    return (weight.abs().amax(dim=1) / float(qmax)).clamp_min(1e-12).float()


def quantize_weight_per_channel(weight: torch.Tensor, qmax: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``(q [out, in] int8, scale [out] fp32)``,
    ``weight ~= q * scale[:, None]``, ``q`` in [-qmax, qmax]."""
    scale = weight_scale_per_channel(weight, qmax)
    q = torch.round(weight / scale[:, None]).clamp_(-qmax, qmax).to(torch.int8)
    return q, scale
