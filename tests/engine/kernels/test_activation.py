"""Triton SiLU-and-multiply against ``silu_and_mul_ref``."""

from __future__ import annotations

import pytest
import torch

from bargein.engine.kernels.activation import silu_and_mul, silu_and_mul_ref
from tests.engine.kernels.helpers import DTYPES, assert_close


def _check(num_tokens: int, inter_size: int, dtype: torch.dtype, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(num_tokens * 7919 + inter_size)
    x = (3 * torch.randn(num_tokens, 2 * inter_size, generator=gen)).to(dtype=dtype, device=device)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,inter_size", [(1, 1), (5, 37), (2, 1023), (3, 1025)])
def test_silu_and_mul_matches_reference(
    num_tokens: int, inter_size: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    _check(num_tokens, inter_size, dtype, device)


def test_silu_and_mul_refuses_an_odd_width(device: torch.device) -> None:
    with pytest.raises(AssertionError, match="even"):
        silu_and_mul(torch.randn(2, 7, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,inter_size", [(4097, 1536), (1, 14336)])
def test_silu_and_mul_large_shapes_on_gpu(
    num_tokens: int, inter_size: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    _check(num_tokens, inter_size, dtype, device)
