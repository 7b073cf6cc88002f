"""The 4-bit path (``weight_only``) against a plain-torch reference of the same arithmetic.

The reference dequantizes the packed weights the way torch's kernel reads
them, ``w = (q - 8) * scale + zero`` with the bf16 group scales and zeros the
layer holds, and multiplies the bf16-rounded input by it in float64. The
kernel accumulates in fp32 and rounds the output to bf16 once (relative
2**-8 = 3.9e-3 per element): measured <= 2.5e-3 of the reference's norm
over 200 random shapes, asserted < 4e-3. Against the exact product of the
checkpoint's weight (the input and the group scales rounded to bf16 too):
measured <= 4.7e-3, asserted < 8e-3.

The int8 weight-only head (:class:`Int8WeightLinear`) against
``bf16(x) @ (q * bf16(scale)).T`` in float64, the same arithmetic: the
kernel's fp32 accumulation and its one bf16 rounding of the output (2**-8
per element) bound it as the 4-bit one is, asserted < 4e-3 of the norm.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.model.weight_only import (
    GROUP_SIZE,
    Int4Linear,
    Int8WeightLinear,
    RowSplitLinear,
    exact_groups,
    holds_exactly,
    int4_kernel_available,
    int8_weight_kernel_available,
    quantize_groups,
)

pytestmark = pytest.mark.skipif(not int4_kernel_available(), reason="torch without the CPU int4 kernel")


def _q4_1_weight(out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as a Q4_1 GGUF dequantizes to: ``(w [out, in] fp32, q [out, in] int32)``,
    fp16 ``d`` and ``m`` per 32 weights, each group using q = 0 and q = 15."""
    g = torch.Generator().manual_seed(seed)
    groups = in_features // GROUP_SIZE
    q = torch.randint(0, 16, (out_features, groups, GROUP_SIZE), generator=g, dtype=torch.int32)
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(out_features, groups, 1, generator=g) * 0.02 + 1e-3).half().float()
    m = (-8 * d * (1 + 0.2 * torch.rand(out_features, groups, 1, generator=g))).half().float()
    return (q * d + m).reshape(out_features, in_features), q.reshape(out_features, in_features)


def _reference(
    layer: Int4Linear, q: torch.Tensor, x: torch.Tensor, in_scale: torch.Tensor | None
) -> torch.Tensor:
    """``bf16(x * in_scale) @ ((q - 8) * scale + zero).T`` in float64, from the layer's own bf16 scales."""
    scale = layer.scales_and_zeros[..., 0].double().t().repeat_interleave(GROUP_SIZE, 1)
    zero = layer.scales_and_zeros[..., 1].double().t().repeat_interleave(GROUP_SIZE, 1)
    w = (q.double() - 8) * scale + zero
    xs = x if in_scale is None else x * in_scale
    return xs.bfloat16().double() @ w.t()


def test_a_q4_1_weight_is_found_again_exactly() -> None:
    w, q = _q4_1_weight(48, 96, seed=0)
    found, scale, minimum = quantize_groups(w)
    assert torch.equal(found, q)  # the file's own codes
    back = found.reshape(48, 3, GROUP_SIZE) * scale[..., None] + minimum[..., None]
    torch.testing.assert_close(back.reshape(48, 96), w, rtol=0, atol=1e-6)
    assert holds_exactly(w)


def test_a_layer_from_found_groups_is_the_layer_from_the_weight() -> None:
    """The runner packs the groups its exactness check found, without quantizing again."""
    w, q = _q4_1_weight(48, 96, seed=3)
    groups = exact_groups(w)
    assert groups is not None and torch.equal(groups[0], q)
    in_scale, out_scale = torch.rand(96) + 0.5, torch.rand(48) + 0.5
    x = torch.randn(3, 96)
    direct = Int4Linear(w, torch.ones(48), in_scale=in_scale, out_scale=out_scale)
    found = Int4Linear.from_groups(groups, torch.ones(48), in_scale=in_scale, out_scale=out_scale)
    assert torch.equal(found(x), direct(x))
    assert exact_groups(torch.randn(48, 96)) is None


