"""Attention over the paged KV cache: batched decode and varlen prefill.

Scaled dot-product attention (Vaswani et al. 2017) where each sequence's keys
and values live in fixed-size blocks named by its block table (Kwon et al.
2023, vLLM PagedAttention). Grouped-query attention: query head ``h`` reads KV
head ``h // (Hq // Hk)``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from bargein.engine.kernels._triton import check_tensor, dot_dtype, lazy_jit, next_power_of_2, tl


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``cache[block_ids]`` flattened over blocks: ``[..., n * block_size, Hk, D]``.

    ``index_select`` over whole-block rows, not advanced indexing: on a busy
    CPU the latter goes parallel even for a few blocks and waits on a
    descheduled thread (measured: 0.02 ms against ~20 ms for 8 blocks).
    """
    rows = torch.index_select(cache.flatten(1), 0, block_ids.flatten())
    return rows.view(*block_ids.shape[:-1], block_ids.shape[-1] * cache.shape[1], *cache.shape[2:])


def paged_attention_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference of decode attention: one query token per sequence.

    All sequences' blocks are gathered at once into ``[B, max_len, Hk, D]``
    and positions past each ``seq_len`` are masked (one batched SDPA call
    beats a Python loop over sequences on the CPU).

    Args:
        q: ``[B, Hq, D]``, the query of each sequence's newest token.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]``, any float
            dtype (read as ``q.dtype``).
        block_tables: ``[B, max_blocks]`` int32; entries past a sequence's
            last block must be valid block ids (they are masked).
        seq_lens: ``[B]`` int32, tokens in the cache (including the new one).
        scale: softmax scale, usually ``D ** -0.5``.

    Returns:
        ``[B, Hq, D]`` in ``q.dtype``. No input is mutated.
    """
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    block_ids = block_tables[:, :num_blocks].long()
    k = _gather(k_cache, block_ids).transpose(1, 2).to(q.dtype)  # [B, Hk, L, D]
    v = _gather(v_cache, block_ids).transpose(1, 2).to(q.dtype)
    positions = torch.arange(k.shape[2], device=q.device)
    mask = (positions[None, :] < seq_lens[:, None]).view(q.shape[0], 1, 1, -1)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k,
        v,
        attn_mask=mask,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.squeeze(2)


def _prefill_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal SDPA of ``q [n, Hq, D]`` over ``k, v [L, Hk, D]``, ``L >= n``."""
    n, seq_len = q.shape[0], k.shape[0]
    gqa = q.shape[1] != k.shape[1]
    qt, kt, vt = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if n == seq_len:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        # query j sits at position seq_len - n + j (bottom-right aligned causal mask)
        rows = torch.arange(seq_len - n, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows[:, None]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(0, 1)


def paged_attention_prefill_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference of varlen (chunked) prefill attention.

    Sequence ``s`` owns query rows ``query_start_loc[s]:query_start_loc[s+1]``;
    its query token ``j`` sits at position ``seq_lens[s] - query_len[s] + j``
    and attends to cache positions ``<=`` it (its cached prefix and the chunk,
    which must already be written to the cache).

    Args:
        q: ``[T, Hq, D]`` queries of all sequences, concatenated.
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]``, any float
            dtype (read as ``q.dtype``).
        block_tables: ``[S, max_blocks]`` int32.
        query_start_loc: ``[S + 1]`` int32 cumulative query lengths.
        seq_lens: ``[S]`` int32 total tokens of each sequence after the chunk.
        scale: softmax scale.

    Returns:
        ``[T, Hq, D]`` in ``q.dtype``. No input is mutated.
    """
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    out = torch.empty_like(q)
    for s, seq_len in enumerate(seq_lens.tolist()):
        block_ids = block_tables[s, : -(-seq_len // block_size)].long()
        k = _gather(k_cache, block_ids)[:seq_len].to(q.dtype)
        v = _gather(v_cache, block_ids)[:seq_len].to(q.dtype)
        out[starts[s] : starts[s + 1]] = _prefill_one(q[starts[s] : starts[s + 1]], k, v, scale)
    return out


# log2(e): the kernels use exp2, so the softmax scale is folded into the scores.
_LOG2E = 1.4426950408889634


@lazy_jit
def _paged_attention_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    qk_scale,
    q_seq_stride,
    q_head_stride,
    out_seq_stride,
    out_head_stride,
    out_split_stride,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    table_row_stride,
    group_size,
    head_dim,
    block_size,
    tokens_per_split,
    SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``(seq, kv_head, split)``: online softmax of the group's queries over one KV range.

    The ``group_size`` query heads that share a KV head are one ``[BLOCK_G, D]``
    tile, so each key and value is read once per group (GQA). Keys
    ``[split * tokens_per_split, ...)`` up to ``seq_len`` are gathered through
    the block table ``BLOCK_N`` tokens at a time (FlashAttention's running
    max and sum, Dao et al. 2022; split-K as in FlashDecoding). Without
    ``SPLIT`` it writes the normalised output; with it, the unnormalised
    float32 accumulator and the running max ``m`` and sum ``l`` (log2 domain)
    for ``_paged_attention_reduce_kernel``.
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * group_size + groups
    q_mask = (groups[:, None] < group_size) & (dims[None, :] < head_dim)
    q = tl.load(
        q_ptr + seq * q_seq_stride + heads[:, None] * q_head_stride + dims[None, :], mask=q_mask, other=0.0
    )
    q = q.to(DOT_DTYPE)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        tokens = n0 + tl.arange(0, BLOCK_N)
        t_mask = tokens < end
        block_ids = tl.load(
            block_tables_ptr + seq * table_row_stride + tokens // block_size, mask=t_mask, other=0
        )
        rows = block_ids.to(tl.int64) * cache_block_stride + (tokens % block_size) * cache_slot_stride
        kv_off = rows[:, None] + kv_head * cache_head_stride + dims[None, :]
        kv_mask = t_mask[:, None] & (dims[None, :] < head_dim)
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out_off = seq * out_seq_stride + heads[:, None] * out_head_stride + dims[None, :]
    if SPLIT:
        tl.store(out_ptr + out_off + split * out_split_stride, acc, mask=q_mask)
        ml_off = (seq * tl.num_programs(1) * group_size + heads) * tl.num_programs(2) + split
        tl.store(m_ptr + ml_off, m_i, mask=groups < group_size)
        tl.store(l_ptr + ml_off, l_i, mask=groups < group_size)
    else:
        out = acc / l_i[:, None]
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@lazy_jit
def _paged_attention_reduce_kernel(
    partial_ptr,
    m_ptr,
    l_ptr,
    out_ptr,
    partial_head_stride,
    partial_split_stride,
    out_head_stride,
    num_splits,
    head_dim,
    BLOCK_D: tl.constexpr,
):
    """Program ``(seq * Hq + head)``: merge the splits' partial softmaxes (log-sum-exp in base 2)
    one after another from the first, so the sum's order is the same whatever
    the number of (trailing, empty) splits the batch's widest table gives."""
    row = tl.program_id(0).to(tl.int64)  # seq * Hq + head: partials are [B*Hq, splits, D]
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < head_dim
    m_max = float("-inf")
    for split in range(num_splits):
        m_max = tl.maximum(m_max, tl.load(m_ptr + row * num_splits + split))
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = 0.0
    for split in range(num_splits):
        m = tl.load(m_ptr + row * num_splits + split)
        # a split past its sequence's end has m = -inf and l = 0: weight 0, adds exactly 0
        weight = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)
        part = tl.load(
            partial_ptr + row * partial_head_stride + split * partial_split_stride + dims,
            mask=d_mask,
            other=0.0,
        )
        acc = acc + part * weight
        total = total + tl.load(l_ptr + row * num_splits + split) * weight
    tl.store(out_ptr + row * out_head_stride + dims, (acc / total).to(out_ptr.dtype.element_ty), mask=d_mask)


