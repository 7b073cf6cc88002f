"""Fused SiLU-and-multiply of the gated MLP (Shazeer 2020, SwiGLU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference: ``silu(x[:, :I]) * x[:, I:]``.

    Args:
        x: ``[T, 2I]``, the fused gate and up projections.

    Returns:
        ``[T, I]``, a new tensor of ``x``'s dtype; ``x`` is not mutated.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
