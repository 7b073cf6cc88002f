"""Triton RMSNorm (fused residual add) against ``rms_norm_ref``."""

from __future__ import annotations

import pytest
import torch

from bargein.engine.kernels.rms_norm import rms_norm, rms_norm_ref
from tests.engine.kernels.helpers import DTYPES, assert_close


def _check(
    num_tokens: int, hidden: int, dtype: torch.dtype, with_residual: bool, device: torch.device
) -> None:
    gen = torch.Generator().manual_seed(num_tokens * 1000 + hidden)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype=dtype, device=device)
    weight = torch.randn(hidden, generator=gen).to(dtype=dtype, device=device)
    residual = (
        torch.randn(num_tokens, hidden, generator=gen).to(dtype=dtype, device=device)
        if with_residual
        else None
    )
    out, residual_out = rms_norm(x, weight, 1e-6, residual)
    want_out, want_residual = rms_norm_ref(x, weight, 1e-6, residual)
    assert_close(out, want_out)
    assert_close(residual_out, want_residual)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,hidden", [(1, 1), (3, 17), (7, 64), (2, 127), (5, 129)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(
    num_tokens: int,
    hidden: int,
    dtype: torch.dtype,
    with_residual: bool,
    device: torch.device,
    poisoned_outputs: None,
) -> None:
    _check(num_tokens, hidden, dtype, with_residual, device)


def test_rms_norm_reads_rows_through_their_stride(device: torch.device, poisoned_outputs: None) -> None:
    wide = torch.randn(4, 96, device=device)
    x = wide[:, :48]  # rows 96 apart, as a slice of a fused projection would be
    weight = torch.randn(48, device=device)
    assert_close(rms_norm(x, weight, 1e-5)[0], rms_norm_ref(x, weight, 1e-5)[0])


def test_rms_norm_refuses_a_mismatched_weight(device: torch.device) -> None:
    with pytest.raises(AssertionError, match="weight"):
        rms_norm(torch.randn(2, 8, device=device), torch.randn(7, device=device), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,hidden", [(4097, 576), (33, 4095), (1, 8192)])
def test_rms_norm_large_shapes_on_gpu(
    num_tokens: int, hidden: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    _check(num_tokens, hidden, dtype, True, device)
