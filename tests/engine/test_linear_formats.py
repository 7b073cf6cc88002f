"""The linear formats (fp32, bf16, int8 W8A8) against plain-torch references of the same
arithmetic, and the format ``auto`` picks from the CPU's flags.

Tolerances (measured on random shapes, stated relative to the reference's
norm, ``||y - ref|| / ||ref||``):

* int8: the reference is ``dequant(quant(x per token)) @ dequant(W per channel).T``
  with the same per-token u8 grid fbgemm uses (each row divided by its absmax,
  then one asymmetric grid over [min, max] of the whole tensor, 0 included,
  255 steps), and weight codes in [-127, 127] where the CPU has VNNI, in
  [-63, 63] without (AVX2's ``vpmaddubsw`` sums pairs of u8 x s8 products
  in int16, which 8-bit weights and activations overflow; the tests run
  what ``Int8Linear`` picks on this CPU). The grid's scale and zero point
  are torch's own (``_choose_qparams_per_tensor``, float32), and the GEMM is
  exact integer arithmetic, so the two agree to fp32 rounding, asserted
  < 1e-3. (An fp64 grid of our own rounded the zero point and ties
  differently: up to 1.5e-2 off.) Against the unquantized fp32 product the
  error is the int8 noise itself (inputs with a 20x outlier channel):
  measured <= 5.4e-2 with 8-bit weights, asserted < 8e-2; with 7-bit ones
  the weights' step doubles, asserted < 1.2e-1.
* bf16: the reference is ``x.bfloat16().float() @ W.bfloat16().float().T`` in
  fp32; oneDNN accumulates in fp32 and rounds the output to bf16 once
  (relative 2**-8 = 3.9e-3 per element): measured <= 2.0e-3, asserted < 4e-3, and
  elementwise within 1e-2 * |ref| + 1e-2 * rms(ref).
"""

from __future__ import annotations

import pytest
import torch

from bargein.engine.model.linear import (
    Bf16Linear,
    Int8Linear,
    Linear,
    choose_linear_format,
    int8_kernel_available,
    make_linear,
)
from bargein.engine.model.quantize import quantize_weight_per_channel

SHAPES = [(64, 96), (576, 576), (960, 576), (576, 1536), (3072, 576), (1000, 200)]
ROWS = [1, 2, 3, 8, 17, 32, 64]

