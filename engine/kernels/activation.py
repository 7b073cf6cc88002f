"""Fused SiLU-and-multiply of the gated MLP (Shazeer 2020, SwiGLU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bargein.engine.kernels._triton import check_tensor, lazy_jit, next_power_of_2, tl


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference: ``silu(x[:, :I]) * x[:, I:]``.

    Args:
        x: ``[T, 2I]``, the fused gate and up projections.

    Returns:
        ``[T, I]``, a new tensor of ``x``'s dtype; ``x`` is not mutated.
    """
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@lazy_jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    x_row_stride,
    out_row_stride,
    inter_size,
    BLOCK_SIZE: tl.constexpr,
):
    """Program ``(row, j)``: ``out[row, cols] = silu(gate) * up`` on ``BLOCK_SIZE`` columns, in float32."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < inter_size
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + inter_size + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton ``silu(x[:, :I]) * x[:, I:]``; same contract as ``silu_and_mul_ref``.

    Raises:
        AssertionError: ``x`` not 2-D with an even, contiguous last dimension.
    """
    check_tensor("x", x, 2)
    num_tokens, width = x.shape
    assert width % 2 == 0, f"x's last dim {width} must be even (gate | up)"
    inter_size = width // 2
    out = torch.empty((num_tokens, inter_size), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or inter_size == 0:
        return out
    block_size = min(1024, next_power_of_2(inter_size))
    grid = (num_tokens, -(-inter_size // block_size))
    _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), inter_size, BLOCK_SIZE=block_size)
    return out