def test_only_a_4bit_weight_of_a_packable_shape_is_held() -> None:
    gaussian = torch.randn(64, 96)
    assert not holds_exactly(gaussian)  # a real fp32 weight would lose quality
    w, _ = _q4_1_weight(48, 96, seed=1)
    assert not holds_exactly(w[:40])  # 40 output rows: torch packs 16 at a time
    assert not holds_exactly(w[:, :80])  # 80 inputs: not whole groups of 32
    with pytest.raises(ValueError, match="multiple of 16"):
        Int4Linear(w[:40])


@settings(max_examples=25, deadline=None)
@given(
    out_blocks=st.integers(1, 12),
    in_groups=st.integers(1, 8),
    rows=st.integers(1, 9),
    smoothed=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int4_linear_matches_its_reference(
    out_blocks: int, in_groups: int, rows: int, smoothed: bool, bias: bool, seed: int
) -> None:
    out_features, in_features = 16 * out_blocks, GROUP_SIZE * in_groups
    w, q = _q4_1_weight(out_features, in_features, seed)
    g = torch.Generator().manual_seed(seed + 1)
    in_scale = torch.rand(in_features, generator=g) * 4 + 0.25 if smoothed else None
    out_scale = torch.rand(out_features, generator=g) * 4 + 0.25 if smoothed else None
    b = torch.randn(out_features, generator=g) if bias else None
    layer = Int4Linear(w, b, in_scale=in_scale, out_scale=out_scale)
    x = torch.randn(rows, in_features, generator=g)
    y = layer(x)
    ref = _reference(layer, q, x, in_scale) + (0 if b is None else b.double())
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    assert float((y.double() - ref).norm() / ref.norm()) < 4e-3
    # and it is the smoothed linear diag(1/out) W diag(in) of the checkpoint's weight
    exact = x.double() @ w.double().t() if not smoothed else (x * in_scale).double() @ w.double().t()
    if out_scale is not None:
        exact = exact / out_scale.double()
    exact = exact + (0 if b is None else b.double())
    assert float((y.double() - exact).norm() / exact.norm()) < 8e-3  # + bf16 input and scales


def test_row_split_runs_the_small_kernel_up_to_max_rows() -> None:
    w, _ = _q4_1_weight(32, 64, seed=2)
    small = Int4Linear(w)
    calls: list[int] = []

    def large(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x @ w.t()

    layer = RowSplitLinear(small, large, max_rows=4)
    for rows in (1, 4):
        torch.testing.assert_close(layer(torch.ones(rows, 64)), small(torch.ones(rows, 64)), rtol=0, atol=0)
    assert calls == []
    layer(torch.ones(5, 64))
    layer(torch.ones(0, 64))  # an empty input goes to the general kernel, which handles it
    assert calls == [5, 0]


@pytest.mark.skipif(not int8_weight_kernel_available(), reason="torch without the int8 weight-only kernel")
@settings(max_examples=40, deadline=None)
@given(
    out_blocks=st.integers(1, 64),
    in_features=st.sampled_from([32, 64, 96, 576]),
    rows=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_int8_weight_linear_matches_its_reference(
    out_blocks: int, in_features: int, rows: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16 * out_blocks, in_features, generator=g) * in_features**-0.5
    w[0] *= 30.0  # a loud channel: its own scale keeps the others' grid fine
    layer = Int8WeightLinear(w)
    x = torch.randn(rows, in_features, generator=g)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 16 * out_blocks)
    assert layer.q.dtype == torch.int8 and layer.scale.dtype == torch.bfloat16
    ref = x.bfloat16().double() @ (layer.q.double() * layer.scale.double()[:, None]).t()
    assert float((y.double() - ref).norm() / ref.norm()) < 4e-3
    # and the int8 grid is the weight's, per channel, on the step the kernel reads:
    # each weight within half a step of its code (the largest, clamped to 127,
    # within 127 times the step's bf16 rounding, 2**-8 of it: also half a step)
    step = layer.scale.double()[:, None]
    assert bool(((layer.q.double() * step - w.double()).abs() <= 0.5 * step * 1.001).all())