needs_int8 = pytest.mark.skipif(not int8_kernel_available(), reason="torch without fbgemm")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _activation_grid_dequant(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize ``x [T, in]`` fp32 per tensor as fbgemm's dynamic
    linear does: u8, asymmetric, 0 in range, 255 steps, torch's own qparams
    (in float32, with its zero-point rounding)."""
    scale, zero = torch._choose_qparams_per_tensor(x, False)
    return torch.quantize_per_tensor(x, scale, zero, torch.quint8).dequantize()


def int8_reference(x: torch.Tensor, w: torch.Tensor, *, weight_bits: int) -> torch.Tensor:
    """``dequant(quant(x per token)) @ dequant(W per channel).T``, the product in
    fp64; weight codes in [-127, 127] at ``weight_bits`` 8, [-63, 63] at 7."""
    q, scale = quantize_weight_per_channel(w, 2 ** (weight_bits - 1) - 1)
    w_deq = q.double() * scale.double()[:, None]
    if x.shape[0] == 1:
        x_deq = _activation_grid_dequant(x).double()
    else:
        s = x.abs().amax(dim=-1, keepdim=True)
        x_deq = _activation_grid_dequant(x / s).double() * s.double()
    return (x_deq @ w_deq.T).float()


def _noise_bound(lin: Int8Linear) -> float:
    """The bound on int8's error against the fp32 product: 8e-2 at 8-bit weights, 1.2e-1 at 7."""
    return 8e-2 if lin.weight_bits == 8 else 1.2e-1


def _inputs(rows: int, n_in: int, n_out: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g)
    x[:, 0] *= 20.0  # an outlier channel, as real activations have
    if rows > 2:
        x[1] *= 50.0  # an outlier token: per-token scales keep the others' grid fine
    w = torch.randn(n_out, n_in, generator=g) * (n_in**-0.5)
    return x, w


def test_weight_quantization_is_symmetric_per_channel() -> None:
    w = torch.randn(16, 32)
    w[3] *= 100
    q, scale = quantize_weight_per_channel(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.equal(q.abs().amax(dim=1), torch.full((16,), 127, dtype=torch.int8))
    assert torch.allclose(q.float() * scale[:, None], w, atol=0, rtol=0) is False
    assert float(((q.float() * scale[:, None] - w).abs() / scale[:, None]).max()) <= 0.5 + 1e-5


@needs_int8
@pytest.mark.parametrize(("n_out", "n_in"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_int8_matches_quantized_reference(n_out: int, n_in: int, rows: int) -> None:
    x, w = _inputs(rows, n_in, n_out, seed=n_out * 1000 + n_in + rows)
    lin = Int8Linear(w)  # this CPU's activation grid
    y = lin(x)
    assert y.shape == (rows, n_out) and y.dtype == torch.float32
    assert _rel(y, int8_reference(x, w, weight_bits=lin.weight_bits)) < 1e-3
    assert _rel(y, x @ w.T) < _noise_bound(lin)


@needs_int8
@pytest.mark.parametrize("weight_bits", [7, 8])
def test_int8_reference_tells_the_grids_apart(weight_bits: int) -> None:
    """The 7- and 8-bit references differ by more than the tolerance, so the
    test above checks which grid this CPU's kernel runs."""
    x, w = _inputs(8, 576, 576, seed=5)
    other = int8_reference(x, w, weight_bits=8 if weight_bits == 7 else 7)
    assert _rel(int8_reference(x, w, weight_bits=weight_bits), other) > 1e-2


@needs_int8
@pytest.mark.parametrize("rows", [1, 8])
def test_int8_never_saturates_at_the_largest_codes(rows: int) -> None:
    """Every activation at the top of its u8 grid and every weight at its
    largest code: where ``vpmaddubsw``'s int16 pair sums could overflow
    (8-bit weights without VNNI), the product is still exact. (8-bit weights
    on this input were 49% off on an AVX2-only CPU.)"""
    x = torch.ones(rows, 576)
    x[:, 0] = 0.0  # the grid's 0, so every other entry quantizes to 255
    w = torch.ones(64, 576)
    w[:, 1] = -1.0  # symmetric codes: the largest magnitude is at both ends
    lin = Int8Linear(w)
    assert _rel(lin(x), int8_reference(x, w, weight_bits=lin.weight_bits)) < 1e-6
    assert _rel(lin(x), x @ w.T) < 1e-6


def test_int8_takes_only_7_or_8_bit_weights() -> None:
    with pytest.raises(ValueError, match="weight_bits"):
        Int8Linear(torch.ones(16, 32), weight_bits=4)


@needs_int8
def test_int8_bias_and_empty_input() -> None:
    x, w = _inputs(5, 64, 48, seed=1)
    b = torch.randn(48)
    lin = Int8Linear(w, b)
    assert _rel(lin(x), int8_reference(x, w, weight_bits=lin.weight_bits) + b) < 1e-3
    assert Int8Linear(w)(x[:0]).shape == (0, 48)


@needs_int8
def test_int8_rows_do_not_depend_on_their_neighbours_scale() -> None:
    """Per-token activation scales: a loud token leaves the quiet one's result as good as alone."""
    x, w = _inputs(2, 576, 576, seed=3)
    lin = Int8Linear(w)
    quiet_alone = lin(x[:1])
    loud = torch.cat([x[:1], x[1:] * 1000.0])
    assert _rel(lin(loud)[:1], x[:1] @ w.T) < 2 * max(_rel(quiet_alone, x[:1] @ w.T), 5e-3)


@pytest.mark.parametrize(("n_out", "n_in"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_bf16_matches_rounded_reference(n_out: int, n_in: int, rows: int) -> None:
    x, w = _inputs(rows, n_in, n_out, seed=n_out + n_in * 7 + rows)
    y = Bf16Linear(w)(x)
    ref = x.bfloat16().double() @ w.bfloat16().double().T
    assert y.shape == (rows, n_out) and y.dtype == torch.float32
    assert _rel(y.double(), ref) < 4e-3
    rms = float(ref.pow(2).mean().sqrt())
    assert torch.allclose(y.double(), ref, rtol=1e-2, atol=1e-2 * rms)


def test_bf16_bias_is_added_in_fp32() -> None:
    x, w, b = torch.randn(4, 32), torch.randn(16, 32), torch.randn(16)
    ref = x.bfloat16().double() @ w.bfloat16().double().T + b.double()
    assert _rel(Bf16Linear(w, b)(x).double(), ref) < 4e-3


def test_make_linear_formats() -> None:
    w = torch.randn(8, 16)
    assert isinstance(make_linear(w, None, "float32"), Linear)
    assert isinstance(make_linear(w, None, "bfloat16"), Bf16Linear)
    assert isinstance(make_linear(w.bfloat16(), None, "bfloat16"), Linear)  # a bf16 model stays as is
    if int8_kernel_available():
        assert isinstance(make_linear(w, None, "int8"), Int8Linear)


X86_VNNI = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"})
X86_AVXVNNI = frozenset({"avx2", "avx_vnni"})
X86_BF16_ONLY = frozenset({"avx2", "avx512f", "avx512_bf16"})
X86_OLD = frozenset({"avx2", "fma"})


def _pick(
    q: str,
    ld: str = "auto",
    *,
    flags=X86_VNNI,
    machine="x86_64",
    device="cpu",
    dtype="float32",
    int8=True,
    int4=True,
    blocks=False,
):
    return choose_linear_format(
        q,
        ld,
        device_type=device,
        dtype=dtype,
        flags=flags,
        machine=machine,
        int8_available=int8,
        int4_available=int4,
        blocks_available=blocks,
    )[0]


def test_auto_is_int4_on_the_block_kernels_on_every_x86_cpu_kind() -> None:
    """Issue 37: where the block kernels run, auto is int4 on them at every row
    count (one arithmetic per row), VNNI and bf16 CPUs included; an explicit
    linear_dtype is kept, and no other machine gets them."""
    for flags in (X86_VNNI, X86_AVXVNNI, X86_BF16_ONLY, X86_OLD):
        assert _pick("auto", flags=flags, blocks=True) == "int4"
        assert _pick("auto", flags=flags, blocks=True, int4=False, int8=False) == "int4"
        assert _pick("int4", flags=flags, blocks=True, int4=False) == "int4"
    assert _pick("auto", "float32", flags=X86_VNNI, blocks=True) == "float32"
    assert _pick("none", "auto", flags=X86_OLD, blocks=True) == "float32"
    assert _pick("auto", flags=frozenset({"asimd"}), machine="aarch64", blocks=True) == "float32"
    fmt, why = choose_linear_format(
        "auto", "auto", device_type="cpu", dtype="float32", flags=X86_VNNI, blocks_available=True
    )
    assert fmt == "int4" and "every row count" in why


def test_without_the_block_kernels_auto_picks_by_cpu_features() -> None:
    # smoothed int8 meets the KL target (0.008, docs/perf/quality.md) and is the
    # fastest at 1 to 32 sequences (docs/perf/formats.md) where fbgemm has AVX-512 VNNI
    assert _pick("auto", flags=X86_VNNI) == "int8"
    assert _pick("auto", flags=frozenset({"avx512_vnni"})) == "int8"
    assert _pick("auto", flags=X86_VNNI, int8=False) == "bfloat16"  # torch without fbgemm
    assert _pick("auto", "float32", flags=X86_VNNI) == "float32"  # a linear_dtype asked for
    assert _pick("auto", "bfloat16", flags=X86_VNNI) == "bfloat16"
    assert _pick("auto", flags=X86_BF16_ONLY) == "bfloat16"
    assert _pick("auto", flags=frozenset({"amx_bf16"})) == "bfloat16"
    # no avx512_vnni, no bf16: int8 would need 7-bit weights (mean KL 0.013);
    # int4 is 0.0016 and 1.6-3.2x fp32 at 1 to 8 sequences (docs/perf/formats-avx2.md)
    assert _pick("auto", flags=X86_OLD) == "int4"
    assert _pick("auto", flags=X86_AVXVNNI) == "int4"  # AVX2-width VNNI: not fbgemm's fast path
    assert _pick("auto", flags=X86_AVXVNNI, int8=False) == "int4"
    assert _pick("auto", flags=X86_OLD, int4=False) == "float32"  # torch without the kernels
    assert _pick("auto", "float32", flags=X86_OLD) == "float32"  # a linear_dtype asked for
    assert _pick("auto", flags=frozenset({"asimd", "bf16"}), machine="aarch64") == "float32"


def test_explicit_choices_and_exact_fp32() -> None:
    assert _pick("none", "float32") == "float32"
    assert _pick("auto", "float32", flags=X86_OLD) == "float32"
    assert _pick("auto", "bfloat16", flags=X86_OLD) == "bfloat16"
    assert _pick("none", "auto", flags=X86_VNNI) == "bfloat16"
    assert _pick("none", "bfloat16", flags=X86_OLD) == "bfloat16"
    assert _pick("int8", flags=X86_OLD) == "int8"  # runs, with 7-bit weights
    assert _pick("int4", flags=X86_VNNI) == "int4"  # asked for: any CPU with the kernels
    assert _pick("none", flags=X86_OLD) == "float32"  # never quantizes


def test_auto_keeps_todays_behaviour_on_cuda_and_non_fp32() -> None:
    assert _pick("auto", device="cuda") == "float32"
    assert _pick("auto", device="cuda", dtype="bfloat16") == "bfloat16"
    assert _pick("auto", dtype="bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="int8"):
        _pick("int8", device="cuda")
    with pytest.raises(ValueError, match="fbgemm"):
        _pick("int8", int8=False)
    with pytest.raises(ValueError, match="linear_dtype"):
        _pick("none", "bfloat16", device="cuda")
    with pytest.raises(ValueError, match="int4"):
        _pick("int4", device="cuda")
    with pytest.raises(ValueError, match="block kernels"):
        _pick("int4", int4=False)
    with pytest.raises(ValueError, match="quantization"):
        _pick("int2")


def test_the_reason_names_the_feature() -> None:
    fmt, why = choose_linear_format(
        "auto",
        "auto",
        device_type="cpu",
        dtype="float32",
        flags=X86_BF16_ONLY,
        machine="x86_64",
        int8_available=True,
        blocks_available=False,
    )
    assert fmt == "bfloat16" and "bf16" in why