def _check_paged_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor
) -> None:
    """Shared asserts of both attention launchers."""
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4, q.dtype)
    check_tensor("v_cache", v_cache, 4, q.dtype)
    check_tensor("block_tables", block_tables, 2, torch.int32)
    assert v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(), (
        "K and V caches must match"
    )
    num_q_heads, head_dim, num_kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    assert k_cache.shape[3] == head_dim, f"cache {tuple(k_cache.shape)} vs q {tuple(q.shape)}"
    assert num_q_heads % num_kv_heads == 0, f"{num_q_heads=} must be a multiple of {num_kv_heads=}"
    assert head_dim >= 16, f"{head_dim=} must be >= 16 (tl.dot's smallest tile)"


def _dot_precision(q: torch.Tensor) -> str:
    """float32 dots in full precision (tf32 would miss the fp32 tolerance); others natively."""
    return "ieee" if q.dtype == torch.float32 or not q.is_cuda else "tf32"


@functools.cache
def _num_sms(device_index: int | None) -> int:
    """Multiprocessors of a CUDA device (asked once: this runs on every decode launch)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Tokens per decode split (split-K), fixed so that a sequence's splits, and
# so its output's bits, depend on its own length alone, never on the batch
# or the GPU (the fixed split-KV of SGLang's deterministic mode; issue 37).
# 256 tokens on CUDA (the shortest split worth a partial's write and read
# when this was sized), 64 on the interpreter so that small tests cover it;
# whole BLOCK_N tiles either way.
DECODE_SPLIT_TOKENS_CUDA = 256
DECODE_SPLIT_TOKENS_INTERPRETER = 64


def _decode_num_splits(max_context: int, device: torch.device) -> tuple[int, int]:
    """``(num_splits, tokens_per_split)`` for split-K decode over a table of
    ``max_context`` tokens: splits of a fixed size (see above), the ones past
    a shorter sequence's end empty. The partials cost ``B * Hq * splits * (D + 2)``
    float32 writes and reads, small beside the K and V they stand for."""
    tokens_per_split = DECODE_SPLIT_TOKENS_CUDA if device.type == "cuda" else DECODE_SPLIT_TOKENS_INTERPRETER
    return max(1, -(-max_context // tokens_per_split)), tokens_per_split


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Triton decode attention over the paged cache; same contract as ``paged_attention_decode_ref``.

    Splits contexts into ranges of a fixed number of tokens reduced in order
    by a second kernel (``_decode_num_splits``), so a sequence's output does
    not depend on the batch. No host sync: the context bound is the block
    table's width.

    Raises:
        AssertionError: shapes, dtypes or strides the kernel does not take.
    """
    _check_paged_inputs(q, k_cache, v_cache, block_tables)
    check_tensor("seq_lens", seq_lens, 1, torch.int32)
    num_seqs, num_q_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    assert block_tables.shape[0] == num_seqs and seq_lens.shape == (num_seqs,), (
        "one table row and length per query"
    )
    out = torch.empty((num_seqs, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    num_splits, tokens_per_split = _decode_num_splits(block_tables.shape[1] * block_size, q.device)
    return _launch_decode(
        q, k_cache, v_cache, block_tables, seq_lens, scale, out, num_splits, tokens_per_split
    )


def _launch_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    num_splits: int,
    tokens_per_split: int,
) -> torch.Tensor:
    """Run the decode kernel (and the reduce kernel when ``num_splits > 1``) into ``out``."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert num_splits * tokens_per_split >= block_tables.shape[1] * k_cache.shape[1], (
        "splits must cover the table"
    )
    block_d = max(16, next_power_of_2(head_dim))
    split = num_splits > 1
    target = out
    m = l = out  # unused without split
    if split:
        target = torch.empty(
            (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        m = torch.empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
    _paged_attention_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        target,
        m,
        l,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        target.stride(0),
        target.stride(1),
        target.stride(2) if split else 0,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        num_q_heads // num_kv_heads,
        head_dim,
        k_cache.shape[1],
        tokens_per_split,
        SPLIT=split,
        BLOCK_G=max(16, next_power_of_2(num_q_heads // num_kv_heads)),
        BLOCK_N=64,
        BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype(q),
        DOT_PRECISION=_dot_precision(q),
    )
    if split:
        _paged_attention_reduce_kernel[(num_seqs * num_q_heads,)](
            target,
            m,
            l,
            out,
            target.stride(1),
            target.stride(2),
            out.stride(1),
            num_splits,
            head_dim,
            BLOCK_D=block_d,
        )
    return out


@lazy_jit
def _paged_attention_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,
    q_token_stride,
    q_head_stride,
    out_token_stride,
    out_head_stride,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    table_row_stride,
    group_size,
    head_dim,
    block_size,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``(seq, query tile, q_head)``: causal online softmax over the cached prefix and the chunk.

    Query row ``j`` of sequence ``seq`` sits at position ``seq_len - query_len + j``
    and attends to cache positions ``<=`` it; keys are gathered through the
    block table ``BLOCK_N`` at a time and stop at the tile's last position
    (FlashAttention-2, Dao 2023, over a paged cache). Query tiles are
    aligned to absolute positions (tile ``t`` holds positions ``[(context //
    BLOCK_M + t) * BLOCK_M, ...)``, rows before the chunk masked), so a
    position sits in the same row of its tile whatever the chunking: its
    bits do not depend on where a chunk starts. Tiles past the chunk return
    at once.
    """
    seq = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - query_len
    shift = context % BLOCK_M  # the chunk's first row sits at this row of its tile
    if tile * BLOCK_M - shift >= query_len:
        return
    rows = tile * BLOCK_M - shift + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_pos = context + rows
    q_mask = ((rows >= 0) & (rows < query_len))[:, None] & (dims[None, :] < head_dim)
    q_off = (q_start + rows)[:, None] * q_token_stride + head * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0).to(DOT_DTYPE)
    kv_head = head // group_size
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum(seq_len, context + (tile + 1) * BLOCK_M - shift)
    for n0 in range(0, end, BLOCK_N):
        tokens = n0 + tl.arange(0, BLOCK_N)
        t_mask = tokens < end
        block_ids = tl.load(
            block_tables_ptr + seq * table_row_stride + tokens // block_size, mask=t_mask, other=0
        )
        slots = block_ids.to(tl.int64) * cache_block_stride + (tokens % block_size) * cache_slot_stride
        kv_off = slots[:, None] + kv_head * cache_head_stride + dims[None, :]
        kv_mask = t_mask[:, None] & (dims[None, :] < head_dim)
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        s = tl.where(t_mask[None, :] & (tokens[None, :] <= q_pos[:, None]), s, float("-inf"))
        # every row sees key 0 in the first tile, so m_new is finite from then on
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out_off = (q_start + rows)[:, None] * out_token_stride + head * out_head_stride + dims[None, :]
    tl.store(out_ptr + out_off, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Triton varlen prefill attention over the paged cache; same contract as ``paged_attention_prefill_ref``.

    The grid covers ``cdiv(T, BLOCK_M)`` query tiles per sequence (``T`` bounds
    every query length without a host sync); tiles past a sequence's chunk
    exit at once.

    Raises:
        AssertionError: shapes, dtypes or strides the kernel does not take.
    """
    _check_paged_inputs(q, k_cache, v_cache, block_tables)
    check_tensor("query_start_loc", query_start_loc, 1, torch.int32)
    check_tensor("seq_lens", seq_lens, 1, torch.int32)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs, num_kv_heads = seq_lens.shape[0], k_cache.shape[2]
    assert query_start_loc.shape == (num_seqs + 1,), (
        f"query_start_loc {tuple(query_start_loc.shape)} != ({num_seqs + 1},)"
    )
    assert block_tables.shape[0] == num_seqs, (
        f"block_tables {tuple(block_tables.shape)} vs {num_seqs} sequences"
    )
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    block_m = 64 if q.is_cuda else 16
    # one tile more than the tokens need: a chunk's tiles start at its first position's tile
    grid = (num_seqs, -(-num_tokens // block_m) + 1, num_q_heads)
    _paged_attention_prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        num_q_heads // num_kv_heads,
        head_dim,
        k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=block_m,
        BLOCK_D=max(16, next_power_of_2(head_dim)),
        DOT_DTYPE=dot_dtype(q),
        DOT_PRECISION=_dot_precision(q),
    )
    return out
