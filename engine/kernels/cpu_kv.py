"""Reading and writing KV-cache values in numba kernels, in float32 or bfloat16.

numba has no bfloat16 type, so a bfloat16 cache reaches a kernel as its
int16 bit pattern (:func:`kernel_view`); :func:`load` and :func:`store`
convert one value, and compile to plain loads and stores for a float32
cache. A bfloat16 value is the upper half of a float32's bits, so loading
is a shift, and storing rounds to nearest even on the dropped half (as
``torch.Tensor.to(torch.bfloat16)`` does for finite values). Both
vectorize.

Why a bfloat16 cache on the CPU: at 8 or more sequences a decode step's
attention reads every cached K and V row of every layer, and that read,
not the arithmetic, sets its time (docs/perf/step-profile.md). Half the
bytes is half the read, and twice the tokens in the same memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

# the cache dtypes the numba kernels take
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def takes_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """The numba kernels read these caches: both on the CPU, of one dtype in
    ``KERNEL_DTYPES``."""
    return k_cache.is_cpu and k_cache.dtype in KERNEL_DTYPES and v_cache.dtype == k_cache.dtype


def kernel_view(cache: torch.Tensor) -> np.ndarray:
    """The numpy array a kernel gets for ``cache``: float32 as is, bfloat16
    as its int16 bits (no copy either way). Raises ValueError for other dtypes."""
    if cache.dtype == torch.float32:
        return cache.numpy()
    if cache.dtype == torch.bfloat16:
        return cache.view(torch.int16).numpy()
    raise ValueError(f"numba KV kernels take float32 or bfloat16 caches, not {cache.dtype}")


def _bits_as_f32_typing(typingctx: Any, bits: Any) -> Any:
    """uint32 -> float32 of the same bits (LLVM bitcast)."""
    sig = types.float32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def _f32_as_bits_typing(typingctx: Any, value: Any) -> Any:
    """float32 -> uint32 of the same bits (LLVM bitcast)."""
    sig = types.uint32(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


# typed Any: mypy sees numba's intrinsic wrapper as taking the typing context too
_bits_as_f32: Any = intrinsic(_bits_as_f32_typing)
_f32_as_bits: Any = intrinsic(_f32_as_bits_typing)


def load(row: np.ndarray, i: int) -> np.float32:
    """``row[i]`` of a cache row as float32 (compiled only: see the overload)."""
    raise NotImplementedError("call from a numba kernel")


def store(row: np.ndarray, i: int, value: float) -> None:
    """``row[i] = value`` into a cache row, rounded to its dtype (compiled only)."""
    raise NotImplementedError("call from a numba kernel")


# numba matches an overload's parameters to its implementation's, annotations
# included: neither is annotated.
@overload(load, inline="always")
def _load(row, i):
    if row.dtype == types.float32:
        return lambda row, i: row[i]
    if row.dtype == types.int16:
        return lambda row, i: _bits_as_f32(np.uint32(np.uint16(row[i])) << np.uint32(16))
    raise TypingError(f"KV cache rows are float32 or bfloat16 bits (int16), not {row.dtype}")


@overload(store, inline="always")
def _store(row, i, value):
    if row.dtype == types.float32:

        def store_f32(row, i, value):
            row[i] = np.float32(value)

        return store_f32
    if row.dtype == types.int16:

        def store_bf16(row, i, value):
            bits = _f32_as_bits(np.float32(value))
            # round to nearest, ties to even: add 0x7fff plus the kept half's lowest bit
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            row[i] = np.int16(np.uint16(rounded))

        return store_bf16
    raise TypingError(f"KV cache rows are float32 or bfloat16 bits (int16), not {row.dtype}")
