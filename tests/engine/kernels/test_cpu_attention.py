"""The numba CPU decode attention against the torch reference, on random inputs."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.kernels.cpu_attention import paged_attention_decode_cpu, paged_attention_prefill_cpu
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref, paged_attention_prefill_ref


def _inputs(
    lens: list[int], hq: int, hk: int, d: int, block_size: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """A pool with blocks scattered at random and tables padded with block ids
    that are valid but hold other sequences' data (never to be read)."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    # past its own blocks, a row holds random valid ids: someone else's data
    table = torch.randint(0, num_blocks, (len(lens), max(widths)), dtype=torch.int32, generator=gen)
    for i, w in enumerate(widths):
        table[i, :w] = torch.tensor(ids[:w])
        ids = ids[w:]
    q = torch.randn(len(lens), hq, d, generator=gen).to(dtype)
    return q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(("hq", "hk"), [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_matches_the_reference(hq: int, hk: int, block_size: int) -> None:
    q, k_cache, v_cache, table, lens = _inputs([1, 17, 16, 33, 2, 100], hq, hk, 64, block_size, 0)
    want = paged_attention_decode_ref(q, k_cache, v_cache, table, lens, 0.125)
    out = paged_attention_decode_cpu(q, k_cache, v_cache, table, lens, 0.125)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 300), min_size=1, max_size=12),
    group=st.sampled_from([1, 2, 3, 7]),
    hk=st.integers(1, 4),
    d=st.sampled_from([1, 8, 64, 80, 128]),
    block_size=st.sampled_from([1, 3, 16, 32]),
    scale=st.floats(0.01, 2.0),
    seed=st.integers(0, 2**16),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_random_shapes_match_the_reference(
    lens: list[int],
    group: int,
    hk: int,
    d: int,
    block_size: int,
    scale: float,
    seed: int,
    cache_dtype: torch.dtype,
) -> None:
    """A float32 or bfloat16 cache (the reference reads bfloat16 as float32, as the kernel does)."""
    q, k_cache, v_cache, table, seq_lens = _inputs(lens, group * hk, hk, d, block_size, seed)
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    q_before, k_before = q.clone(), k_cache.clone()
    out = paged_attention_decode_cpu(q, k_cache, v_cache, table, seq_lens, scale)
    want = paged_attention_decode_ref(q, k_cache, v_cache, table, seq_lens, scale)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    assert torch.equal(q, q_before) and torch.equal(k_cache, k_before)  # no input mutated


def test_strided_query_and_a_large_score_range() -> None:
    """q as the model passes it (a view into the fused q/k/v output), and
    scores far apart (the softmax must subtract the max, not overflow)."""
    q, k_cache, v_cache, table, lens = _inputs([40, 7], 6, 2, 16, 16, 3)
    fused = torch.cat([q.flatten(1) * 30, torch.randn(2, 64)], dim=1)
    q_view = fused[:, :96].view(2, 6, 16)
    assert not q_view.is_contiguous()
    out = paged_attention_decode_cpu(q_view, k_cache, v_cache, table, lens, 1.0)
    want = paged_attention_decode_ref(q_view.contiguous(), k_cache, v_cache, table, lens, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_other_dtypes_take_the_reference() -> None:
    q, k_cache, v_cache, table, lens = _inputs([5, 21], 9, 3, 64, 16, 1, torch.bfloat16)
    out = paged_attention_decode_cpu(q, k_cache, v_cache, table, lens, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, paged_attention_decode_ref(q, k_cache, v_cache, table, lens, 0.125))


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 200)), min_size=1, max_size=6),
    group=st.sampled_from([1, 3]),
    hk=st.integers(1, 3),
    d=st.sampled_from([8, 64]),
    block_size=st.sampled_from([1, 5, 16]),
    seed=st.integers(0, 2**16),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_prefill_chunks_match_the_reference(
    chunks: list[tuple[int, int]],
    group: int,
    hk: int,
    d: int,
    block_size: int,
    seed: int,
    cache_dtype: torch.dtype,
) -> None:
    """Chunks of ``n`` new tokens after ``cached`` ones, over a float32 or a
    bfloat16 cache."""
    totals = [n + cached for n, cached in chunks]
    _, k_cache, v_cache, table, seq_lens = _inputs(totals, group * hk, hk, d, block_size, seed)
    k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(n for n, _ in chunks), group * hk, d, generator=gen)
    starts = torch.tensor([0, *itertools.accumulate(n for n, _ in chunks)], dtype=torch.int32)
    out = paged_attention_prefill_cpu(q, k_cache, v_cache, table, starts, seq_lens, 0.125)
    want = paged_attention_prefill_ref(q, k_cache, v_cache, table, starts, seq_lens, 0.125)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
