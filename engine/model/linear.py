"""Linear layers of the forward, in the weight format chosen at load.

Four formats (:data:`LinearFormat`); :func:`make_linear`
builds the right one and :func:`choose_linear_format` picks the format from
the config and the CPU's features.

``float32`` (:class:`Linear`): on the CPU, ``F.linear`` re-lays out the
weight for every small-batch GEMM; oneDNN can lay it out once at load
(``mkldnn._reorder_linear_weight``, what inductor's ``freezing=True`` does)
and then runs batched decode steps about 1.4-1.7x faster (measured here at 8
and 32 rows, fp32). At one row plain ``F.linear`` is as fast or faster, so
small inputs keep it; the price is a second copy of the weights.

``bfloat16`` (:class:`Bf16Linear`): the weight in bf16, oneDNN-prepacked; the
fp32 activation is cast to bf16 for the GEMM (fp32 accumulation inside
oneDNN) and the output cast back, the rest of the model stays fp32.

``int8`` (:class:`Int8Linear`): W8A8, per-output-channel symmetric int8
weights, dynamic per-token activation quantization, through fbgemm's
``quantized::linear_dynamic`` (u8 x s8 GEMM, VNNI ``vpdpbusd``).
``linear_dynamic`` quantizes its input with one (asymmetric u8) scale for the
whole tensor; dividing each row by its own absmax first (and multiplying the
output row back) makes that per-token: every row then spans the same [-1, 1]
grid of 255 steps, so one outlier token no longer coarsens its neighbours'
grid. A single row is per-token already and skips the two extra ops.
The model's int8 weights are SmoothQuant-smoothed first, with its head and
first and last layers kept in bf16 (``engine/model/smooth.py``,
``ModelRunner._smoothed_int8``): that brings its mean KL against fp32 from
0.030 to 0.008 nats per token, under the 0.01 that ``auto`` requires.

Kernel choice, measured on this machine kind (2 cores, AVX512-VNNI/AMX,
SmolLM2-135M: the 30 layers' four GEMMs plus the 49152-row head, ms per step,
2 threads, warm, best of 3; the machine was shared, so +-15%)::

    rows                                   1      8     32
    fp32 oneDNN prepacked                13.9   19.8   41.4
    bf16 oneDNN prepacked                 7.5    9.6   15.3
    int8 fbgemm linear_dynamic            3.9    5.8   15.9
    int8 onednn linear_dynamic            7.6    7.0   14.7
    int8 onednn qlinear_pointwise         10.0   11.8   18.2   (quantize in torch)
    int8 torch._int_mm + torch scales    15.5   19.1   26.2

fbgemm wins where it matters (one to a few rows; a voice user decodes alone)
and is level at 32 rows, so it is the int8 kernel.

``int4`` (``auto`` on every x86 CPU where the block kernels run: AVX2, FMA,
F16C and a C compiler): the checkpoint's own 4-bit weights and an 8-bit
head, the GGUF's Q4_1 and Q8_0 blocks on int8 activations
(``kernels/cpu_qblock``, llama.cpp's arithmetic), set up by ``ModelRunner``
at every row count: the activations are quantized per row and block of 32
and a row's float sums run in one order whatever the step's row count, so a
row's output is the same bits whatever shares its step (issue 37), which
neither fbgemm's dynamic int8 (one activation scale per tensor) nor
oneDNN's fp32 (its blocking varies with the rows) promise. Without the
block kernels, torch's W4A16 and W8A16 (``weight_only``) at a few rows and
fp32 above. Without VNNI, fbgemm's int16 pair sums need one operand in 7
bits (:class:`Int8Linear` takes the weights), and int8 then loses too much
(mean KL 0.013 against fp32; 0.024 with fbgemm's 7-bit activations
instead), while the int4 format is 0.0025 with the block kernels' int8
activations (0.0016 on torch's bf16 ones, docs/perf/quality.md).
"""

from __future__ import annotations

import contextlib
import functools
import platform
import warnings
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F

from bargein.engine.host import cpu_flags
from bargein.engine.kernels import cpu_qblock
from bargein.engine.model import weight_only
from bargein.engine.model.quantize import quantize_weight_per_channel

