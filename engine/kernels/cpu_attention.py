"""Paged attention on the CPU in one fixed order of float32 operations (numba).

Every CPU attention path (decode, a prefill chunk, the tail of a turn over
a cached prefix; alone or in a batch, on one thread or several) computes a
query row's output with the same operations in the same order, so a
token's attention output is bit for bit the same whichever path computes
it (issue 37, "Exact by default"). The order is fixed in tokens, never in
a count of splits or threads: the fixed split-KV of SGLang's deterministic
mode and of He et al., "Defeating Nondeterminism in LLM Inference"
(Thinking Machines, 2025).

1. The query is rotated (by the caller, as torch's ``rotary_embedding_ref``
   rounds it) and multiplied by the softmax scale.
2. Its context ``[0, pos]`` is cut into tiles of ``TILE_TOKENS`` from
   position 0 (absolute positions: a chunk that starts at 37 does not shift
   the grid; the tile holding ``pos`` ends there).
3. Each tile alone: scores ``q . k`` (:func:`cpu_kv.dot`: 8 lanes of fused
   multiply-adds over the head dimension, added pairwise), their max, ``exp``
   of each score minus it, the sum of those (:func:`cpu_kv.dot` against
   ones), and ``sum p v`` accumulated key by key (:func:`cpu_kv.axpy`, one
   rounding per product).
4. The tiles are merged in order from position 0 up (:func:`_merge`: both
   sides rescaled to the larger max, FlashDecoding's log-sum-exp merge);
   the output is the accumulator divided by the sum.

Tiles are independent, so decode runs them as parallel tasks (split-K)
when sequences are fewer than cores, and prefill runs blocks of queries
as tasks: neither changes the order. No fastmath: without reassociation
LLVM vectorizes only what keeps each value's operations as written, and
the dot products are vector IR written out (``cpu_kv``), so the bits do
not depend on the kernel, the compile or, on FMA CPUs, the machine.

The ``exp`` is a polynomial (:func:`_exp`: 2^floor(y) built in the exponent
bits, 2^frac(y) a degree-5 fit, relative error 1.6e-7) since numba's LLVM
here has no vector math library; results match the torch references
(``paged_attention_decode_ref``, ``paged_attention_prefill_ref``, which
they are tested against) to float32 rounding.

Float32 queries run here, over a float32 or bfloat16 cache (read through
``cpu_kv``; numba has no bfloat16 type); other dtypes, and tensors not on
the CPU, take the torch reference.
"""

from __future__ import annotations

import itertools

import numba
import numpy as np
import torch

from bargein.engine.kernels.cpu_kv import axpy, bits_as_f32, dot, kernel_view, takes_caches
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref, paged_attention_prefill_ref

_F32 = np.float32

# Tokens per tile, the unit of the fixed order and of decode's split-K: a
# tile holds its scores at once (the old decode kernel's split, whose
# shortest length was 128 tokens: a shorter one cost more to launch and
# merge than it saved, docs/perf/step-profile.md).
TILE_TOKENS = 128
# Prefill queries per task: enough rows to reuse each K/V row loaded, and
# tasks enough to keep the cores busy on one sequence.
QUERY_BLOCK = 16
# the sum of a tile's exponentials is their dot product with ones
_ONES = np.ones(TILE_TOKENS, dtype=np.float32)

# exp(x) as 2^y, y = x log2(e) (see the module docstring).
_LOG2E = _F32(1.4426950408889634)
_C5, _C4, _C3, _C2, _C1, _C0 = (
    _F32(0.0018762329127639532),
    _F32(0.00899258442223072),
    _F32(0.05582360550761223),
    _F32(0.24015453457832336),
    _F32(0.6931529641151428),
    _F32(0.9999999403953552),
)
# exp below this underflows float32's normal range; 2^-126 is its floor
_EXP_FLOOR = _F32(-87.0)


def _takes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    return q.dtype == torch.float32 and q.device.type == "cpu" and takes_caches(k_cache, v_cache)


