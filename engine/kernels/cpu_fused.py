"""The small ops of a CPU step, each one compiled call (numba), float32.

At one sequence, a decode step of a 30-layer model spends as long in its
small ops as in its matrix products: every RMSNorm or rotary is several
torch ops on a 576-wide row, each a dispatch, an allocation and, for some,
an OpenMP region (docs/perf/step-profile.md). Here each is one numba call
on a plain loop (SiLU-mul is one vectorized ATen op already and stays one):

- :func:`rms_norm`: the residual add and the norm in one pass;
- :func:`decode_attention` (:class:`DecodeAttention`, prepared once per
  step): for a decode-only step, the rotary of q and k,
  the KV-cache write and the paged attention, straight from the fused qkv
  projection's output, one task per sequence, or per run of its context
  when there are fewer sequences than cores (split-K).

Same contracts as the torch references (``rms_norm_ref``,
``rotary_embedding_ref`` + ``write_kv_cache_ref`` +
``paged_attention_decode_ref``) they are tested against. The sums run in
float32 with reassociation (SIMD order), so results match the references
to float32 rounding, not bit for bit. Only float32 CPU tensors are taken
(and a bfloat16 KV cache, read and written through ``cpu_kv``): the
wrappers hand anything else to the reference.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from bargein.engine.kernels.cpu_kv import kernel_view, load, store, takes_caches
from bargein.engine.kernels.kv_cache_write import write_kv_cache_ref
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref
from bargein.engine.kernels.rms_norm import rms_norm_ref
from bargein.engine.kernels.rotary import rotary_embedding_ref

# As in cpu_attention: reassociation vectorizes the row sums; no nnan/ninf.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_F32 = np.float32


# A context split shorter than this costs more to launch and merge than it saves.
MIN_SPLIT_TOKENS = 128


def _takes(*tensors: torch.Tensor) -> bool:
    # a plain loop over flags: all() over a generator and ``device.type`` cost
    # 2-3 us a call here, and a step makes 61 RMSNorm calls
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return True


@numba.njit(fastmath=_FASTMATH, cache=True, nogil=True)
def _add_rms_norm_kernel(
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray,
    eps: float,
    out: np.ndarray,
    residual_out: np.ndarray,
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_tokens, hidden = x.shape
    for t in range(num_tokens):
        total = _F32(0.0)
        for i in range(hidden):
            h = x[t, i] + residual[t, i]
            residual_out[t, i] = h
            total += h * h
        inv_rms = _F32(1.0) / np.sqrt(total / _F32(hidden) + _F32(eps))
        for i in range(hidden):
            out[t, i] = residual_out[t, i] * inv_rms * weight[i]


@numba.njit(fastmath=_FASTMATH, cache=True, nogil=True)
def _rms_norm_kernel(
    x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray
) -> None:  # pragma: no cover - compiled, tested through the wrapper
    num_tokens, hidden = x.shape
    for t in range(num_tokens):
        total = _F32(0.0)
        for i in range(hidden):
            total += x[t, i] * x[t, i]
        inv_rms = _F32(1.0) / np.sqrt(total / _F32(hidden) + _F32(eps))
        for i in range(hidden):
            out[t, i] = x[t, i] * inv_rms * weight[i]


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with the residual add, one numba pass per float32 row.

    Arguments, shapes and results as :func:`rms_norm_ref` (``residual_out``
    is ``x`` itself without a residual); other dtypes, devices or ranks take
    the reference.
    """
    if x.dim() != 2 or not (_takes(x, weight) if residual is None else _takes(x, weight, residual)):
        return rms_norm_ref(x, weight, eps, residual)
    # numpy allocates the outputs: cheaper than torch.empty_like and .numpy() on each
    xn = x.contiguous().numpy()
    out = np.empty_like(xn)
    if residual is None:
        _rms_norm_kernel(xn, weight.numpy(), float(eps), out)
        return torch.from_numpy(out), x
    residual_out = np.empty_like(xn)
    _add_rms_norm_kernel(xn, residual.contiguous().numpy(), weight.numpy(), float(eps), out, residual_out)
    return torch.from_numpy(out), torch.from_numpy(residual_out)


