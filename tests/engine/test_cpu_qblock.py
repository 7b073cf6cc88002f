"""The block GEMMs (``kernels/cpu_qblock.c``: Q4_1, Q8_0, and GGUF's Q4_0, Q4_K,
Q5_K, Q6_K) against plain torch.

The reference does the same arithmetic in float64: each row of x quantized
to int8 per block of 32 on its absmax / 127 (round half to even), times the
dequantized weights. The kernel sums each block's integer products exactly
and accumulates in float32, so the two agree to float32 rounding. The
packed blocks are also checked byte for byte against the bundled GGUF's own.
The GGUF types' weights are random valid blocks (``loadtests/gguf_synth.py``)
dequantized by the ``gguf`` package, a decoder independent of the kernels'
layouts (``kernels/kquant_layout.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.kernels import cpu_qblock, kquant_layout
from bargein.engine.kernels.activation import silu_and_mul_ref
from bargein.engine.kernels.cpu_qblock import (
    BlockLinear,
    Q4_1Linear,
    Q8_0Linear,
    pack_q4_1,
    pack_q8_0,
    quantize_q8_0,
)
from bargein.engine.model.loader import default_model_path
from bargein.engine.model.weight_only import exact_groups, quantize_groups
from loadtests.gguf_synth import random_blocks

# Skipped only where the kernels are not expected to build (another CPU, no
# compiler: the engine then keeps torch's kernels by design). Where they should
# build, a failed build fails here instead of reading as "skipped" while the
# engine quietly falls back.
WHY_NOT_BUILDABLE = cpu_qblock.why_not_buildable()
pytestmark = pytest.mark.skipif(
    WHY_NOT_BUILDABLE is not None and not cpu_qblock.available(),
    reason=f"the block kernels cannot be built here: {WHY_NOT_BUILDABLE}",
)


def test_the_kernels_build_where_the_cpu_and_a_compiler_allow() -> None:
    assert cpu_qblock.available(), f"they should build here, but: {cpu_qblock.unavailable_reason()}"


# in / 32 blocks, in groups of 8 (super-blocks), 4, 2 and 1: 1, 2, 18 (8 + 8 + 2),
# 48 (six of 8), 3 (2 + 1), 5 (4 + 1), 1, 8, 10, 9, 7 (4 + 2 + 1), 15 (all four);
# rows: one pass of up to 8, and 2 or 3 passes; out: one tile of 32 channels
# or less, several, and a last one part full
SHAPES = [
    (16, 32, 1), (48, 64, 2), (960, 576, 1), (576, 1536, 3), (64, 96, 8), (40, 160, 9), (32, 32, 17),
    (24, 256, 4), (8, 320, 24), (960, 576, 13), (100, 288, 11), (72, 224, 5), (40, 480, 10),
]  # fmt: skip


def quantized_activations(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[rows, in]`` as the kernel sees it: int8 codes per block of 32 times their scale (float64)."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    scale = (blocks.abs().amax(-1).float() / 127).double()
    codes = torch.round(blocks / torch.where(scale > 0, scale, 1)[..., None])
    return (codes * scale[..., None]).reshape(x.shape)


def q4_1_weight(groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The weight the Q4_1 blocks hold: ``d * q + m`` on fp16 ``d`` and ``m`` (float64)."""
    q, scale, minimum = groups
    out, k = q.shape
    d, m = scale.half().double()[..., None], minimum.half().double()[..., None]
    return (q.double().reshape(out, -1, 32) * d + m).reshape(out, k)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize(("out", "k", "rows"), SHAPES)
def test_q4_1_matches_the_same_arithmetic_in_float64(out: int, k: int, rows: int) -> None:
    torch.manual_seed(out * k + rows)
    groups = quantize_groups(torch.randn(out, k))
    bias = torch.randn(out)
    x = torch.randn(rows, k) * 3
    want = quantized_activations(x) @ q4_1_weight(groups).t() + bias.double()
    assert relative_error(Q4_1Linear(groups, bias)(x), want) < 1e-5


