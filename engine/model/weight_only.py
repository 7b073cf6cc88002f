"""4-bit weights for decode steps of a few rows (CPU).

At one to four rows a decode step's GEMMs read every weight once and do
little arithmetic on it, so their time is the bytes read. The int8 path
reads a byte per weight; :class:`Int4Linear` reads half that, through
torch's ``_weight_int4pack_mm_for_cpu`` (W4A16: bf16 activations, int4
weights in groups of 32 along the input with a bf16 scale and zero each,
fp32 accumulation). Measured on this machine kind, the 30 layers' four
GEMMs of SmolLM2-135M, ms per step (2 threads, best of 9)::

    rows            1      2      4      6      8
    int8 fbgemm   10.2   14.4   11.5   13.0   19.4
    int4 (bf16)    7.0    8.9    8.7   14.9   18.7

so :class:`RowSplitLinear` runs int4 up to :data:`MAX_ROWS` rows and int8
above. In whole decode steps, the two alternating in one process (medians,
``OMP_WAIT_POLICY=PASSIVE``): 27.3 -> 22.0 ms at one sequence, 44.0 -> 32.8
ms at four; from 5 to 8 rows the two measured level, at 10 int8 was faster.
The same kernel with fp16 activations was 40-100x slower here.

The default model's layers are Q4_1 in its GGUF (llama.cpp: blocks of 32
weights along the input, ``w = d * q + m``, ``q`` in 0..15, fp16 ``d`` and
``m``). :func:`quantize_groups` quantizes the same way, min/max per group,
so on those weights it finds the file's own ``q`` again: the 4-bit path holds
the checkpoint's weights, up to the bf16 rounding of each group's scale and
zero. The int8 model is SmoothQuant-smoothed (``smooth.py``), and smoothed
weights are no longer Q4_1: :class:`Int4Linear` quantizes the checkpoint's
weight and applies the smoothing around the GEMM instead (the input
scale on the activation, the output scale folded into the group scales).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bargein.engine.kernels.activation import silu_and_mul_ref
from bargein.engine.model.quantize import weight_scale_per_channel

GROUP_SIZE = 32  # weights per scale and zero, along the input (Q4_1's block)
MAX_ROWS = 4  # rows up to which int4 beats int8 here (the table above)
# Rows up to which int4 beats fp32 (the int4 format, on CPUs without
# avx512_vnni or bf16 dot products). The 30 layers' four GEMMs, ms per step on
# an AVX2-only AMD EPYC (2 threads, best of 7; fp32 prepacked from 4 rows):
#   rows     1     2     4     6     8    12    16    32
#   fp32   60.3  99.2  53.1  55.0  60.6  68.1  78.3  97.0
#   int4   12.8  16.0  24.9  42.7  40.7  56.6  77.3 156.0
FP32_MAX_ROWS = 12
# Rows up to which the int8 weight-only head beats fp32 there (49152 x 576):
#   rows                     1     2     4     8    12
#   fp32                  18.3  34.4  12.0  13.3  14.8
#   int8 (bf16 x)          5.4   5.9   6.7  12.9  19.9
HEAD_MAX_ROWS = 4
# The block kernels (kernels/cpu_qblock.py: Q4_1 layers, Q8_0 head, int8
# activations, blocks interleaved 8 to a vector, channels in tiles of 32) run
# every step, whatever its row count: a row's output is then the same bits
# whatever shares its step (issue 37; tests/engine/test_cpu_qblock.py), which a
# cut-over to fp32 above some row count would break. They beat prepacked fp32
# at every row count measured. The four GEMMs as above, then the head (49152 x
# 576), one run on 2026-12-03:
#   rows         8     16     32     64    128    256    384    512
#   fp32       34.7   43.5   65.8  108.4  193.3  372.6  616.8  782.6
#   Q4_1       10.1   15.8   29.7   61.2  128.8  261.6  481.3  636.8
#   head fp32   8.9   12.5   18.8   29.9   52.9  117.5
#   head Q8_0   3.6    7.1   13.7   21.6   52.2   89.3
# Above, in one run on a loaded machine (2027, medians of 3, random weights of
# the model's shapes): the layers at 512 / 1024 rows 0.86x / 0.72x fp32's time,
# the head at 256 / 512 rows 0.95x / 1.02x: nothing slower than the cut-over.
# torch's CPU int4 packing: 1 inner k-tile (its only CPU layout), output rows in 16s
_INNER_K_TILES = 1
_PACK_ROWS = 16


def int4_kernel_available() -> bool:
    """This torch has the CPU W4A16 kernels (torch >= 2.5)."""
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch, "_convert_weight_to_int4pack_for_cpu"
    )


def int8_weight_kernel_available() -> bool:
    """This torch has the CPU W8A16 kernel (``torch._weight_int8pack_mm``)."""
    return hasattr(torch, "_weight_int8pack_mm")


def exact_groups(
    weight: torch.Tensor, group_size: int = GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """:func:`quantize_groups` of ``weight [out, in]`` where :class:`Int4Linear`
    takes it (``out`` a multiple of 16, ``in`` of ``group_size``: torch's
    packing) and it is 4-bit already, min/max in groups along the input (a
    Q4_1 checkpoint, dequantized): the groups give it back up to fp32
    rounding, so the 4-bit path costs it no quality. None otherwise."""
    out_features, in_features = weight.shape
    if out_features % _PACK_ROWS or in_features % group_size:
        return None
    q, scale, minimum = quantize_groups(weight, group_size)
    groups = weight.float().reshape(*scale.shape, group_size)
    back = q.reshape(groups.shape) * scale[..., None] + minimum[..., None]
    # fp32 rounding of q * d + m is ~1e-7 of a group's step; 1e-3 of a step leaves no doubt
    if not bool(((back - groups).abs() <= 1e-3 * scale[..., None] + 1e-30).all()):
        return None
    return q, scale, minimum


def holds_exactly(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
    """:func:`exact_groups` finds ``weight``'s 4-bit groups: the 4-bit path holds it exactly."""
    return exact_groups(weight, group_size) is not None


