"""Attention over the paged KV cache: batched decode and varlen prefill.

Scaled dot-product attention (Vaswani et al. 2017) where each sequence's keys
and values live in fixed-size blocks named by its block table (Kwon et al.
2023, vLLM PagedAttention). Grouped-query attention: query head ``h`` reads KV
head ``h // (Hq // Hk)``.
"""

from __future__ import annotations

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
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    qk_scale,
    q_token_stride,
    q_head_stride,
    out_token_stride,
    out_head_stride,
    out_split_stride,
    cache_block_stride,
    cache_slot_stride,
    cache_head_stride,
    table_row_stride,
    group_size,
    head_dim,
    block_size,
    num_splits,
    tokens_per_split,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``(seq, query tile * num_splits + split, q_head)``: causal online
    softmax of one query tile over one fixed range of the paged KV.

    Decode and prefill both run here (a decode is a chunk of one query), so a
    position's attention has one arithmetic whichever step computes it.
    Query row ``j`` of sequence ``seq`` sits at position ``seq_len - query_len + j``
    and attends to cache positions ``<=`` it. Query tiles are aligned to
    absolute positions (tile ``t`` holds positions ``[(context // BLOCK_M + t)
    * BLOCK_M, ...)``, rows outside the chunk masked), so a position sits in
    the same row of its tile whatever the chunking. Keys are read in splits of
    ``tokens_per_split`` from position 0 (split-K, FlashDecoding), each split
    ``BLOCK_N`` tokens at a time through the block table (FlashAttention-2's
    running max and sum, Dao 2023). Without ``SPLIT`` (one split) it writes
    the normalised output; with it, each split's unnormalised float32
    accumulator and its running max ``m`` and sum ``l`` (log2 domain) for
    ``_paged_attention_reduce_kernel``; a split past the tile's last
    position writes ``m = -inf, l = 0`` (it weighs nothing there). Tiles past
    the chunk return at once.
    """
    seq = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1) // num_splits
    split = tl.program_id(1) % num_splits
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
    row_mask = (rows >= 0) & (rows < query_len)
    q_mask = row_mask[:, None] & (dims[None, :] < head_dim)
    q_off = (q_start + rows)[:, None] * q_token_stride + head * q_head_stride + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0).to(DOT_DTYPE)
    kv_head = head // group_size
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    start = split * tokens_per_split
    # the tile's last position + 1; a split starting past it has nothing to read
    end = tl.minimum(tl.minimum(seq_len, context + (tile + 1) * BLOCK_M - shift), start + tokens_per_split)
    # Splits and tiles are whole multiples of BLOCK_M (the launcher checks), so
    # every row of a tile whose split is not empty sees that split's first key:
    # its running max is finite after the first BLOCK_N keys.
    for n0 in range(start, end, BLOCK_N):
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
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out_off = (q_start + rows)[:, None] * out_token_stride + head * out_head_stride + dims[None, :]
    if SPLIT:
        tl.store(out_ptr + out_off + split * out_split_stride, acc, mask=q_mask)
        ml_off = ((q_start + rows) * tl.num_programs(2) + head) * num_splits + split
        tl.store(m_ptr + ml_off, m_i, mask=row_mask)
        tl.store(l_ptr + ml_off, l_i, mask=row_mask)
    else:
        tl.store(out_ptr + out_off, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=q_mask)


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
    """Program ``(token * Hq + head)``: merge the splits' partial softmaxes (log-sum-exp in base 2)
    one after another from the first, so the sum's order is the same whatever
    the number of (trailing, empty) splits the batch's widest table gives."""
    row = tl.program_id(0).to(tl.int64)  # token * Hq + head: partials are [T*Hq, splits, D]
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < head_dim
    m_max = float("-inf")
    for split in range(num_splits):
        m_max = tl.maximum(m_max, tl.load(m_ptr + row * num_splits + split))
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = 0.0
    for split in range(num_splits):
        m = tl.load(m_ptr + row * num_splits + split)
        # an empty split has m = -inf and l = 0: weight 0, adds exactly 0
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


# Query tile and key tile of the kernel, one size for decode and prefill (the
# same tl.dot shapes, so the same reduction order per row on the GPU). 64 on
# CUDA; 16 on the interpreter, which small tests then cover with many tiles.
BLOCK_CUDA = 64
BLOCK_INTERPRETER = 16
# Tokens per KV split (split-K), fixed so that a position's splits, and so its
# output's bits, depend on its own position alone, never on the batch, the
# chunk or the GPU (the fixed split-KV of SGLang's deterministic mode; issue
# 37). 256 tokens on CUDA (the shortest split worth a partial's write and read
# when this was sized), 64 on the interpreter; whole tiles either way.
SPLIT_TOKENS_CUDA = 256
SPLIT_TOKENS_INTERPRETER = 64


def _tiling(device: torch.device) -> tuple[int, int]:
    """``(block, tokens_per_split)`` on ``device``."""
    if device.type == "cuda":
        return BLOCK_CUDA, SPLIT_TOKENS_CUDA
    return BLOCK_INTERPRETER, SPLIT_TOKENS_INTERPRETER


def _num_splits(table_tokens: int, tokens_per_split: int) -> int:
    """Splits covering a block table of ``table_tokens`` tokens; those past a
    shorter sequence's end are empty. The partials cost ``T * Hq * splits *
    (D + 2)`` float32 writes and reads, small beside the K and V they stand for."""
    return max(1, -(-table_tokens // tokens_per_split))


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Triton decode attention over the paged cache; same contract as ``paged_attention_decode_ref``.

    The prefill kernel with chunks of one query (so a position's output has
    the same bits decoded or prefilled: a preemption's recompute or a
    takeover's re-prefill writes the K/V the decode wrote), over fixed
    splits reduced in order. No host sync: the context bound is the block
    table's width. One program per query head: a GQA group's K and V are
    read once per head, not once per group (unmeasured on a GPU).

    Raises:
        AssertionError: shapes, dtypes or strides the kernel does not take.
    """
    _check_paged_inputs(q, k_cache, v_cache, block_tables)
    check_tensor("seq_lens", seq_lens, 1, torch.int32)
    num_seqs = q.shape[0]
    assert block_tables.shape[0] == num_seqs and seq_lens.shape == (num_seqs,), (
        "one table row and length per query"
    )
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    _, tokens_per_split = _tiling(q.device)
    num_splits = _num_splits(block_tables.shape[1] * k_cache.shape[1], tokens_per_split)
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
    """Decode as chunks of one query into ``out``, over ``num_splits`` splits of ``tokens_per_split``."""
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    block, _ = _tiling(q.device)
    return _launch(
        q,
        k_cache,
        v_cache,
        block_tables,
        starts,
        seq_lens,
        scale,
        out,
        num_splits,
        tokens_per_split,
        1,
        block,
    )


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

    The grid covers ``cdiv(T, BLOCK) + 1`` query tiles per sequence (``T``
    bounds every query length without a host sync) times the table's fixed
    splits; tiles past a sequence's chunk exit at once.

    Raises:
        AssertionError: shapes, dtypes or strides the kernel does not take.
    """
    _check_paged_inputs(q, k_cache, v_cache, block_tables)
    check_tensor("query_start_loc", query_start_loc, 1, torch.int32)
    check_tensor("seq_lens", seq_lens, 1, torch.int32)
    num_tokens = q.shape[0]
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.shape == (num_seqs + 1,), (
        f"query_start_loc {tuple(query_start_loc.shape)} != ({num_seqs + 1},)"
    )
    assert block_tables.shape[0] == num_seqs, (
        f"block_tables {tuple(block_tables.shape)} vs {num_seqs} sequences"
    )
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    block, tokens_per_split = _tiling(q.device)
    num_splits = _num_splits(block_tables.shape[1] * k_cache.shape[1], tokens_per_split)
    # one tile more than the tokens need: a chunk's tiles start at its first position's tile
    num_tiles = -(-num_tokens // block) + 1
    return _launch(
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale,
        out,
        num_splits,
        tokens_per_split,
        num_tiles,
        block,
    )


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    num_splits: int,
    tokens_per_split: int,
    num_tiles: int,
    block: int,
) -> torch.Tensor:
    """Run the attention kernel (and the reduce kernel when ``num_splits > 1``) into ``out``
    (``[T, Hq, D]``, contiguous)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs, num_kv_heads = seq_lens.shape[0], k_cache.shape[2]
    assert num_splits * tokens_per_split >= block_tables.shape[1] * k_cache.shape[1], (
        "splits must cover the table"
    )
    assert tokens_per_split % block == 0, f"{tokens_per_split=} must be whole tiles of {block}"
    assert out.is_contiguous() and out.shape == q.shape, "out: [T, Hq, D], contiguous"
    block_d = max(16, next_power_of_2(head_dim))
    split = num_splits > 1
    target = m = l = out  # m, l unused without split
    if split:
        target = torch.empty(
            (num_tokens, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        m = torch.empty((num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
    _paged_attention_kernel[(num_seqs, num_tiles * num_splits, num_q_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
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
        num_splits,
        tokens_per_split,
        SPLIT=split,
        BLOCK_M=block,
        BLOCK_N=block,
        BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype(q),
        DOT_PRECISION=_dot_precision(q),
    )
    if split:
        _paged_attention_reduce_kernel[(num_tokens * num_q_heads,)](
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
