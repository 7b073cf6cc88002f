"""Shared inputs and tolerances of the kernel tests (imported by the test modules)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Kernel vs reference, per dtype: both compute in float32 and round once, but
# in different orders (fused adds, exp2 online softmax vs SDPA), so a result
# may differ by about one unit in the last place of the dtype.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 1.6e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """``torch.testing.assert_close`` with the dtype's tolerance; NaN never passes."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    torch.testing.assert_close(actual, expected, **TOLERANCES[actual.dtype])


def paged_kv(
    seq_lens: Sequence[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K and V caches with each sequence's blocks scattered at random.

    Returns ``(k_cache, v_cache, block_tables)``; the pool holds two spare
    blocks, unused table entries point at random valid blocks (the kernels
    must mask them), and the table is one column wider than needed.
    """
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
    order = torch.randperm(num_blocks, generator=gen)
    width = max(blocks_per_seq) + 1
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), generator=gen, dtype=torch.int32)
    start = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = order[start : start + n].to(torch.int32)
        start += n
    return k_cache, v_cache, tables.to(device)