LinearFormat = Literal["float32", "bfloat16", "int8", "int4"]

# rows from which the prepacked fp32 GEMM wins (measured: slower at 1, faster at 8)
PACKED_MIN_ROWS = 4

# the flag fbgemm's VNNI kernels need (they are AVX-512; avx_vnni alone is AVX2 width)
FBGEMM_VNNI_FLAG = "avx512_vnni"
# bf16 dot products / tiles
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
INT4_WHY = (
    "the checkpoint's 4-bit weights and an 8-bit head (Q4_1 and Q8_0 on int8 activations at "
    "every row count where the block kernels run: one arithmetic per row; torch's kernels "
    "at a few rows and fp32 above elsewhere); mean KL vs fp32 0.0026"
)
# x86 CPUs where the block kernels (kernels/cpu_qblock, AVX2 + FMA + F16C) run
BLOCK_FLAGS = ("avx2", "fma", "f16c")


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear:
    """``y = x @ weight.T + bias`` for ``x [T, in]``, ``weight [out, in]``, in the weight's dtype.

    Args:
        weight: ``[out, in]``, kept as is for small inputs.
        bias: ``[out]`` or None.
        prepack: also keep a oneDNN-prepacked copy for inputs of at least
            PACKED_MIN_ROWS rows (CPU fp32 only; ignored elsewhere).
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(weight)
            if prepack and weight.dtype == torch.float32 and _can_pack(weight)
            else None
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.shape[0] >= PACKED_MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class Bf16Linear:
    """fp32 in and out, the GEMM in bf16: ``y = bf16(x) @ bf16(weight).T + bias``.

    Args:
        weight: ``[out, in]`` fp32; only a bf16 copy (prepacked on the CPU) is kept.
        bias: ``[out]`` or None, added in fp32.
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.float()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w) if _can_pack(w) and _bf16_gemm_ok() else None
        self.weight = w if self.packed is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.to(torch.bfloat16)
        if self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(xb, self.packed, None, "none", [], "")
        else:
            assert self.weight is not None
            y = F.linear(xb, self.weight)
        y = y.float()
        return y if self.bias is None else y + self.bias


def cpu_has_bf16() -> bool:
    """This x86 CPU has bf16 dot products (avx512_bf16 or amx_bf16), and torch's
    oneDNN uses them: bf16 GEMMs are native, not emulated."""
    return _is_x86(platform.machine()) and any(f in cpu_flags() for f in BF16_FLAGS) and _bf16_gemm_ok()


def _bf16_gemm_ok() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


