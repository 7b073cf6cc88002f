"""CPU attention is one fixed order: a query's output is bit for bit the same
whichever path computes it (issue 37).

A prefill of the whole prompt, the same prompt in chunks of any size, the
tail of a turn over a cached prefix batched with other sequences' chunks,
a decode step in a batch of other sequences (unfused, and fused with the
rotary and the KV write): for the same query at the same position over the
same cache, ``torch.equal``. Each is also the torch reference to float32
rounding.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.kernels import cpu_attention, cpu_fused
from bargein.engine.kernels.cpu_attention import paged_attention_decode_cpu, paged_attention_prefill_cpu
from bargein.engine.kernels.paged_attention import paged_attention_prefill_ref
from bargein.engine.kernels.rotary import build_cos_sin_cache, rotary_embedding_ref

TOL = {"atol": 2e-5, "rtol": 2e-5}


def _pool(
    lens: list[int], hk: int, d: int, block_size: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """A K/V pool of random rows and each sequence's blocks, scattered."""
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 1
    k_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for w in widths:
        tables.append(ids[:w])
        ids = ids[w:]
    return k_cache, v_cache, tables


def _table(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)


def _prefill(
    chunks: list[tuple[torch.Tensor, int, list[int]]],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One varlen prefill call over ``(q [n, Hq, D], seq_len, blocks)`` chunks."""
    q = torch.cat([c[0] for c in chunks])
    starts = torch.tensor([0, *itertools.accumulate(c[0].shape[0] for c in chunks)], dtype=torch.int32)
    lens = torch.tensor([c[1] for c in chunks], dtype=torch.int32)
    return paged_attention_prefill_cpu(
        q, k_cache, v_cache, _table([c[2] for c in chunks]), starts, lens, scale
    )


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 2000),
    chunk=st.integers(1, 512),
    cached=st.floats(0.0, 1.0),
    others=st.lists(st.integers(1, 700), min_size=0, max_size=6),
    group=st.sampled_from([1, 3]),
    hk=st.integers(1, 3),
    d=st.sampled_from([8, 13, 64]),
    block_size=st.sampled_from([1, 5, 16, 17]),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_prefill_chunks_tails_and_decode_agree_bit_for_bit(
    length: int,
    chunk: int,
    cached: float,
    others: list[int],
    group: int,
    hk: int,
    d: int,
    block_size: int,
    cache_dtype: torch.dtype,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    hq, scale = group * hk, d**-0.5
    k_cache, v_cache, tables = _pool([length, *others], hk, d, block_size, cache_dtype, gen)
    blocks = tables[0]
    q = torch.randn(length, hq, d, generator=gen)
    q_others = [torch.randn(n, hq, d, generator=gen) for n in others]

    whole = _prefill([(q, length, blocks)], k_cache, v_cache, scale)
    want = paged_attention_prefill_ref(
        q,
        k_cache,
        v_cache,
        _table([blocks]),
        torch.tensor([0, length], dtype=torch.int32),
        torch.tensor([length], dtype=torch.int32),
        scale,
    )
    torch.testing.assert_close(whole, want, **TOL)

    # in chunks of `chunk` tokens, one call each
    chunked = torch.cat(
        [
            _prefill([(q[a : a + chunk], min(a + chunk, length), blocks)], k_cache, v_cache, scale)
            for a in range(0, length, chunk)
        ]
    )
    assert torch.equal(chunked, whole)

    # the tail after a cached prefix, in one call with the other sequences' whole prompts
    prefix = int(cached * (length - 1))
    batch = [(q_others[i], n, tables[i + 1]) for i, n in enumerate(others)]
    at = len(batch) // 2
    batch.insert(at, (q[prefix:], length, blocks))
    out = _prefill(batch, k_cache, v_cache, scale)
    start = sum(c[0].shape[0] for c in batch[:at])
    assert torch.equal(out[start : start + length - prefix], whole[prefix:])

    # decode: this sequence's query at a few positions, in a batch with the others' last tokens
    positions = sorted({0, length - 1, prefix, min(length - 1, cpu_attention.TILE_TOKENS)})
    for pos in positions:
        rows = [q_others[i][-1] for i in range(len(others))]
        rows.insert(at, q[pos])
        lens = list(others)
        lens.insert(at, pos + 1)
        step_tables = [tables[i + 1] for i in range(len(others))]
        step_tables.insert(at, blocks)
        got = paged_attention_decode_cpu(
            torch.stack(rows),
            k_cache,
            v_cache,
            _table(step_tables),
            torch.tensor(lens, dtype=torch.int32),
            scale,
        )
        assert torch.equal(got[at], whole[pos]), pos


@settings(max_examples=20, deadline=None)
@given(
    lens=st.lists(st.integers(1, 600), min_size=1, max_size=8),
    group=st.sampled_from([1, 3]),
    hk=st.integers(1, 3),
    d=st.sampled_from([8, 64]),
    block_size=st.sampled_from([1, 16, 17]),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_fused_decode_writes_and_reads_as_a_prefill_does(
    lens: list[int],
    group: int,
    hk: int,
    d: int,
    block_size: int,
    cache_dtype: torch.dtype,
    seed: int,
) -> None:
    """The fused decode step (rotary, KV write, attention in one call) leaves
    the cache as torch's rotary and write do, and each sequence's output is
    bit for bit the prefill's for its last token over that cache."""
    gen = torch.Generator().manual_seed(seed)
    hq, scale = group * hk, d**-0.5
    k_cache, v_cache, tables = _pool(lens, hk, d, block_size, cache_dtype, gen)
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.tensor(
        [t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions.tolist())]
    )
    qkv = torch.randn(len(lens), (hq + 2 * hk) * d, generator=gen)
    cos_sin = build_cos_sin_cache(
        max(lens), d, 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    )
    table, seq_lens = _table(tables), torch.tensor(lens, dtype=torch.int32)
    k_want, v_want = k_cache.clone(), v_cache.clone()

    out = cpu_fused.decode_attention(
        qkv, positions, cos_sin, k_cache, v_cache, slots, table, seq_lens, hq, scale
    )

    q, k, v = qkv.split([hq * d, hk * d, hk * d], -1)
    q, k = rotary_embedding_ref(q.reshape(-1, hq, d), k.reshape(-1, hk, d), positions, cos_sin)
    k_want.view(-1, hk, d)[slots] = k.to(cache_dtype)
    v_want.view(-1, hk, d)[slots] = v.reshape(-1, hk, d).to(cache_dtype)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    for i, n in enumerate(lens):
        alone = _prefill([(q[i : i + 1], n, tables[i])], k_cache, v_cache, scale)
        assert torch.equal(out[i], alone[0]), i