# exp(x) for the softmax as 2^y, y = x log2(e): 2^floor(y) is built in the
# exponent bits, 2^frac(y) by a degree-5 polynomial (a least-squares fit to
# 2^f on [0, 1) at Chebyshev nodes; relative error 1.6e-7 evaluated in
# float32, about one ulp). Unlike ``np.exp`` (a scalar libm call: numba's
# LLVM has no vector math library here) the loop vectorizes.
_LOG2E = _F32(1.4426950408889634)
_EXP2_POLY = (
    _F32(0.0018762329127639532),
    _F32(0.00899258442223072),
    _F32(0.05582360550761223),
    _F32(0.24015453457832336),
    _F32(0.6931529641151428),
    _F32(0.9999999403953552),
)
# exp below this underflows float32's normal range; 2^-126 is its floor
_EXP_FLOOR = _F32(-87.0)


@numba.njit(fastmath=_FASTMATH, cache=True, nogil=True, inline="always")
def _exp_minus_top(
    row: np.ndarray, top: float, bits: np.ndarray
) -> np.float32:  # pragma: no cover - compiled
    """``row[i] <- exp(row[i] - top)`` in place for ``row [n]`` float32 with
    ``top >= max(row)``; returns their sum. ``bits``: ``[>= n]`` int32 scratch."""
    c5, c4, c3, c2, c1, c0 = _EXP2_POLY
    n = row.shape[0]
    for i in range(n):
        y = max(row[i] - top, _EXP_FLOOR) * _LOG2E
        whole = np.floor(y)
        f = y - whole
        row[i] = ((((c5 * f + c4) * f + c3) * f + c2) * f + c1) * f + c0
        bits[i] = (np.int32(whole) + np.int32(127)) << np.int32(23)
    powers = bits[:n].view(np.float32)
    total = _F32(0.0)
    for i in range(n):
        w = row[i] * powers[i]
        row[i] = w
        total += w
    return total


