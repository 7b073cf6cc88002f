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
from numba.core import cgutils
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


def _fma_typing(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """float32 ``a * b + c`` rounded once (LLVM ``llvm.fma.f32``)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return sig, codegen


_LANES = 8  # float32 lanes of an AVX2 register


def _load_row(builder: Any, data: Any, index: Any, bf16: bool, width: int | None) -> Any:
    """LLVM IR: ``row[index]`` (``width`` None) or ``row[index : index + width]``
    as float32 (a vector), from a float32 row or a bfloat16 row's int16 bits."""
    f32 = ir.FloatType()
    elem = ir.IntType(16) if bf16 else f32
    ptr = builder.gep(data, [index], inbounds=True, source_etype=elem)
    typ = elem if width is None else ir.VectorType(elem, width)
    raw = builder.load(builder.bitcast(ptr, typ.as_pointer()), typ=typ, align=2 if bf16 else 4)
    if not bf16:
        return raw
    wide_int = ir.IntType(32) if width is None else ir.VectorType(ir.IntType(32), width)
    shift = ir.Constant(wide_int, 16 if width is None else [16] * width)
    out = f32 if width is None else ir.VectorType(f32, width)
    return builder.bitcast(builder.shl(builder.zext(raw, wide_int), shift), out)


def _dot_typing(typingctx: Any, q_row: Any, k_row: Any) -> Any:
    """``q_row . k_row`` in a fixed order: see :func:`dot`."""
    if not (isinstance(q_row, types.Array) and isinstance(k_row, types.Array)):
        return None
    if q_row.ndim != 1 or k_row.ndim != 1 or q_row.layout != "C" or k_row.layout != "C":
        raise TypingError(f"dot takes 1-D contiguous rows, not {q_row} and {k_row}")
    if q_row.dtype != types.float32 or k_row.dtype not in (types.float32, types.int16):
        raise TypingError(
            f"dot takes a float32 row and a float32 or bfloat16 (int16) row, not {q_row}, {k_row}"
        )
    bf16 = k_row.dtype == types.int16
    sig = types.float32(q_row, k_row)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vec = ir.VectorType(f32, _LANES)
        q_arr = context.make_array(signature.args[0])(context, builder, args[0])
        k_arr = context.make_array(signature.args[1])(context, builder, args[1])
        n = builder.extract_value(q_arr.shape, 0)
        fma_vec = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{_LANES}f32"
        )
        fma_one = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32"
        )

        def load_k(index: Any, width: int | None) -> Any:
            return _load_row(builder, k_arr.data, index, bf16, width)

        acc = cgutils.alloca_once_value(builder, ir.Constant(vec, [0.0] * _LANES))
        with cgutils.for_range(builder, builder.udiv(n, i64(_LANES))) as loop:
            at = builder.mul(loop.index, i64(_LANES))
            q_ptr = builder.gep(q_arr.data, [at], inbounds=True, source_etype=f32)
            q_vec = builder.load(builder.bitcast(q_ptr, vec.as_pointer()), typ=vec, align=4)
            builder.store(builder.call(fma_vec, [q_vec, load_k(at, _LANES), builder.load(acc)]), acc)
        # lanes added pairwise: (l0 + l4) ..., then (.. + ..) of those, then the last two
        lanes = builder.load(acc)
        width = _LANES
        while width > 1:
            width //= 2
            low = builder.shuffle_vector(
                lanes, lanes, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width)))
            )
            high = builder.shuffle_vector(
                lanes, lanes, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width, 2 * width)))
            )
            lanes = builder.fadd(low, high)
        total = cgutils.alloca_once_value(builder, builder.extract_element(lanes, i64(0)))
        with cgutils.for_range(
            builder, n, start=builder.mul(builder.udiv(n, i64(_LANES)), i64(_LANES))
        ) as loop:
            q_ptr = builder.gep(q_arr.data, [loop.index], inbounds=True, source_etype=f32)
            q_one = builder.load(q_ptr, typ=f32, align=4)
            builder.store(
                builder.call(fma_one, [q_one, load_k(loop.index, None), builder.load(total)]), total
            )
        return builder.load(total)

    return sig, codegen


