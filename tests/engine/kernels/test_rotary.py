"""Triton rotary embedding (HF rotate_half layout) against ``rotary_embedding_ref``."""

from __future__ import annotations

import pytest
import torch

from bargein.engine.kernels.rotary import build_cos_sin_cache, rotary_embedding, rotary_embedding_ref
from tests.engine.kernels.helpers import DTYPES, assert_close


def _check(
    num_tokens: int, hq: int, hk: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> None:
    """q and k are views into one fused ``[T, (Hq + 2 Hk) D]`` projection, as in the model."""
    gen = torch.Generator().manual_seed(num_tokens * 31 + hq * 7 + head_dim)
    qkv = torch.randn(num_tokens, (hq + 2 * hk) * head_dim, generator=gen).to(dtype=dtype, device=device)
    q = qkv[:, : hq * head_dim].view(num_tokens, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(num_tokens, hk, head_dim)
    max_pos = 4099
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    cache = build_cos_sin_cache(max_pos, head_dim, inv_freq).to(device)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen).to(device)
    before = qkv.clone()
    q_out, k_out = rotary_embedding(q, k, positions, cache)
    want_q, want_k = rotary_embedding_ref(q, k, positions, cache)
    assert_close(q_out, want_q)
    assert_close(k_out, want_k)
    assert torch.equal(qkv, before), "the inputs must not be mutated"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "num_tokens,hq,hk,head_dim", [(1, 1, 1, 2), (7, 9, 3, 64), (13, 5, 1, 34), (3, 4, 4, 16)]
)
def test_rotary_matches_reference(
    num_tokens: int,
    hq: int,
    hk: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    poisoned_outputs: None,
) -> None:
    _check(num_tokens, hq, hk, head_dim, dtype, device)


def test_rotary_refuses_int32_positions(device: torch.device) -> None:
    q, k = torch.randn(2, 2, 8, device=device), torch.randn(2, 1, 8, device=device)
    with pytest.raises(AssertionError, match="positions"):
        rotary_embedding(
            q, k, torch.zeros(2, dtype=torch.int32, device=device), torch.randn(4, 8, device=device)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,hq,hk,head_dim", [(4097, 9, 3, 64), (513, 32, 8, 128)])
def test_rotary_large_shapes_on_gpu(
    num_tokens: int,
    hq: int,
    hk: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    poisoned_outputs: None,
) -> None:
    _check(num_tokens, hq, hk, head_dim, dtype, device)