def _compile_decode_attention(parallel: bool) -> Any:
    """The fused decode attention kernel; its ``prange`` loops run on numba's
    threads when ``parallel``, else as plain loops in the calling thread.

    A step with one task (one sequence, one split) gains nothing from the
    threads, but each of the kernel's three parallel loops wakes them
    (futex round trips under ``OMP_WAIT_POLICY=PASSIVE``, the serve default
    when this was measured): measured in-step at one sequence, 128 tokens, the serial variant saved
    1-1.5 ms of a 17-22 ms step. ``parallel`` is read in the body so that it
    is a closure variable: numba's disk cache keys a function by its bytecode
    and closure, not by its flags, and would otherwise load one compiled
    variant for both.

    The inner loops run over 1-D row views (``k_cache[b, o, h]``, ``acc[h]``):
    numba then computes one base address per row instead of a 4-D index per
    element, and the loops vectorize (1.5x on the whole kernel at 8 to 64
    sequences of 128 tokens against 4-D indexing, measured in one process).
    Each K and V row is read once for the query heads of its KV head.
    """

    @numba.njit(parallel=parallel, fastmath=_FASTMATH, cache=True, nogil=True)
    def kernel(
        qkv: np.ndarray,
        positions: np.ndarray,
        cos_sin: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        slot_mapping: np.ndarray,
        block_tables: np.ndarray,
        seq_lens: np.ndarray,
        num_heads: int,
        scale: float,
        num_splits: int,
        out: np.ndarray,
    ) -> None:  # pragma: no cover - compiled, tested through the wrapper
        _ = parallel  # makes `parallel` a closure variable (see above)
        num_seqs = qkv.shape[0]
        block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        half = head_dim // 2
        group = num_heads // num_kv_heads
        k_base, v_base = num_heads * head_dim, (num_heads + num_kv_heads) * head_dim
        scale32 = _F32(scale)
        # 1. Rotary of q and k, and this token's K/V row into its slot, before any
        #    task reads the context it ends.
        q = np.empty((num_seqs, num_heads, head_dim), dtype=np.float32)
        for seq in numba.prange(num_seqs):
            block, offset = slot_mapping[seq] // block_size, slot_mapping[seq] % block_size
            cs, x = cos_sin[positions[seq]], qkv[seq]
            for kv_head in range(num_kv_heads):
                k_at, v_at = k_base + kv_head * head_dim, v_base + kv_head * head_dim
                k_row, v_row = k_cache[block, offset, kv_head], v_cache[block, offset, kv_head]
                for d in range(half):
                    x1, x2 = x[k_at + d], x[k_at + half + d]
                    store(k_row, d, x1 * cs[d] - x2 * cs[half + d])
                    store(k_row, half + d, x2 * cs[d] + x1 * cs[half + d])
                for d in range(head_dim):
                    store(v_row, d, x[v_at + d])
            for head in range(num_heads):
                q_at, q_row = head * head_dim, q[seq, head]
                for d in range(half):
                    x1, x2 = x[q_at + d], x[q_at + half + d]
                    q_row[d] = (x1 * cs[d] - x2 * cs[half + d]) * scale32
                    q_row[half + d] = (x2 * cs[d] + x1 * cs[half + d]) * scale32
        # 2. One task per (sequence, split): a split is a run of whole blocks of
        #    the context; it keeps its scores' max, the sum of their exponentials
        #    and the unnormalized weighted sum of V (split-K, as FlashDecoding).
        tops = np.full((num_seqs, num_splits, num_heads), -np.inf, dtype=np.float32)
        sums = np.zeros((num_seqs, num_splits, num_heads), dtype=np.float32)
        accs = np.zeros((num_seqs, num_splits, num_heads, head_dim), dtype=np.float32)
        for task in numba.prange(num_seqs * num_splits):
            seq, split = task // num_splits, task % num_splits
            length = seq_lens[seq]
            num_blocks = (length + block_size - 1) // block_size
            per_split = (num_blocks + num_splits - 1) // num_splits
            first = split * per_split * block_size
            last = min(length, first + per_split * block_size)
            if first >= last:
                continue
            scores = np.empty((num_heads, last - first), dtype=np.float32)
            bits = np.empty(last - first, dtype=np.int32)
            q_seq, acc = q[seq], accs[seq, split]
            for p in range(first, last):
                b, o = block_tables[seq, p // block_size], p % block_size
                for kv_head in range(num_kv_heads):
                    k_row = k_cache[b, o, kv_head]
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        q_row = q_seq[head]
                        dot = _F32(0.0)
                        for d in range(head_dim):
                            dot += q_row[d] * load(k_row, d)
                        scores[head, p - first] = dot
            for head in range(num_heads):
                top = scores[head].max()
                tops[seq, split, head] = top
                sums[seq, split, head] = _exp_minus_top(scores[head], top, bits)
            for p in range(first, last):
                b, o = block_tables[seq, p // block_size], p % block_size
                for kv_head in range(num_kv_heads):
                    v_row = v_cache[b, o, kv_head]
                    for head in range(kv_head * group, (kv_head + 1) * group):
                        w, acc_row = scores[head, p - first], acc[head]
                        for d in range(head_dim):
                            acc_row[d] += w * load(v_row, d)
        # 3. Merge the splits: rescale each to the overall max (empty splits weigh 0).
        for seq in numba.prange(num_seqs):
            for head in range(num_heads):
                top = tops[seq, :, head].max()
                total = _F32(0.0)
                out_row = out[seq, head]
                out_row[:] = 0.0
                for split in range(num_splits):
                    if sums[seq, split, head] == 0.0:
                        continue
                    weight = np.exp(tops[seq, split, head] - top)
                    total += weight * sums[seq, split, head]
                    acc_row = accs[seq, split, head]
                    for d in range(head_dim):
                        out_row[d] += weight * acc_row[d]
                inv_total = _F32(1.0) / total
                for d in range(head_dim):
                    out_row[d] *= inv_total

    return kernel


_decode_attention_kernel = _compile_decode_attention(parallel=True)
_decode_attention_serial = _compile_decode_attention(parallel=False)


def num_context_splits(num_seqs: int, max_seq_len: int, num_threads: int) -> int:
    """How many splits of each context the decode attention makes (split-K).

    Fewer sequences than threads leave cores idle with one task per
    sequence: each context is then cut in up to ``num_threads // num_seqs``
    runs of blocks, none shorter than ``MIN_SPLIT_TOKENS``. Otherwise 1.
    """
    if num_seqs >= num_threads:
        return 1
    return max(1, min(num_threads // num_seqs, max_seq_len // MIN_SPLIT_TOKENS))


class DecodeAttention:
    """A decode-only step's attention, prepared once for all its layers.

    Everything but the layer's qkv and cache is the same in every layer of
    a step (positions, slots, block tables, lengths, the split count), so it
    is converted and checked here once: at one sequence the per-call torch
    conversions and checks cost about twice the kernel itself (measured on an
    AVX2 EPYC: 69 us a call against 18 us for the kernel alone, 30 calls a
    step). Arguments as :func:`decode_attention`, less ``qkv`` and the caches,
    which each call takes.
    """

    __slots__ = ("_args", "_ref", "_kernel", "_num_heads", "_scale", "_splits")

    def __init__(
        self,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        num_heads: int,
        scale: float,
    ) -> None:
        self._num_heads, self._scale = num_heads, float(scale)
        self._ref = (positions, cos_sin_cache, slot_mapping, block_tables, seq_lens, scale)
        self._kernel: Any = None
        self._args: tuple[Any, ...] = ()
        self._splits = 1
        if not _takes(cos_sin_cache):
            return
        seq_lens = seq_lens.to(torch.int32)
        num_seqs = seq_lens.shape[0]
        self._splits = num_context_splits(num_seqs, int(seq_lens.max()), numba.get_num_threads())
        serial = num_seqs * self._splits <= 1
        self._kernel = _decode_attention_serial if serial else _decode_attention_kernel
        self._args = (
            positions.numpy(),
            cos_sin_cache.numpy(),
            slot_mapping.numpy(),
            block_tables.to(torch.int32).numpy(),
            seq_lens.numpy(),
        )

    def __call__(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """``[B, (Hq + 2 Hk) * D]`` qkv of one layer -> ``[B, Hq, D]``; its K/V
        rows are written into ``k_cache`` and ``v_cache``."""
        num_seqs, num_heads = qkv.shape[0], self._num_heads
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        if self._kernel is None or not _takes(qkv) or not takes_caches(k_cache, v_cache):
            positions, cos_sin_cache, slot_mapping, block_tables, seq_lens, scale = self._ref
            q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
            q, k = rotary_embedding_ref(
                q.reshape(num_seqs, num_heads, head_dim),
                k.reshape(num_seqs, num_kv_heads, head_dim),
                positions,
                cos_sin_cache,
            )
            write_kv_cache_ref(k, v.reshape(num_seqs, num_kv_heads, head_dim), k_cache, v_cache, slot_mapping)
            return paged_attention_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
        positions, cos_sin, slots, tables, lens = self._args
        out = torch.empty((num_seqs, num_heads, head_dim), dtype=torch.float32)
        self._kernel(
            qkv.contiguous().numpy(),
            positions,
            cos_sin,
            kernel_view(k_cache),
            kernel_view(v_cache),
            slots,
            tables,
            lens,
            num_heads,
            self._scale,
            self._splits,
            out.numpy(),
        )
        return out


def decode_attention(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_heads: int,
    scale: float,
) -> torch.Tensor:
    """A decode-only step's attention from the qkv projection: rotary, KV write, paged attention.

    Equal (to float32 rounding) to ``rotary_embedding_ref`` on q and k, then
    ``write_kv_cache_ref`` of k and v, then ``paged_attention_decode_ref``.
    One layer's call of :class:`DecodeAttention`, which a model's forward
    builds once per step.

    Args:
        qkv: ``[B, (Hq + 2 Hk) * D]`` float32, one decode token per sequence,
            q heads then k heads then v heads.
        positions: ``[B]`` int64.
        cos_sin_cache: ``[max_pos, D]`` float32 (``build_cos_sin_cache``).
        k_cache, v_cache: ``[num_blocks, block_size, Hk, D]`` float32 or
            bfloat16 (same for both), this step's rows written in place
            (rounded to nearest even in bfloat16); the sums run in float32.
        slot_mapping: ``[B]`` int64 cache slots.
        block_tables: ``[B, max_blocks]`` int32.
        seq_lens: ``[B]`` int32, tokens in the cache after this step.
        num_heads: ``Hq``, a multiple of ``Hk``.
        scale: softmax scale, usually ``D ** -0.5``.

    Returns:
        ``[B, Hq, D]`` attention output.
    """
    step = DecodeAttention(positions, cos_sin_cache, slot_mapping, block_tables, seq_lens, num_heads, scale)
    return step(qkv, k_cache, v_cache)
