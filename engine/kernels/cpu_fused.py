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
  projection's output, one task per tile of ``TILE_TOKENS`` of each
  context (split-K), in ``cpu_attention``'s fixed order.

Same contracts as the torch references (``rms_norm_ref``,
``rotary_embedding_ref`` + ``write_kv_cache_ref`` +
``paged_attention_decode_ref``) they are tested against. RMSNorm sums in
float32 with reassociation (SIMD order, the same for every row), so it
matches its reference to float32 rounding, not bit for bit; the fused
decode attention writes the K/V rows torch's rotary writes, bit for bit,
and its output is bit for bit ``cpu_attention``'s prefill and decode
output for the same position. Only float32 CPU tensors are taken
(and a bfloat16 KV cache, read and written through ``cpu_kv``): the
wrappers hand anything else to the reference.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from bargein.engine.kernels.cpu_attention import decode_merge, decode_tile_task, num_tiles
from bargein.engine.kernels.cpu_kv import kernel_view, store, takes_caches
from bargein.engine.kernels.kv_cache_write import write_kv_cache_ref
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref
from bargein.engine.kernels.rms_norm import rms_norm_ref
from bargein.engine.kernels.rotary import rotary_embedding_ref

# RMSNorm: reassociation vectorizes the row sums; no nnan/ninf.
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_F32 = np.float32


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


def _compile_decode_attention(parallel: bool) -> Any:
    """The fused decode attention kernel; its ``prange`` loops run on numba's
    threads when ``parallel``, else as plain loops in the calling thread.

    A step with one task (one sequence, one tile) gains nothing from the
    threads, but each of the kernel's three parallel loops wakes them
    (futex round trips under ``OMP_WAIT_POLICY=PASSIVE``, the serve default
    when this was measured): measured in-step at one sequence, 128 tokens, the serial variant saved
    1-1.5 ms of a 17-22 ms step. ``parallel`` is read in the body so that it
    is a closure variable: numba's disk cache keys a function by its bytecode
    and closure, not by its flags, and would otherwise load one compiled
    variant for both.

    No fastmath: the rotary is ``x1 cos - x2 sin`` rounded as torch rounds
    it (no fused multiply-add), so a K row written here equals the one a
    prefill writes through ``rotary_embedding_ref``; the attention is
    ``cpu_attention``'s fixed order (tiles of ``TILE_TOKENS``, merged in
    order), so its output equals a prefill's for the same position.
    """

    @numba.njit(parallel=parallel, cache=True, nogil=True)
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
        max_tiles: int,
        out: np.ndarray,
    ) -> None:  # pragma: no cover - compiled, tested through the wrapper
        _ = parallel  # makes `parallel` a closure variable (see above)
        num_seqs = qkv.shape[0]
        block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        half = head_dim // 2
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
        # 2. One task per (sequence, tile of TILE_TOKENS): its softmax partial.
        tops = np.full((num_seqs, max_tiles, num_heads), -np.inf, dtype=np.float32)
        sums = np.zeros((num_seqs, max_tiles, num_heads), dtype=np.float32)
        accs = np.zeros((num_seqs, max_tiles, num_heads, head_dim), dtype=np.float32)
        for task in numba.prange(num_seqs * max_tiles):
            seq, tile = task // max_tiles, task % max_tiles
            decode_tile_task(
                q[seq],
                k_cache,
                v_cache,
                block_tables[seq],
                seq_lens[seq],
                tile,
                tops[seq, tile],
                sums[seq, tile],
                accs[seq, tile],
            )
        # 3. Each sequence's tiles merged in order.
        for seq in numba.prange(num_seqs):
            decode_merge(tops[seq], sums[seq], accs[seq], out[seq])

    return kernel


_decode_attention_kernel = _compile_decode_attention(parallel=True)
_decode_attention_serial = _compile_decode_attention(parallel=False)


class DecodeAttention:
    """A decode-only step's attention, prepared once for all its layers.

    Everything but the layer's qkv and cache is the same in every layer of
    a step (positions, slots, block tables, lengths, the tile count), so it
    is converted and checked here once: at one sequence the per-call torch
    conversions and checks cost about twice the kernel itself (measured on an
    AVX2 EPYC: 69 us a call against 18 us for the kernel alone, 30 calls a
    step). Arguments as :func:`decode_attention`, less ``qkv`` and the caches,
    which each call takes.
    """

    __slots__ = ("_args", "_ref", "_kernel", "_num_heads", "_scale", "_tiles")

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
        self._tiles = 1
        if not _takes(cos_sin_cache):
            return
        seq_lens = seq_lens.to(torch.int32)
        num_seqs = seq_lens.shape[0]
        self._tiles = num_tiles(int(seq_lens.max()))
        serial = num_seqs * self._tiles <= 1
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
            self._tiles,
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
