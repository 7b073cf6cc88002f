"""Decode attention over the paged KV cache on the CPU, compiled with numba.

The torch reference (``paged_attention_decode_ref``) gathers every
sequence's blocks into a contiguous ``[B, L, Hk, D]`` copy per layer before
SDPA reads it again: at 32 sequences of ~100 tokens that copy was 15% of a
decode step and SDPA another 15% (torch.profiler, docs/perf/engine-cpu.md).
This kernel reads K and V once, straight from the blocks named by the block
table, the way the Triton kernel does on the GPU (Kwon et al. 2023, vLLM
PagedAttention): one task per sequence walks its cached tokens, block by
block, and computes every query head's scores against the K row of its KV
head (``h // (Hq / Hk)``), a softmax over them (max-subtracted, in float32),
and the weighted sum of V. numba compiles it
once per machine (cached on disk) and runs the tasks on its thread pool.

Float32 queries run here, over a float32 or bfloat16 cache (read through
``cpu_kv``; numba has no bfloat16 type); other dtypes, and tensors not on
the CPU, take the torch reference.
"""

from __future__ import annotations

import itertools

import numba
import numpy as np
import torch

from bargein.engine.kernels.cpu_kv import kernel_view, load, takes_caches
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref, paged_attention_prefill_ref

# Reassociation lets LLVM vectorize the dot products and sums over the head
# dimension; no "nnan"/"ninf": the running max starts at -inf.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def _takes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return q.dtype == torch.float32 and q.device.type == "cpu" and takes_caches(k_cache, v_cache)


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def _decode_kernel(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale32 = np.float32(scale)
    # One task per sequence: each cached token's K (then V) row holds all KV
    # heads side by side, so a task reads whole contiguous rows.
    for seq in numba.prange(num_seqs):
        length = seq_lens[seq]
        scores = np.empty((num_heads, length), dtype=np.float32)
        for pos in range(length):
            block, offset = block_tables[seq, pos // block_size], pos % block_size
            for head in range(num_heads):
                k_row = k_cache[block, offset, head // group]
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[seq, head, d] * load(k_row, d)
                scores[head, pos] = dot * scale32
        for head in range(num_heads):
            top = scores[head].max()
            total = np.float32(0.0)
            for pos in range(length):
                weight = np.exp(scores[head, pos] - top)
                scores[head, pos] = weight
                total += weight
            scores[head] /= total
        acc = np.zeros((num_heads, head_dim), dtype=np.float32)
        for pos in range(length):
            block, offset = block_tables[seq, pos // block_size], pos % block_size
            for head in range(num_heads):
                weight = scores[head, pos]
                v_row = v_cache[block, offset, head // group]
                for d in range(head_dim):
                    acc[head, d] += weight * load(v_row, d)
        out[seq] = acc


def paged_attention_decode_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention read straight from the blocks.

    Arguments, shapes and result as :func:`paged_attention_decode_ref` (the
    oracle it is tested against); block-table entries past a sequence's last
    block are not read. Float32 CPU tensors run the numba kernel; anything
    else takes the reference.
    """
    if not _takes(q, k_cache, v_cache):
        return paged_attention_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _decode_kernel(
        q.contiguous().numpy(),
        kernel_view(k_cache),
        kernel_view(v_cache),
        block_tables.to(torch.int32).contiguous().numpy(),
        seq_lens.to(torch.int32).contiguous().numpy(),
        float(scale),
        out.numpy(),
    )
    return out


@numba.njit(parallel=True, fastmath=_FASTMATH, cache=True, nogil=True)
def _prefill_kernel(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    scale32 = np.float32(scale)
    # One task per (sequence, KV head): it reads each cached K and V row of
    # its head once for all the chunk's queries of the heads that share it.
    for task in numba.prange(num_seqs * num_kv_heads):
        seq, kv_head = task // num_kv_heads, task % num_kv_heads
        first, length = query_start_loc[seq], seq_lens[seq]
        n = query_start_loc[seq + 1] - first
        context = length - n  # query j sits at position context + j
        scores = np.full((n, group, length), -np.inf, dtype=np.float32)
        for pos in range(length):
            block, offset = block_tables[seq, pos // block_size], pos % block_size
            k_row = k_cache[block, offset, kv_head]
            for j in range(max(0, pos - context), n):  # causal: rows at or after pos
                for g in range(group):
                    head = kv_head * group + g
                    dot = np.float32(0.0)
                    for d in range(head_dim):
                        dot += q[first + j, head, d] * load(k_row, d)
                    scores[j, g, pos] = dot * scale32
        for j in range(n):
            visible = context + j + 1
            for g in range(group):
                top = scores[j, g, :visible].max()
                total = np.float32(0.0)
                for pos in range(visible):
                    weight = np.exp(scores[j, g, pos] - top)
                    scores[j, g, pos] = weight
                    total += weight
                for pos in range(visible):
                    scores[j, g, pos] /= total
        acc = np.zeros((n, group, head_dim), dtype=np.float32)
        for pos in range(length):
            block, offset = block_tables[seq, pos // block_size], pos % block_size
            v_row = v_cache[block, offset, kv_head]
            for j in range(max(0, pos - context), n):
                for g in range(group):
                    weight = scores[j, g, pos]
                    for d in range(head_dim):
                        acc[j, g, d] += weight * load(v_row, d)
        for j in range(n):
            for g in range(group):
                out[first + j, kv_head * group + g] = acc[j, g]


# Chunks of at most this many query tokens run on the numba kernel above:
# the tail of a turn whose history is in the prefix cache is a few tokens
# over a long cached context, where gathering the context for SDPA in every
# layer costs more than reading it once from the blocks. Longer chunks (a
# fresh prompt) are matrix-matrix work, which SDPA does better.
# Measured: at 12 queries over 780 cached tokens about level with SDPA, ahead
# below; behind at 32.
SHORT_CHUNK_TOKENS = 16


def paged_attention_prefill_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Chunked prefill attention; short chunks read straight from the blocks.

    Arguments, shapes and result as :func:`paged_attention_prefill_ref` (the
    oracle it is tested against). When every chunk has at most
    ``SHORT_CHUNK_TOKENS`` tokens (float32 on the CPU), a numba kernel reads
    each sequence's cached K and V once per KV head for all the chunk's
    queries (causal: query ``j`` of ``n`` in a sequence of ``L`` sees the
    first ``L - n + j + 1`` positions, the reference's bottom-right aligned
    mask); otherwise the reference runs.
    """
    starts = query_start_loc.tolist()
    lengths = [b - a for a, b in itertools.pairwise(starts)]
    if not _takes(q, k_cache, v_cache) or not lengths or max(lengths) > SHORT_CHUNK_TOKENS:
        return paged_attention_prefill_ref(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale
        )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _prefill_kernel(
        q.contiguous().numpy(),
        kernel_view(k_cache),
        kernel_view(v_cache),
        block_tables.to(torch.int32).contiguous().numpy(),
        query_start_loc.to(torch.int32).contiguous().numpy(),
        seq_lens.to(torch.int32).contiguous().numpy(),
        float(scale),
        out.numpy(),
    )
    return out
