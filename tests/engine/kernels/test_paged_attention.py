"""Triton paged attention (decode, split-K decode, varlen prefill) against the references.

Context lengths are ragged in one batch and include 1, block size - 1, a
context ending exactly on a block boundary and one just past it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from bargein.engine.kernels.paged_attention import (
    _launch_decode,
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_prefill,
    paged_attention_prefill_ref,
)
from tests.engine.kernels.helpers import DTYPES, assert_close, paged_kv

HEADS = [(9, 3, 64), (4, 1, 16), (2, 2, 24)]  # (Hq, Hk, D): the default model's GQA, MQA, MHA


def _decode_inputs(
    seq_lens: Sequence[int],
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    hq, hk, d = heads
    gen = torch.Generator().manual_seed(sum(seq_lens) * 17 + block_size)
    k_cache, v_cache, tables = paged_kv(seq_lens, hk, d, block_size, dtype, device, gen)
    q = torch.randn(len(seq_lens), hq, d, generator=gen).to(dtype=dtype, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens


def _check_decode(
    seq_lens: Sequence[int],
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    args = _decode_inputs(seq_lens, heads, block_size, dtype, device)
    scale = heads[2] ** -0.5
    assert_close(paged_attention_decode(*args, scale), paged_attention_decode_ref(*args, scale))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [16, 5])
def test_decode_matches_reference_on_ragged_contexts(
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    poisoned_outputs: None,
) -> None:
    lens = [1, block_size - 1 or 1, block_size, block_size + 1, 2 * block_size, 67, 3]
    _check_decode(lens, heads, block_size, dtype, device)


@pytest.mark.parametrize(
    "num_splits,tokens_per_split,dtype",
    [(2, 128, torch.float32), (3, 64, torch.float32), (3, 64, torch.bfloat16), (2, 128, torch.float16)],
    ids=str,
)
def test_split_k_decode_matches_reference(
    num_splits: int, tokens_per_split: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    """One sequence spans all splits, one only the first, one ends on a split edge; with 2 splits
    the table (176 tokens wide) leaves the second split empty for all but the first."""
    q, k_cache, v_cache, tables, lens = _decode_inputs([150, 7, 128], (9, 3, 64), 16, dtype, device)
    out = torch.empty_like(q)
    got = _launch_decode(q, k_cache, v_cache, tables, lens, 0.125, out, num_splits, tokens_per_split)
    assert_close(got, paged_attention_decode_ref(q, k_cache, v_cache, tables, lens, 0.125))


def test_decode_of_one_long_sequence_splits_and_matches(device: torch.device, poisoned_outputs: None) -> None:
    """Batch 1 cannot fill the GPU alone: the launcher picks split-K by itself."""
    _check_decode([193], (9, 3, 64), 16, torch.float32, device)


@pytest.mark.parametrize(
    "block_size,dtype",
    [(16, torch.float32), (7, torch.float32), (7, torch.bfloat16), (16, torch.float16)],
    ids=str,
)
def test_prefill_matches_reference_with_cached_prefixes(
    block_size: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    """(cached prefix, chunk) per sequence: a whole prompt, a 1-token chunk, chunks longer than a
    query tile (16), chunks ending exactly on and just past a block boundary."""
    chunks = [
        (0, 5),
        (9, 1),
        (0, 2 * block_size),
        (block_size - 3, 4),
        (3, 17),
        (2 * block_size - 1, 2),
        (0, 1),
    ]
    _check_prefill(chunks, (9, 3, 64), block_size, dtype, device)


@pytest.mark.parametrize("heads", HEADS[1:])
def test_prefill_matches_reference_for_mqa_and_mha(
    heads: tuple[int, int, int], device: torch.device, poisoned_outputs: None
) -> None:
    _check_prefill([(4, 13), (0, 1), (16, 16)], heads, 16, torch.float32, device)


def _check_prefill(
    chunks: Sequence[tuple[int, int]],
    heads: tuple[int, int, int],
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    hq, hk, d = heads
    seq_lens = [prefix + n for prefix, n in chunks]
    gen = torch.Generator().manual_seed(sum(seq_lens) * 3 + block_size)
    k_cache, v_cache, tables = paged_kv(seq_lens, hk, d, block_size, dtype, device, gen)
    q_lens = torch.tensor([n for _, n in chunks])
    query_start_loc = (
        torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(torch.int32).to(device)
    )
    q = torch.randn(int(q_lens.sum()), hq, d, generator=gen).to(dtype=dtype, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, tables, query_start_loc, lens, d**-0.5)
    assert_close(paged_attention_prefill(*args), paged_attention_prefill_ref(*args))


def test_attention_refuses_int64_block_tables(device: torch.device) -> None:
    q, k_cache, v_cache, tables, lens = _decode_inputs([3], (2, 1, 16), 4, torch.float32, device)
    with pytest.raises(AssertionError, match="block_tables"):
        paged_attention_decode(q, k_cache, v_cache, tables.long(), lens, 0.25)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_seqs,max_len", [(1, 8193), (64, 2049), (256, 515)])
def test_decode_large_batches_on_gpu(
    num_seqs: int, max_len: int, dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    lens = torch.randint(1, max_len + 1, (num_seqs,), generator=torch.Generator().manual_seed(num_seqs))
    lens[0] = max_len
    _check_decode(lens.tolist(), (9, 3, 64), 16, dtype, device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_large_chunks_on_gpu(
    dtype: torch.dtype, device: torch.device, poisoned_outputs: None
) -> None:
    chunks = [(0, 512), (1000, 256), (15, 1), (17, 333), (2047, 129)]
    _check_prefill(chunks, (9, 3, 64), 16, dtype, device)


def test_decode_does_not_depend_on_the_batch(device: torch.device) -> None:
    """Splits are fixed in tokens and merged in order: a sequence's output is
    bit for bit the same alone and beside longer ones (which widen the table
    and so add empty splits after its own)."""
    lens = [70, 3, 200]
    q, k_cache, v_cache, tables, seq_lens = _decode_inputs(lens, (9, 3, 64), 16, torch.float32, device)
    together = paged_attention_decode(q, k_cache, v_cache, tables, seq_lens, 0.125)
    for i, n in enumerate(lens):
        width = -(-n // 16)
        alone = paged_attention_decode(
            q[i : i + 1], k_cache, v_cache, tables[i : i + 1, :width].contiguous(), seq_lens[i : i + 1], 0.125
        )
        assert torch.equal(alone[0], together[i]), n


@pytest.mark.parametrize("chunk", [1, 5, 16, 23])
def test_prefill_does_not_depend_on_the_chunking(chunk: int, device: torch.device) -> None:
    """Key tiles start at position 0 whatever the chunk: a prompt prefilled
    whole and in chunks of ``chunk`` tokens gives the same bits per token."""
    n, hq, hk, d, bs = 40, 4, 2, 16, 7
    gen = torch.Generator().manual_seed(chunk)
    k_cache, v_cache, tables = paged_kv([n], hk, d, bs, torch.float32, device, gen)
    q = torch.randn(n, hq, d, generator=gen).to(device)

    def run(a: int, b: int) -> torch.Tensor:
        starts = torch.tensor([0, b - a], dtype=torch.int32, device=device)
        lens = torch.tensor([b], dtype=torch.int32, device=device)
        return paged_attention_prefill(q[a:b], k_cache, v_cache, tables, starts, lens, 0.125)

    whole = run(0, n)
    chunked = torch.cat([run(a, min(a + chunk, n)) for a in range(0, n, chunk)])
    assert torch.equal(chunked, whole)


@pytest.mark.parametrize("chunk", [1, 7, 16, 64, 200])
def test_a_decoded_position_has_the_bits_of_the_same_position_prefilled(
    chunk: int, device: torch.device
) -> None:
    """Decode is the prefill kernel with one query: the last query of a prompt
    prefilled in chunks of ``chunk`` and the same query decoded give equal
    bits, at lengths inside the first split, on a split's edge and past it
    (a preemption's recompute or a takeover's re-prefill then writes the K/V
    the decode wrote)."""
    hq, hk, d, bs = 9, 3, 64, 16
    for n in (5, 63, 64, 65, 130, 200):
        gen = torch.Generator().manual_seed(n * 31 + chunk)
        k_cache, v_cache, tables = paged_kv([n], hk, d, bs, torch.float32, device, gen)
        q = torch.randn(n, hq, d, generator=gen).to(device)
        lens = torch.tensor([n], dtype=torch.int32, device=device)
        a = max(0, n - chunk)  # the chunk that holds the last position
        starts = torch.tensor([0, n - a], dtype=torch.int32, device=device)
        prefilled = paged_attention_prefill(q[a:], k_cache, v_cache, tables, starts, lens, 0.125)[-1]
        decoded = paged_attention_decode(q[-1:], k_cache, v_cache, tables, lens, 0.125)[0]
        assert torch.equal(decoded, prefilled), n