@contextlib.contextmanager
def _quantized_engine(name: str) -> Iterator[None]:
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def int8_kernel_available() -> bool:
    """fbgemm's quantized ops are built into this torch (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class Int8Linear:
    """fp32 in and out, W8A8: int8 per-channel weights, per-token dynamic u8 activations.

    Without VNNI, fbgemm's AVX2 kernels multiply u8 activations by s8
    weights with ``vpmaddubsw``, which sums each pair of products in int16
    and saturates: 8-bit activations times 8-bit weights reach 2 * 255 *
    127 = 64770 > 32767. fbgemm's advice is 7-bit activations
    (``reduce_range``); here the weights take the 7-bit grid instead
    (codes in [-63, 63]: 2 * 255 * 63 = 32130 fits), which costs less
    quality: the smoothed model's mean KL against fp32 is 0.013 with 7-bit
    weights, 0.024 with 7-bit activations (docs/perf/quality.md), at the
    same speed (the same kernel).

    Args:
        weight: ``[out, in]`` fp32 (CPU); only the packed int8 copy is kept.
        bias: ``[out]`` or None, added in fp32 after the rescale.
        weight_bits: 8 (codes in [-127, 127]) or 7 ([-63, 63]); ``None``:
            8 where /proc/cpuinfo shows ``avx512_vnni``, 7 elsewhere
            (``avx_vnni`` alone does not count: fbgemm's VNNI kernels are AVX-512).

    Raises:
        ValueError: ``weight_bits`` is not 7, 8 or None.
    """

    __slots__ = ("packed", "bias", "weight_bits", "out_features")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, weight_bits: int | None = None
    ) -> None:
        if weight_bits is None:
            weight_bits = 8 if _fbgemm_has_vnni() else 7
        if weight_bits not in (7, 8):
            raise ValueError(f"weight_bits={weight_bits} must be 7 or 8")
        self.weight_bits = weight_bits
        q, scale = quantize_weight_per_channel(weight.float(), 2 ** (weight_bits - 1) - 1)
        zero = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # quantized tensors are deprecated as a user API; fbgemm's prepack still takes one
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
            with _quantized_engine("fbgemm"):
                self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.bias = None if bias is None else bias.float()
        self.out_features = q.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return x.new_zeros(0, self.out_features)
        if x.shape[0] == 1:
            y = torch.ops.quantized.linear_dynamic(x, self.packed)  # 8-bit activations
        else:
            s = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12)
            y = torch.ops.quantized.linear_dynamic(x / s, self.packed).mul_(s)
        return y if self.bias is None else y + self.bias


AnyLinear = Linear | Bf16Linear | Int8Linear


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    fmt: LinearFormat | str = "float32",
) -> AnyLinear:
    """The linear layer of format ``fmt`` over ``weight`` (already on its device, in the model dtype).

    ``fmt`` is what :func:`choose_linear_format` returned: a
    :data:`LinearFormat`, or the model dtype's name off the CPU's fp32 path.
    ``float32``, ``int4`` (its large steps; ``ModelRunner`` adds the small
    ones), a dtype name, or a weight not in fp32 keeps the weight's own
    dtype; ``bfloat16`` and ``int8`` convert a copy and take fp32 input.
    """
    if fmt == "int8":
        return Int8Linear(weight, bias)
    if fmt == "bfloat16" and weight.dtype == torch.float32:
        return Bf16Linear(weight, bias)
    return Linear(weight, bias)


@functools.cache
def _fbgemm_has_vnni() -> bool:
    """fbgemm runs its VNNI kernels here: they are AVX-512 (``avx512_vnni``, the
    flag torch's own ``is_cpu_support_vnni`` reads). With ``avx_vnni`` alone it
    runs its AVX2 kernels, whose int16 pair sums overflow at 8-bit weights
    and activations (:class:`Int8Linear` then takes 7-bit weights)."""
    return FBGEMM_VNNI_FLAG in cpu_flags()


def _is_x86(machine: str) -> bool:
    return machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def choose_linear_format(
    quantization: str,
    linear_dtype: str,
    *,
    device_type: str,
    dtype: str,
    flags: frozenset[str] | None = None,
    machine: str | None = None,
    int8_available: bool | None = None,
    int4_available: bool | None = None,
    blocks_available: bool | None = None,
    cache_dir: str | None = None,
) -> tuple[LinearFormat | str, str]:
    """``(format, why)`` of the model's linear layers.

    On the CPU with fp32 weights: ``quantization="int8"`` is int8, ``"int4"``
    int4; ``"auto"`` is int4 on every x86 CPU where the block kernels run
    (AVX2, FMA, F16C and a C compiler; ``kernels/cpu_qblock``): the
    checkpoint's 4-bit weights on int8 activations at every row count, so a
    row's output is the same bits whatever shares its step (issue 37,
    docs/design.md "Exact by default"), mean KL against fp32 0.0026
    (docs/perf/quality.md). That holds on AVX-512 VNNI and bf16 CPUs too,
    where ``auto`` was smoothed int8 or bf16: fbgemm's dynamic int8 takes one
    activation scale for the whole tensor (a row's arithmetic depends on its
    neighbours), and its 4-bit path ran only up to a few rows. Where the
    block kernels do not run, as before: int8 W8A8 (smoothed, 0.008) where
    the x86 CPU has avx512_vnni and torch has fbgemm; else bf16 where it has
    avx512_bf16 or amx_bf16; else int4 on torch's kernels (a few rows, fp32
    above); else ``linear_dtype``, whose ``"auto"`` is fp32 there. An
    explicit ``linear_dtype`` under ``auto`` is kept. Exact fp32 is
    ``quantization="none", linear_dtype="float32"``. Elsewhere (CUDA, or a
    model dtype other than fp32) ``auto`` keeps the model dtype, as before.
    ``flags``/``machine``/``int8_available``/``int4_available``/
    ``blocks_available`` default to this machine's (tests fake them); the
    block kernels are built under ``cache_root(cache_dir)``.

    Raises:
        ValueError: a format this device or dtype cannot run.
    """
    if quantization not in ("auto", "none", "int8", "int4"):
        raise ValueError(f"quantization={quantization!r} must be auto, none, int8 or int4")
    if linear_dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"linear_dtype={linear_dtype!r} must be auto, float32 or bfloat16")
    if device_type != "cpu" or dtype != "float32":
        if quantization in ("int8", "int4"):
            raise ValueError(f"quantization={quantization} needs device cpu and dtype float32")
        if linear_dtype not in ("auto", dtype):
            raise ValueError(f"linear_dtype={linear_dtype!r} needs device cpu and dtype float32")
        return dtype, f"{device_type} {dtype}: linears in the model dtype"
    flags = cpu_flags() if flags is None else flags
    machine = platform.machine() if machine is None else machine
    int8_ok = int8_kernel_available() if int8_available is None else int8_available
    if int4_available is None:
        int4_available = weight_only.int4_kernel_available() and weight_only.int8_weight_kernel_available()

    def blocks() -> bool:  # asked only where it decides: the first call compiles the kernels
        if not _is_x86(machine):
            return False
        if blocks_available is not None:
            return blocks_available
        return all(f in flags for f in BLOCK_FLAGS) and _blocks_build(cache_dir)

    if quantization == "int8":
        if not int8_ok:
            raise ValueError("quantization=int8 needs torch's fbgemm engine (x86 builds)")
        vnni = FBGEMM_VNNI_FLAG in flags
        why = (
            f"with {FBGEMM_VNNI_FLAG}"
            if vnni
            else f"no {FBGEMM_VNNI_FLAG}: 7-bit weights; mean KL vs fp32 0.013"
        )
        return "int8", f"quantization=int8 ({why})"
    if quantization == "int4":
        if not (int4_available or blocks()):
            raise ValueError(
                "quantization=int4 needs the block kernels (AVX2, FMA, F16C and a C compiler) "
                "or torch's CPU int4 and int8 weight-only kernels"
            )
        return "int4", f"quantization=int4 ({INT4_WHY})"
    bf16 = [f for f in BF16_FLAGS if f in flags] if _is_x86(machine) else []
    if quantization == "auto" and linear_dtype == "auto":
        if blocks():
            return "int4", f"auto: x86 CPU with {', '.join(BLOCK_FLAGS)} -> int4 ({INT4_WHY})"
        # int8 with AVX-512 VNNI: fbgemm's fast path (avx_vnni alone is AVX2 width,
        # and without VNNI int8 needs 7-bit weights: mean KL 0.013, over 0.01)
        if int8_ok and FBGEMM_VNNI_FLAG in flags and _is_x86(machine):
            return "int8", "auto: CPU with avx512_vnni -> int8 linears (smoothed; mean KL vs fp32 0.008)"
        if bf16:
            return "bfloat16", f"auto: CPU with {bf16[0]}, no avx512_vnni -> bf16 linears"
        if int4_available and _is_x86(machine):
            return "int4", f"auto: x86 CPU without avx512_vnni or bf16 dot products -> int4 ({INT4_WHY})"
    lead = "quantization=none" if quantization == "none" else "auto"
    if linear_dtype != "auto":
        return linear_dtype, f"{lead}, linear_dtype={linear_dtype}"
    if bf16:
        return "bfloat16", f"{lead}, CPU with {bf16[0]} -> bf16 linears"
    return "float32", f"{lead}, no bf16 dot products -> fp32 linears"


def _blocks_build(cache_dir: str | None) -> bool:
    """The block kernels build and load here (``kernels/cpu_qblock``, compiled on first call)."""
    return cpu_qblock.available(cache_dir)