@numba.njit(cache=True, nogil=True, inline="always")
def _exp(x: float) -> np.float32:  # pragma: no cover - compiled
    """``exp(x)`` of a float32 ``x <= 0`` to about one ulp; ``x < -87`` gives
    ``exp(-87)``, not a denormal."""
    y = max(_F32(x), _EXP_FLOOR) * _LOG2E
    whole = np.floor(y)
    f = y - whole
    poly = ((((_C5 * f + _C4) * f + _C3) * f + _C2) * f + _C1) * f + _C0
    return poly * bits_as_f32(np.uint32((np.int32(whole) + np.int32(127)) << np.int32(23)))


@numba.njit(cache=True, nogil=True, inline="always")
def _attend_tile(
    qs: np.ndarray,
    row_pos: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table_row: np.ndarray,
    row_kv: np.ndarray,
    first: int,
    last: int,
    m: np.ndarray,
    s: np.ndarray,
    acc: np.ndarray,
    scores: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrappers
    """One tile's softmax partial for query rows of one sequence.

    Args:
        qs: ``[R, D]`` float32 scaled queries.
        row_pos: ``[R]`` each row's position: it reads keys ``<=`` it.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]`` kernel views.
        table_row: ``[max_blocks]`` the sequence's block ids.
        row_kv: ``[R]`` each row's KV head.
        first, last: the tile's tokens ``[first, last)``: ``first`` a
            multiple of ``TILE_TOKENS``, ``last`` at most ``first +
            TILE_TOKENS`` and past every row's position that falls in it.
        m, s, acc: ``[R]``, ``[R]``, ``[R, D]`` float32, set here: each row's
            max score over the tile, sum of ``exp(score - max)`` and the
            unnormalized ``sum exp(score - max) v`` (a row that sees no key
            of the tile: ``-inf``, 0, 0).
        scores: ``[R, TILE_TOKENS]`` float32 scratch.
    """
    num_rows = qs.shape[0]
    block_size = k_cache.shape[1]
    m[:] = -np.inf
    s[:] = 0.0
    acc[:] = 0.0
    # key by key, all rows: each token's K (then V) row holds every KV head
    # side by side, read once for all the query heads
    for key in range(first, last):
        block, offset = table_row[key // block_size], key % block_size
        for r in range(num_rows):
            if row_pos[r] >= key:
                score = dot(qs[r], k_cache[block, offset, row_kv[r]])
                scores[r, key - first] = score
                # the max is exact in any order: kept here, not in a pass of its own
                if score > m[r]:
                    m[r] = score
    for r in range(num_rows):
        count = min(last, row_pos[r] + 1) - first
        if count <= 0:
            continue
        row, top = scores[r, :count], m[r]
        for i in range(count):
            row[i] = _exp(row[i] - top)
        s[r] = dot(row, _ONES[:count])
    for key in range(first, last):
        block, offset = table_row[key // block_size], key % block_size
        for r in range(num_rows):
            if row_pos[r] >= key:
                axpy(acc[r], scores[r, key - first], v_cache[block, offset, row_kv[r]])


@numba.njit(cache=True, nogil=True, inline="always")
def _merge(
    m: np.ndarray, s: np.ndarray, acc: np.ndarray, r: int, top: float, total: float, part: np.ndarray
) -> None:  # pragma: no cover - compiled, tested through the wrappers
    """Fold one tile's ``(top, total, part [D])`` into row ``r`` of the state
    ``m, s [R], acc [R, D]`` (the later tile second); an empty tile
    (``total == 0``) changes nothing, the first one is copied."""
    if total == 0.0:
        return
    old = m[r]
    if old == -np.inf:
        m[r], s[r] = top, total
        acc[r, :] = part
        return
    new = max(old, top)
    a = _F32(1.0) if old == new else _exp(old - new)
    b = _F32(1.0) if top == new else _exp(top - new)
    m[r] = new
    s[r] = s[r] * a + total * b
    acc_row = acc[r]
    for d in range(acc_row.shape[0]):
        acc_row[d] = acc_row[d] * a + part[d] * b


@numba.njit(cache=True, nogil=True, inline="always")
def decode_tile_task(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    table_row: np.ndarray,
    length: int,
    tile: int,
    tops: np.ndarray,
    sums: np.ndarray,
    accs: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrappers
    """Tile ``tile`` of one decode sequence: ``q [Hq, D]`` scaled, the query
    at ``length - 1``; ``tops, sums [Hq]`` and ``accs [Hq, D]`` set (left as
    they are past the context)."""
    first = tile * TILE_TOKENS
    if first >= length:
        return
    last = min(length, first + TILE_TOKENS)
    num_heads = q.shape[0]
    group = num_heads // k_cache.shape[2]
    row_pos = np.full(num_heads, length - 1, dtype=np.int64)
    row_kv = np.arange(num_heads) // group
    scores = np.empty((num_heads, TILE_TOKENS), dtype=np.float32)
    _attend_tile(q, row_pos, k_cache, v_cache, table_row, row_kv, first, last, tops, sums, accs, scores)


@numba.njit(cache=True, nogil=True, inline="always")
def decode_merge(
    tops: np.ndarray, sums: np.ndarray, accs: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled, tested through the wrappers
    """One sequence's tiles ``tops, sums [tiles, Hq]``, ``accs [tiles, Hq, D]``
    merged in order into ``out [Hq, D]``."""
    num_tiles, num_heads = tops.shape
    m = np.full(num_heads, -np.inf, dtype=np.float32)
    s = np.zeros(num_heads, dtype=np.float32)
    acc = np.zeros((num_heads, out.shape[1]), dtype=np.float32)
    for tile in range(num_tiles):
        for head in range(num_heads):
            _merge(m, s, acc, head, tops[tile, head], sums[tile, head], accs[tile, head])
    for head in range(num_heads):
        out_row, acc_row, total = out[head], acc[head], s[head]
        for d in range(out_row.shape[0]):
            out_row[d] = acc_row[d] / total


def num_tiles(max_seq_len: int) -> int:
    """Tiles of the longest context: ``ceil(max_seq_len / TILE_TOKENS)``."""
    return max(1, -(-max_seq_len // TILE_TOKENS))


@numba.njit(parallel=True, cache=True, nogil=True)
def _decode_kernel(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    max_tiles: int,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_seqs, num_heads, head_dim = q.shape
    scale32 = _F32(scale)
    qs = np.empty((num_seqs, num_heads, head_dim), dtype=np.float32)
    for seq in numba.prange(num_seqs):
        for head in range(num_heads):
            for d in range(head_dim):
                qs[seq, head, d] = q[seq, head, d] * scale32
    tops = np.full((num_seqs, max_tiles, num_heads), -np.inf, dtype=np.float32)
    sums = np.zeros((num_seqs, max_tiles, num_heads), dtype=np.float32)
    accs = np.zeros((num_seqs, max_tiles, num_heads, head_dim), dtype=np.float32)
    for task in numba.prange(num_seqs * max_tiles):
        seq, tile = task // max_tiles, task % max_tiles
        decode_tile_task(
            qs[seq],
            k_cache,
            v_cache,
            block_tables[seq],
            seq_lens[seq],
            tile,
            tops[seq, tile],
            sums[seq, tile],
            accs[seq, tile],
        )
    for seq in numba.prange(num_seqs):
        decode_merge(tops[seq], sums[seq], accs[seq], out[seq])


def paged_attention_decode_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention read straight from the blocks, in the module's fixed order.

    Arguments, shapes and result as :func:`paged_attention_decode_ref` (the
    oracle it is tested against); block-table entries past a sequence's last
    block are not read. Float32 CPU tensors run the numba kernel (one task
    per tile of ``TILE_TOKENS`` of each context); anything else takes the
    reference.
    """
    if not _takes(q, k_cache, v_cache):
        return paged_attention_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lens = seq_lens.to(torch.int32).contiguous()
    _decode_kernel(
        q.contiguous().numpy(),
        kernel_view(k_cache),
        kernel_view(v_cache),
        block_tables.to(torch.int32).contiguous().numpy(),
        lens.numpy(),
        float(scale),
        num_tiles(int(lens.max())),
        out.numpy(),
    )
    return out


@numba.njit(parallel=True, cache=True, nogil=True)
def _prefill_kernel(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    tasks: np.ndarray,
    scale: float,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale32 = _F32(scale)
    # One task per (sequence, KV head, block of QUERY_BLOCK queries): its rows
    # are the block's queries times the heads that share the KV head, so each
    # K and V row it loads serves all of them.
    for task in numba.prange(tasks.shape[0]):
        seq, kv_head, j0 = tasks[task, 0], tasks[task, 1], tasks[task, 2]
        first_row = query_start_loc[seq]
        n = query_start_loc[seq + 1] - first_row
        context = seq_lens[seq] - n  # query j sits at position context + j
        j1 = min(n, j0 + QUERY_BLOCK)
        num_rows = (j1 - j0) * group
        qs = np.empty((num_rows, head_dim), dtype=np.float32)
        row_pos = np.empty(num_rows, dtype=np.int64)
        row_kv = np.full(num_rows, kv_head, dtype=np.int64)
        for j in range(j0, j1):
            for g in range(group):
                r = (j - j0) * group + g
                row_pos[r] = context + j
                for d in range(head_dim):
                    qs[r, d] = q[first_row + j, kv_head * group + g, d] * scale32
        m = np.full(num_rows, -np.inf, dtype=np.float32)
        s = np.zeros(num_rows, dtype=np.float32)
        acc = np.zeros((num_rows, head_dim), dtype=np.float32)
        tile_m = np.empty(num_rows, dtype=np.float32)
        tile_s = np.empty(num_rows, dtype=np.float32)
        tile_acc = np.empty((num_rows, head_dim), dtype=np.float32)
        scores = np.empty((num_rows, TILE_TOKENS), dtype=np.float32)
        end = context + j1  # one past the block's last position
        for first in range(0, end, TILE_TOKENS):
            _attend_tile(
                qs,
                row_pos,
                k_cache,
                v_cache,
                block_tables[seq],
                row_kv,
                first,
                min(end, first + TILE_TOKENS),
                tile_m,
                tile_s,
                tile_acc,
                scores,
            )
            for r in range(num_rows):
                _merge(m, s, acc, r, tile_m[r], tile_s[r], tile_acc[r])
        for r in range(num_rows):
            out_row, acc_row, total = (
                out[first_row + j0 + r // group, kv_head * group + r % group],
                acc[r],
                s[r],
            )
            for d in range(head_dim):
                out_row[d] = acc_row[d] / total


def _prefill_tasks(starts: list[int], num_kv_heads: int) -> np.ndarray:
    """``[num_tasks, 3]`` int64 ``(sequence, kv_head, first query)`` of every
    ``QUERY_BLOCK`` of queries of every chunk, per KV head."""
    return np.array(
        [
            (seq, kv_head, j0)
            for seq, (a, b) in enumerate(itertools.pairwise(starts))
            for kv_head in range(num_kv_heads)
            for j0 in range(0, b - a, QUERY_BLOCK)
        ],
        dtype=np.int64,
    ).reshape(-1, 3)


def paged_attention_prefill_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Chunked prefill attention read straight from the blocks, in the module's fixed order.

    Arguments, shapes and result as :func:`paged_attention_prefill_ref` (the
    oracle it is tested against): query ``j`` of ``n`` in a sequence of
    ``L`` sees the first ``L - n + j + 1`` positions (the reference's
    bottom-right aligned mask). Each query's output is bit for bit what
    :func:`paged_attention_decode_cpu` gives for it at the same position
    over the same cache, whatever the chunking. Float32 CPU tensors run the
    numba kernel; anything else takes the reference.
    """
    if not _takes(q, k_cache, v_cache):
        return paged_attention_prefill_ref(
            q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale
        )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    starts = query_start_loc.to(torch.int32).contiguous()
    _prefill_kernel(
        q.contiguous().numpy(),
        kernel_view(k_cache),
        kernel_view(v_cache),
        block_tables.to(torch.int32).contiguous().numpy(),
        starts.numpy(),
        seq_lens.to(torch.int32).contiguous().numpy(),
        _prefill_tasks(starts.tolist(), k_cache.shape[2]),
        float(scale),
        out.numpy(),
    )
    return out