@pytest.mark.parametrize(("out", "k", "rows"), SHAPES)
def test_q8_0_matches_the_same_arithmetic_in_float64(out: int, k: int, rows: int) -> None:
    torch.manual_seed(out * k + rows)
    w = torch.randn(out, k)
    x = torch.randn(rows, k) * 3
    q, scale = quantize_q8_0(w)
    weight = (q.double().reshape(out, -1, 32) * scale.double()[..., None]).reshape(out, k)
    assert relative_error(Q8_0Linear(w)(x), quantized_activations(x) @ weight.t()) < 1e-5


# K-quants: in a multiple of 256 (one to six super-blocks); the others of 32
GGUF_SHAPES = {
    "Q4_0": [(16, 32, 1), (40, 160, 9), (960, 576, 3)],
    "Q8_0": [(16, 32, 1), (40, 160, 9), (100, 288, 11)],
    "Q4_K": [(16, 256, 1), (40, 512, 3), (33, 1536, 8), (64, 768, 13), (5, 256, 17)],
    "Q5_K": [(16, 256, 1), (40, 512, 3), (33, 1536, 8), (64, 768, 13), (5, 256, 17)],
    "Q6_K": [(16, 256, 1), (40, 512, 3), (33, 1536, 8), (64, 768, 13), (5, 256, 17)],
}
GGUF_CASES = [(t, *shape) for t, shapes in GGUF_SHAPES.items() for shape in shapes]


@pytest.mark.parametrize(("ggml_type", "out", "k", "rows"), GGUF_CASES)
def test_gguf_blocks_match_the_gguf_packages_dequantization(
    ggml_type: str, out: int, k: int, rows: int
) -> None:
    rng = np.random.default_rng(out * k + rows)
    raw = random_blocks(rng, ggml_type, out, k)
    weight = torch.from_numpy(dequantize(raw, gguf.GGMLQuantizationType[ggml_type]).reshape(out, k)).double()
    torch.manual_seed(out + k + rows)
    bias = torch.randn(out)
    layer = BlockLinear.from_gguf(raw, ggml_type, k, bias)
    x = torch.randn(rows, k) * 3
    want = quantized_activations(x) @ weight.t() + bias.double()
    assert relative_error(layer(x), want) < 1e-5
    gate_up = torch.randn(rows, 2 * k)
    gated = quantized_activations(silu_and_mul_ref(gate_up)) @ weight.t() + bias.double()
    assert relative_error(layer.gated(gate_up), gated) < 1e-5


