"""GGUF's K-quant blocks (Q4_K, Q5_K, Q6_K) in the block kernels' layouts, in numpy.

A K-quant super-block holds 256 weights along the input: Q4_K and Q5_K as 8
sub-blocks of 32 with 6-bit scales and mins under fp16 ``d`` and ``dmin``
(``w = d sc q - dmin m``), Q5_K's codes with a fifth bit; Q6_K as 16
sub-blocks of 16 with int8 scales under an fp16 ``d`` (``w = d sc (u - 32)``).
The bit packing is ggml's (``ggml-common.h``: ``block_q4_K``, ``block_q5_K``,
``block_q6_K``; the scales' 6-bit packing is read with the ``gguf``
package's ``Q4_K.get_scale_min``). The kernels (``cpu_qblock.c``, "K-quants")
read one super-block as a group of 8 vectors of 32 bytes, vector ``v``
holding elements ``4v .. 4v + 3`` of each sub-block of 32 (lane ``j``:
sub-block ``j``), so that a vector lane sums one sub-block. These functions
turn ``[rows, super-blocks * file bytes]`` into ``[rows, super-blocks *
kernel bytes]``: the same codes and scales, reordered (Q4_K 144 -> 148 bytes,
Q5_K 176 -> 180, Q6_K 210 -> 210).
"""

from __future__ import annotations

import numpy as np
from gguf.quants import Q4_K

QK_K = 256
FILE_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}
KERNEL_BYTES = {"q4_k": 148, "q5_k": 180, "q6_k": 210}

# natural element index of vector v's byte i: element 4v + i % 4 of sub-block i // 4
_LANES = np.array([[32 * (i // 4) + 4 * v + i % 4 for i in range(32)] for v in range(8)])


def _vectors(codes: np.ndarray) -> np.ndarray:
    """``[n, 256]`` codes in natural order -> ``[n, 8, 32]``, vector by vector."""
    return codes[:, _LANES]


def _nibble_pairs(vectors: np.ndarray) -> np.ndarray:
    """``[n, 8, 32]`` codes -> ``[n, 128]``: vectors 2p and 2p + 1's low 4 bits in one byte."""
    low = vectors & 0x0F
    return (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(len(vectors), 128).astype(np.uint8)


def _q4_k_codes(qs: np.ndarray) -> np.ndarray:
    """``[n, 128]`` Q4_K/Q5_K ``qs`` -> ``[n, 256]`` low 4 bits in natural order:
    32 bytes per 64 weights, the first 32 in the low nibbles."""
    chunks = qs.reshape(len(qs), 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (chunks & 0x0F).reshape(len(qs), QK_K)


def _split(raw: np.ndarray, kind: str) -> tuple[np.ndarray, int]:
    rows, nbytes = raw.shape
    if nbytes % FILE_BYTES[kind]:
        raise ValueError(f"{kind} rows of {nbytes} bytes are not whole super-blocks of {FILE_BYTES[kind]}")
    return np.ascontiguousarray(raw).reshape(-1, FILE_BYTES[kind]), rows


def kq4_layout(raw: np.ndarray) -> np.ndarray:
    """Q4_K ``[rows, n * 144]`` uint8 -> the kernel's ``[rows, n * 148]``:
    ``d, dmin`` (fp16), ``sc[8], m[8]``, the codes' nibble pairs."""
    blocks, rows = _split(raw, "q4_k")
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    codes = _vectors(_q4_k_codes(blocks[:, 16:144]))
    out = np.concatenate(
        [blocks[:, :4], sc.astype(np.uint8), m.astype(np.uint8), _nibble_pairs(codes)], axis=1
    )
    return out.reshape(rows, -1)


def kq5_layout(raw: np.ndarray) -> np.ndarray:
    """Q5_K ``[rows, n * 176]`` uint8 -> the kernel's ``[rows, n * 180]``: as
    :func:`kq4_layout`, then 32 bytes whose bit ``v`` is vector ``v``'s fifth bit."""
    blocks, rows = _split(raw, "q5_k")
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    qh, qs = blocks[:, 16:48], blocks[:, 48:176]
    # the fifth bit of sub-block s's element l is bit s of qh[l]
    fifth = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8 sub-blocks, 32]
    codes = _vectors(_q4_k_codes(qs) | (fifth.reshape(len(blocks), QK_K) << 4))
    high = (codes >> 4) & 1
    hb = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    out = np.concatenate(
        [blocks[:, :4], sc.astype(np.uint8), m.astype(np.uint8), _nibble_pairs(codes), hb], axis=1
    )
    return out.reshape(rows, -1)


def q6_k_codes(blocks: np.ndarray) -> np.ndarray:
    """``[n, 210]`` Q6_K blocks -> ``[n, 256]`` unsigned codes ``u`` in 0..63
    (``w = d sc (u - 32)``), natural order: each half of 128 weights takes 64
    bytes of ``ql`` (low nibbles, then high) and 32 of ``qh`` (2 bits per
    quarter of 32)."""
    n = len(blocks)
    ql = blocks[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (ql & 0x0F).reshape(n, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return (low | ((qh & 0x03) << 4)).reshape(n, QK_K)


def kq6_layout(raw: np.ndarray) -> np.ndarray:
    """Q6_K ``[rows, n * 210]`` uint8 -> the kernel's ``[rows, n * 210]``:
    ``d`` (fp16), ``sc_lo[8], sc_hi[8]`` (each 32's scales of its first and
    second 16), the low 4 bits' nibble pairs, then 64 bytes of high bits
    (vectors 0..3 two bits each in the first 32, 4..7 in the next)."""
    blocks, rows = _split(raw, "q6_k")
    scales = blocks[:, 192:208]
    codes = _vectors(q6_k_codes(blocks))
    top = (codes >> 4) & 0x03  # [n, 8, 32]
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    hb = np.concatenate(
        [
            (top[:, :4] << shifts).sum(axis=1, dtype=np.uint8),
            (top[:, 4:] << shifts).sum(axis=1, dtype=np.uint8),
        ],
        axis=1,
    )
    out = np.concatenate(
        [blocks[:, 208:210], scales[:, 0::2], scales[:, 1::2], _nibble_pairs(codes), hb], axis=1
    )
    return out.reshape(rows, -1)


LAYOUTS = {"q4_k": kq4_layout, "q5_k": kq5_layout, "q6_k": kq6_layout}
