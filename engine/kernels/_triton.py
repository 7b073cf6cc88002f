"""Shared plumbing of the Triton kernels: an optional import and a lazy ``jit``.

triton is an optional extra (``pip install bargein[triton]``): without it the
package imports and the torch references run; only launching a kernel needs
it. ``lazy_jit`` defers ``import triton`` and ``triton.jit`` to a kernel's
first launch, because triton decides when ``triton.language`` is imported and
when a kernel is decorated whether kernels are compiled or run by its CPU
interpreter (``TRITON_INTERPRET=1``): the tests set that variable after this
package may already have been imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

# Bound to ``triton.language`` in each kernel's module at its first launch:
# triton is imported only then, so the package imports without it, and so
# that ``TRITON_INTERPRET`` (read when ``triton.language`` is first imported)
# can still be set by whoever launches first.
tl: Any = None

__all__ = ["check_tensor", "dot_dtype", "lazy_jit", "next_power_of_2", "tl"]


class LazyKernel:
    """A ``@triton.jit`` kernel compiled (or interpreted) on first launch.

    ``kernel[grid](*args, **constexprs)`` as with a plain Triton kernel.

    Raises:
        ImportError: on launch, when triton is not installed.
    """

    __slots__ = ("_fn", "_kernel")

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._kernel: Any = None

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        if self._kernel is None:
            triton = _import("triton")
            # the body resolves `tl` among its module's globals, compiled or interpreted
            self._fn.__globals__["tl"] = _import("triton.language")
            self._kernel = triton.jit(self._fn)
        return self._kernel[grid]


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError("the triton backend needs triton: pip install 'bargein[triton]'") from e


def lazy_jit(fn: Callable[..., None]) -> LazyKernel:
    """Decorator: ``triton.jit`` at first launch (see the module docstring)."""
    return LazyKernel(fn)


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` (``n >= 1``): Triton block shapes must be."""
    return 1 << (n - 1).bit_length()


def check_tensor(name: str, x: torch.Tensor, ndim: int, dtype: torch.dtype | None = None) -> None:
    """Assert ``x``'s rank, dtype and a unit stride on its last dimension.

    The kernels index rows through strides but read each row's last
    dimension as one contiguous vector.
    """
    assert x.dim() == ndim, f"{name}: expected {ndim} dims, got shape {tuple(x.shape)}"
    if dtype is not None:
        assert x.dtype == dtype, f"{name}: expected {dtype}, got {x.dtype}"
    assert x.shape[-1] <= 1 or x.stride(-1) == 1, f"{name}: last dim must be contiguous, strides {x.stride()}"


def dot_dtype(x: torch.Tensor) -> Any:
    """The ``tl`` dtype of ``tl.dot`` operands for ``x``'s dtype.

    ``x``'s own on CUDA; float32 on the CPU, where the interpreter stores
    bfloat16 as raw uint16 and cannot multiply it.
    """
    lang = _import("triton.language")
    if not x.is_cuda:
        return lang.float32
    return {torch.float32: lang.float32, torch.bfloat16: lang.bfloat16, torch.float16: lang.float16}[x.dtype]
