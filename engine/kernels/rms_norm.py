"""RMSNorm with an optional fused residual add.

Formula (Zhang & Sennrich 2019, as in HF ``LlamaRMSNorm``):
``out = (x + residual) / sqrt(mean((x + residual)**2) + eps) * weight``,
computed in float32 and cast back to ``x.dtype``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bargein.engine.kernels._triton import check_tensor, lazy_jit, next_power_of_2, tl


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
    if x.dtype == torch.float32:  # one fused ATen kernel, same formula: the fast CPU path
        return F.rms_norm(residual_out, (x.shape[-1],), weight, eps), residual_out
    h = residual_out.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight.float()).to(x.dtype), residual_out


@lazy_jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    x_row_stride,
    residual_row_stride,
    out_row_stride,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """One program per row: ``h = x + residual``, ``out = h * rsqrt(mean(h^2) + eps) * w``.

    The sum is rounded to ``x``'s dtype (it is the next layer's residual), the
    norm runs in float32, as in ``rms_norm_ref``.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = h.to(x.dtype)  # rounded like the reference's add in x's dtype
        tl.store(residual_out_ptr + row * out_row_stride + cols, h, mask=mask)
        h = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h * h, axis=0) / hidden_size + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * out_row_stride + cols, (h * inv_rms * weight).to(out_ptr.dtype.element_ty), mask=mask
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton RMSNorm with the residual add fused; same contract as ``rms_norm_ref``.

    Raises:
        AssertionError: shapes, dtypes or strides the kernel does not take.
    """
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1)
    num_tokens, hidden_size = x.shape
    assert weight.shape == (hidden_size,), f"weight {tuple(weight.shape)} != ({hidden_size},)"
    out = torch.empty((num_tokens, hidden_size), dtype=x.dtype, device=x.device)
    residual_out = x
    if residual is not None:
        check_tensor("residual", residual, 2, x.dtype)
        assert residual.shape == x.shape, f"residual {tuple(residual.shape)} != x {tuple(x.shape)}"
        residual_out = torch.empty_like(out)
    if num_tokens == 0:
        return out, residual_out
    _rms_norm_kernel[(num_tokens,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        x.stride(0) if residual is None else residual.stride(0),
        out.stride(0),
        hidden_size,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_SIZE=next_power_of_2(hidden_size),
    )
    return out, residual_out