def _axpy_typing(typingctx: Any, acc_row: Any, weight: Any, v_row: Any) -> Any:
    """``acc_row += weight * v_row``, one rounding per element: see :func:`axpy`."""
    if not (isinstance(acc_row, types.Array) and isinstance(v_row, types.Array)):
        return None
    if acc_row.ndim != 1 or v_row.ndim != 1 or acc_row.layout != "C" or v_row.layout != "C":
        raise TypingError(f"axpy takes 1-D contiguous rows, not {acc_row} and {v_row}")
    if acc_row.dtype != types.float32 or v_row.dtype not in (types.float32, types.int16):
        raise TypingError(
            f"axpy takes a float32 row and a float32 or bfloat16 (int16) row, not {acc_row}, {v_row}"
        )
    bf16 = v_row.dtype == types.int16
    sig = types.void(acc_row, types.float32, v_row)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vec = ir.VectorType(f32, _LANES)
        acc_arr = context.make_array(signature.args[0])(context, builder, args[0])
        v_arr = context.make_array(signature.args[2])(context, builder, args[2])
        n = builder.extract_value(acc_arr.shape, 0)
        weight = args[1]
        splat = builder.insert_element(ir.Constant(vec, [0.0] * _LANES), weight, i64(0))
        splat = builder.shuffle_vector(
            splat, splat, ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES)
        )
        fma_vec = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{_LANES}f32"
        )
        fma_one = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32"
        )
        body = builder.mul(builder.udiv(n, i64(_LANES)), i64(_LANES))
        with cgutils.for_range(builder, builder.udiv(n, i64(_LANES))) as loop:
            at = builder.mul(loop.index, i64(_LANES))
            acc_ptr = builder.bitcast(
                builder.gep(acc_arr.data, [at], inbounds=True, source_etype=f32), vec.as_pointer()
            )
            v_vec = _load_row(builder, v_arr.data, at, bf16, _LANES)
            builder.store(
                builder.call(fma_vec, [splat, v_vec, builder.load(acc_ptr, typ=vec, align=4)]),
                acc_ptr,
                align=4,
            )
        with cgutils.for_range(builder, n, start=body) as loop:
            acc_ptr = builder.gep(acc_arr.data, [loop.index], inbounds=True, source_etype=f32)
            v_one = _load_row(builder, v_arr.data, loop.index, bf16, None)
            builder.store(
                builder.call(fma_one, [weight, v_one, builder.load(acc_ptr, typ=f32, align=4)]), acc_ptr
            )
        return context.get_dummy_value()

    return sig, codegen


# typed Any: mypy sees numba's intrinsic wrapper as taking the typing context too
_bits_as_f32: Any = intrinsic(_bits_as_f32_typing)
_f32_as_bits: Any = intrinsic(_f32_as_bits_typing)
# Public for the attention kernels: an explicit fused multiply-add is one
# rounding wherever LLVM puts it (vector body, scalar tail, another kernel),
# where a plain ``a * b + c`` under fastmath "contract" may or may not fuse.
bits_as_f32: Any = _bits_as_f32
fma: Any = intrinsic(_fma_typing)
# ``q_row . k_row`` of a float32 row and a cache row (float32 or bfloat16
# bits), both 1-D and contiguous, of one length ``n``: lane ``l`` of 8 is the
# chain ``fma(q[d], k[d], .)`` over ``d = l, l + 8, ...`` below ``n - n % 8``,
# the lanes are added pairwise (``l + l+4``, then ``+2``, then ``+1``), and the
# last ``n % 8`` products are fused into that sum in order. Written as vector
# IR, so it is one order on every machine and in every kernel (LLVM may not
# reassociate it), and one AVX2 FMA per 8 products.
dot: Any = intrinsic(_dot_typing)
# ``acc_row += weight * v_row`` of a float32 row and a cache row of one
# length, each element one ``fma`` (so the same bits scalar or vector).
axpy: Any = intrinsic(_axpy_typing)


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