@pytest.mark.parametrize("ggml_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_the_k_quants_largest_codes_do_not_saturate(ggml_type: str) -> None:
    """Every code at its extreme (Q4_K 15, Q5_K 31, Q6_K -32), every 6-bit
    scale at 63 (Q6_K's int8 at 127), activations all +-1 (codes +-127): the
    int16 sums of 8 (Q4_K) or 4 (Q5_K, Q6_K) vectors must not saturate."""
    k = 512
    raw = random_blocks(np.random.default_rng(0), ggml_type, 4, k).reshape(4, k // 256, -1)
    if ggml_type == "Q6_K":
        raw[:, :, :192] = 0  # u = 0: w = d sc (0 - 32)
        raw[:, :, 192:208] = 127
    else:
        raw[:, :, 4:16] = 0xFF  # the 6-bit scales and mins all 63
        raw[:, :, 16:] = 0xFF  # codes (and Q5_K's fifth bits) all set
    raw = raw.reshape(4, -1)
    weight = torch.from_numpy(dequantize(raw, gguf.GGMLQuantizationType[ggml_type]).reshape(4, k)).double()
    x = torch.ones(2, k)
    x[1] = -1.0
    want = quantized_activations(x) @ weight.t()
    assert relative_error(BlockLinear.from_gguf(raw, ggml_type, k)(x), want) < 1e-6


@pytest.mark.parametrize("ggml_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_the_c_layout_is_the_numpy_reference(ggml_type: str) -> None:
    """The load-time conversion in C (``k_layout``) and ``kquant_layout``'s numpy
    give the same bytes, whose product the test above checks against gguf."""
    raw = random_blocks(np.random.default_rng(7), ggml_type, 37, 1280)
    kind = ggml_type.lower()
    assert np.array_equal(cpu_qblock.k_layout(raw, kind).numpy(), kquant_layout.LAYOUTS[kind](raw))


def test_a_k_quant_needs_whole_super_blocks() -> None:
    raw = random_blocks(np.random.default_rng(0), "Q4_K", 4, 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        BlockLinear("q4_k", torch.from_numpy(raw), 224)
    with pytest.raises(ValueError, match="no block kernel for Q2_K"):
        BlockLinear.from_gguf(raw, "Q2_K", 256)


def test_the_largest_codes_do_not_saturate() -> None:
    """vpmaddubsw sums u8 x s8 pairs in int16 with saturation: 2 x 15 x 127 (Q4_1,
    then 8 of those summed in int16 over a super-block) and 2 x 127 x 127 (Q8_0,
    the sign moved to x) must come out exact, in the super-blocks and after them."""
    k = 256 + 64
    x = torch.full((2, k), 1.0)
    x[1] = -1.0
    q = torch.full((4, k), 15, dtype=torch.int32)
    ones = torch.ones(4, k // 32)
    got = Q4_1Linear((q, ones, torch.zeros(4, k // 32)))(x)
    assert torch.equal(got, torch.tensor([[15.0 * k] * 4, [-15.0 * k] * 4]))
    # Q8_0: codes -127 on the fp16 scale of 1/127, x's codes 127 on its fp32 one
    # (a saturated pair sum, 32767 for 32258, would be 1.6% off)
    w_scale = torch.tensor(1 / 127).half().double()
    x_scale = torch.tensor(1 / 127).float().double()
    want = k * 127 * 127 * w_scale * x_scale
    got = Q8_0Linear(torch.full((4, k), -1.0))(x).double()
    assert torch.allclose(
        got, torch.tensor([[-want] * 4, [want] * 4], dtype=torch.float64), rtol=1e-6, atol=0
    )


def test_zero_blocks_and_zero_rows() -> None:
    """An all-zero activation block has scale 0 (no division by it); no rows, no output."""
    groups = quantize_groups(torch.randn(16, 64))
    x = torch.zeros(1, 64)
    x[0, 32:] = torch.randn(32)
    want = quantized_activations(x) @ q4_1_weight(groups).t()
    assert relative_error(Q4_1Linear(groups)(x), want) < 1e-5
    assert Q4_1Linear(groups)(torch.empty(0, 64)).shape == (0, 16)


def test_bad_inputs_are_refused() -> None:
    layer = Q4_1Linear(quantize_groups(torch.randn(16, 64)))
    with pytest.raises(ValueError, match="features"):
        layer(torch.randn(1, 32))
    with pytest.raises(ValueError, match="float32"):
        layer(torch.randn(1, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of 32"):
        Q8_0Linear(torch.randn(16, 48))


def test_blocks_are_the_checkpoints_own_bytes() -> None:
    """The bundled GGUF's Q4_1 layers and Q8_0 embedding (the tied head), dequantized
    and packed again, are byte for byte the file's blocks: the kernels read the
    checkpoint's weights, not a rounding of them."""
    reader = gguf.GGUFReader(str(default_model_path()))
    tensors = {t.name: t for t in reader.tensors}
    for name in ("blk.0.ffn_down.weight", "blk.29.attn_output.weight"):
        t = tensors[name]
        groups = exact_groups(torch.from_numpy(dequantize(t.data, t.tensor_type).copy()))
        assert groups is not None
        assert torch.equal(pack_q4_1(*groups), torch.from_numpy(t.data.copy()))
    t = tensors["token_embd.weight"]
    weight = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
    assert torch.equal(pack_q8_0(*quantize_q8_0(weight)), torch.from_numpy(t.data.copy()))


def test_a_cpu_without_avx2_keeps_torchs_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_qblock, "cpu_flags", lambda: frozenset({"sse2", "fma"}))
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is None and "avx2" in reason and "f16c" in reason


def test_a_failed_compile_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    monkeypatch.setenv("CC", "false")  # a compiler that exits 1
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is None and "false failed" in reason
    assert not list((tmp_path / "kernels").iterdir())  # no partial library left behind


def test_cc_may_carry_a_launcher_and_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CC is split as make splits it: ``env`` runs ``cc`` with a define, and the library is built."""
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    monkeypatch.setenv("CC", "env cc -DBARGEIN_CC_TEST=1")
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is not None and reason == ""


def test_an_empty_cc_is_no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    monkeypatch.setenv("CC", "  ")
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is None and "no C compiler" in reason


def test_an_unwritable_cache_builds_in_a_private_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cache folder that cannot be created (a read-only HOME) costs a build, not the kernels."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: blocker)  # kernels/ under a file
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is not None and reason == ""


def test_the_library_is_built_under_the_cache_dir_not_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("")  # HOME's cache cannot be a folder
    monkeypatch.setenv("HOME", str(home))
    lib, reason = cpu_qblock._library.__wrapped__(str(tmp_path / "cache"))
    assert lib is not None and reason == ""
    (built,) = (tmp_path / "cache" / "kernels").glob("cpu_qblock-*.so")
    assert built.stat().st_mode & 0o777 == 0o755


def test_a_library_others_may_write_is_rebuilt_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    assert cpu_qblock._library.__wrapped__()[0] is not None
    (built,) = (tmp_path / "kernels").glob("cpu_qblock-*.so")
    built.unlink()  # a new file: the loaded library's pages stay as they are
    built.write_bytes(b"planted")  # not a library: loading it would fail
    built.chmod(0o666)
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is not None and reason == ""
    assert built.stat().st_mode & 0o777 == 0o755 and built.read_bytes() != b"planted"


def test_a_folder_others_may_write_or_own_is_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    (tmp_path / "kernels").mkdir(mode=0o755)
    (tmp_path / "kernels").chmod(0o777)
    assert cpu_qblock._library.__wrapped__()[0] is not None
    assert not list((tmp_path / "kernels").iterdir())  # built in a private folder instead
    (tmp_path / "kernels").chmod(0o755)
    monkeypatch.setattr(cpu_qblock.os, "geteuid", lambda: 12345)  # another user owns it
    assert "owned by uid" in (cpu_qblock._untrusted(tmp_path / "kernels") or "")
    assert cpu_qblock._library.__wrapped__()[0] is not None
    assert not list((tmp_path / "kernels").iterdir())


def test_a_built_library_is_reused_without_a_compiler(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_qblock, "cache_root", lambda _: tmp_path)
    assert cpu_qblock._library.__wrapped__()[0] is not None  # built into tmp_path
    monkeypatch.setenv("CC", "no-such-compiler")
    lib, reason = cpu_qblock._library.__wrapped__()
    assert lib is not None and reason == ""


@pytest.mark.parametrize(("out", "k", "rows"), [(576, 1536, 1), (576, 1536, 9), (40, 160, 3), (100, 288, 17)])
def test_the_down_projection_takes_the_gate_and_up_halves(out: int, k: int, rows: int) -> None:
    """``gated(gate_up)`` is the layer on ``silu_and_mul_ref(gate_up)``: the
    same arithmetic in float64 on the SiLU-mul of torch, but for an int8 code
    that a last-bit difference in silu rounds the other way (1 in ~10^5)."""
    torch.manual_seed(out + k + rows)
    groups = quantize_groups(torch.randn(out, k))
    bias = torch.randn(out)
    gate_up = torch.randn(rows, 2 * k) * 4
    want = quantized_activations(silu_and_mul_ref(gate_up)) @ q4_1_weight(groups).t() + bias.double()
    layer = Q4_1Linear(groups, bias)
    assert relative_error(layer.gated(gate_up), want) < 1e-4
    torch.testing.assert_close(layer.gated(gate_up), layer(silu_and_mul_ref(gate_up)), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="2 x"):
        layer.gated(torch.randn(rows, k))


def test_the_kernels_exp_is_within_two_ulp() -> None:
    """exp (the SiLU's) against float64 from -87 to 88: relative error under
    2.5e-7 (about 2 ulp); clamped to finite floats beyond."""
    lib = cpu_qblock._library()[0]
    assert lib is not None
    x = torch.cat([torch.linspace(-87.0, 88.0, 400_000), torch.tensor([-1e4, 1e4, -float("inf"), 0.0] * 2)])
    y = torch.empty_like(x)
    lib.exp_f32(x.data_ptr(), y.data_ptr(), x.numel())
    want = torch.exp(x[:400_000].double())
    assert ((y[:400_000].double() - want).abs() / want).max() < 2.5e-7
    tail = y[400_000:].tolist()
    assert tail[0] < 1e-37 and 1e38 < tail[1] < float("inf") and tail[2] < 1e-37 and tail[3] == 1.0


def embedded(row: torch.Tensor, others: torch.Tensor, at: int) -> torch.Tensor:
    """``others`` ``[n, in]`` with ``row`` ``[in]`` inserted as row ``at``: ``[n + 1, in]``."""
    return torch.cat((others[:at], row[None], others[at:]))


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_others=st.integers(1, 600),
    where=st.floats(0, 1),
    threads=st.sampled_from([1, 2]),
    kind=st.sampled_from(["q4_1", "q4_1_gated", "q8_0", "Q4_K", "Q5_K", "Q6_K_gated"]),
)
def test_a_rows_output_is_bitwise_the_same_whatever_shares_the_step(
    seed: int, num_others: int, where: float, threads: int, kind: str
) -> None:
    """Issue 37: a row's output does not depend on the other rows of the call
    nor on their number. Its activations are quantized per row and block of
    32; its integer products are exact; its float accumulation runs over its
    own groups in one order, whichever pass of 8 rows (and which of its
    unrolled variants, 1..8 rows) or channel tile or thread computes it. So
    the row alone and the same row among 1..600 others (the passes cut at
    every offset, the last pass part full) are equal bit for bit. 576 inputs
    are SmolLM2's (two super-blocks and a group of 2), 768 three K-quant
    super-blocks; 100 outputs end in a
    part-full tile."""
    gen = torch.Generator().manual_seed(seed)
    k_quant = kind[:4] in ("Q4_K", "Q5_K", "Q6_K")
    k, out = (768 if k_quant else 576), 100
    width = 2 * k if kind.endswith("_gated") else k
    row = torch.randn(width, generator=gen) * 3
    others = torch.randn(num_others, width, generator=gen) * 3
    at = round(where * num_others)
    if kind == "q8_0":
        layer: Callable[[torch.Tensor], torch.Tensor] = Q8_0Linear(torch.randn(out, k, generator=gen))
    elif k_quant:
        blocks = BlockLinear.from_gguf(
            random_blocks(np.random.default_rng(seed), kind[:4], out, k), kind[:4], k
        )
        layer = blocks.gated if kind.endswith("_gated") else blocks
    else:
        q4 = Q4_1Linear(quantize_groups(torch.randn(out, k, generator=gen)), torch.randn(out, generator=gen))
        layer = q4.gated if kind == "q4_1_gated" else q4
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = layer(row[None])
        among = layer(embedded(row, others, at))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(among[at], alone[0])