def quantize_groups(
    weight: torch.Tensor, group_size: int = GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit quantization in groups along the input, as llama.cpp's Q4_1.

    Args:
        weight: ``[out, in]`` fp32, ``in`` a multiple of ``group_size``.

    Returns:
        ``(q [out, in] int32 in 0..15, scale [out, in / group] fp32,
        minimum [out, in / group] fp32)`` with ``weight ~= q * scale + minimum``
        per group; each group's smallest weight has ``q = 0`` and its largest
        ``q = 15`` (llama.cpp's ``quantize_row_q4_1``).

    Raises:
        ValueError: ``in`` is not a multiple of ``group_size``.
    """
    out_features, in_features = weight.shape
    if in_features % group_size:
        raise ValueError(f"in_features={in_features} is not a multiple of group_size={group_size}")
    groups = weight.float().reshape(out_features, in_features // group_size, group_size)
    minimum = groups.amin(-1)
    scale = (groups.amax(-1) - minimum) / 15.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: q = 0
    q = torch.round((groups - minimum[..., None]) / safe[..., None]).clamp_(0, 15).to(torch.int32)
    return q.reshape(out_features, in_features), scale, minimum


class Int4Linear:
    """fp32 in and out: ``y = (x * in_scale) @ W4^T / out_scale + bias``, W4A16.

    ``W4`` is ``weight`` quantized by :func:`quantize_groups`; the GEMM runs
    in bf16 with fp32 accumulation (``torch._weight_int4pack_mm_for_cpu``).
    With ``in_scale`` and ``out_scale`` it computes SmoothQuant's smoothed
    linear, ``diag(1/out_scale) @ W @ diag(in_scale)``, from the unsmoothed
    ``weight`` (``smooth.Smoothing``).

    Args:
        weight: ``[out, in]`` fp32 (CPU), ``out`` a multiple of 16 and ``in``
            of GROUP_SIZE; only the packed 4-bit copy is kept.
        bias: ``[out]`` or None, added in fp32 (as the smoothed model has it).
        in_scale: ``[in]`` fp32 or None: multiplies the input.
        out_scale: ``[out]`` fp32 or None: divides the output (folded into
            the group scales and zeros).

    Raises:
        ValueError: ``out`` is not a multiple of 16 or ``in`` of GROUP_SIZE.
    """

    __slots__ = ("packed", "scales_and_zeros", "bias", "in_scale")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        in_scale: torch.Tensor | None = None,
        out_scale: torch.Tensor | None = None,
    ) -> None:
        if weight.shape[0] % _PACK_ROWS:
            raise ValueError(f"out_features={weight.shape[0]} is not a multiple of {_PACK_ROWS}")
        self._pack(*quantize_groups(weight), bias, in_scale, out_scale)

    @classmethod
    def from_groups(
        cls,
        groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None = None,
        *,
        in_scale: torch.Tensor | None = None,
        out_scale: torch.Tensor | None = None,
    ) -> Int4Linear:
        """The layer over ``groups``, what :func:`quantize_groups` (or
        :func:`exact_groups`) returned for its weight, without quantizing again."""
        layer = cls.__new__(cls)
        layer._pack(*groups, bias, in_scale, out_scale)
        return layer

    def _pack(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        minimum: torch.Tensor,
        bias: torch.Tensor | None,
        in_scale: torch.Tensor | None,
        out_scale: torch.Tensor | None,
    ) -> None:
        # torch's convention: w = (q - 8) * scale + zero, so zero = minimum + 8 * scale
        zero = minimum + 8.0 * scale
        if out_scale is not None:
            scale, zero = scale / out_scale[:, None], zero / out_scale[:, None]
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES)
        # [in / group, out, 2]: (scale, zero) per group and output channel
        self.scales_and_zeros = torch.stack((scale.t(), zero.t()), -1).contiguous().to(torch.bfloat16)
        self.bias = None if bias is None else bias.float()
        self.in_scale = None if in_scale is None else in_scale.float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xb = (x if self.in_scale is None else x * self.in_scale).to(torch.bfloat16)
        y = torch._weight_int4pack_mm_for_cpu(xb, self.packed, GROUP_SIZE, self.scales_and_zeros).float()
        return y if self.bias is None else y + self.bias


class Int8WeightLinear:
    """fp32 in and out: ``y = x @ (q * scale)^T``, W8A16 (the output head of the int4 format).

    ``q`` is ``weight`` quantized symmetrically per output channel on the
    bf16-rounded scale the kernel reads (the int8 format's absmax / 127,
    ``quantize.weight_scale_per_channel``), so each weight is within half a
    step of its code (rounding on the fp32 scale and multiplying by its bf16
    copy would be up to 127 * 2**-8 steps off at the largest); the GEMM runs
    ``torch._weight_int8pack_mm`` on bf16 activations with fp32 accumulation
    and rounds its output to bf16 once. (On fp32 activations the same kernel
    was 1.4-27x slower than fp32's GEMM here: only bf16 in is fast.)

    Args:
        weight: ``[out, in]`` fp32 (CPU); only the int8 copy is kept.
    """

    __slots__ = ("q", "scale")

    def __init__(self, weight: torch.Tensor) -> None:
        w = weight.float()
        self.scale = weight_scale_per_channel(w).to(torch.bfloat16)
        self.q = torch.round(w / self.scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x.to(torch.bfloat16), self.q, self.scale).float()


class RowSplitLinear:
    """One linear, two kernels by input rows: ``small`` for up to ``max_rows``, ``large`` above.

    Both must compute the same function (up to their formats' rounding);
    ``[T, in] -> [T, out]`` fp32.
    """

    __slots__ = ("small", "large", "max_rows")

    def __init__(
        self,
        small: Callable[[torch.Tensor], torch.Tensor],
        large: Callable[[torch.Tensor], torch.Tensor],
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.small = small
        self.large = large
        self.max_rows = max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if 0 < x.shape[0] <= self.max_rows:
            return self.small(x)
        return self.large(x)

    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(silu_and_mul_ref(gate_up))`` for the down projection:
        ``[T, 2 * in] -> [T, out]``, the SiLU-mul inside ``small``'s kernel
        where it has a ``gated`` (``cpu_qblock.Q4_1Linear``), else a torch op."""
        if 0 < gate_up.shape[0] <= self.max_rows:
            fused = getattr(self.small, "gated", None)
            return fused(gate_up) if fused is not None else self.small(silu_and_mul_ref(gate_up))
        return self.large(silu_and_mul_ref(gate_up))
