"""Kernel ops of the forward pass, each a Triton kernel beside its torch reference.

``get_ops(backend)`` returns the callables the model calls; ``"torch"`` is
the CPU path, ``"triton"`` the CUDA kernels. Signatures are in each
``<op>_ref`` docstring. On the CPU the small ops are numba kernels
(``cpu_fused``, ``cpu_attention``) that hand anything but float32 to the
torch references, so the same table runs every dtype.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from bargein.engine.kernels import cpu_fused
from bargein.engine.kernels.activation import silu_and_mul_ref
from bargein.engine.kernels.cpu_attention import paged_attention_decode_cpu, paged_attention_prefill_cpu
from bargein.engine.kernels.kv_cache_write import write_kv_cache_ref
from bargein.engine.kernels.rotary import rotary_embedding_ref

# op name -> module under bargein.engine.kernels that holds `<op>_ref` and (Triton) `<op>`
_OP_MODULES: dict[str, str] = {
    "rms_norm": "rms_norm",
    "rotary_embedding": "rotary",
    "silu_and_mul": "activation",
    "write_kv_cache": "kv_cache_write",
    "paged_attention_decode": "paged_attention",
    "paged_attention_prefill": "paged_attention",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Ops:
    """The kernel ops of one backend (signatures: the ``<op>_ref`` docstrings).

    ``decode_attention`` builds a fused path for decode-only steps, once per
    step, from the step's positions, cos/sin cache, slots, block tables,
    lengths, head count and scale; its layers call the result on their qkv
    and caches (rotary, KV write and attention in one call,
    ``cpu_fused.DecodeAttention``). A backend without one leaves it None and
    the model calls the three ops.
    """

    rms_norm: Callable[..., tuple[Any, Any]]
    rotary_embedding: Callable[..., tuple[Any, Any]]
    silu_and_mul: Callable[..., Any]
    write_kv_cache: Callable[..., None]
    paged_attention_decode: Callable[..., Any]
    paged_attention_prefill: Callable[..., Any]
    decode_attention: Callable[..., Any] | None = None


TORCH_OPS = Ops(
    rms_norm=cpu_fused.rms_norm,  # numba on float32, else the reference
    rotary_embedding=rotary_embedding_ref,
    silu_and_mul=silu_and_mul_ref,  # one vectorized ATen op: numba was no faster at 1 row, slower at 32
    write_kv_cache=write_kv_cache_ref,
    paged_attention_decode=paged_attention_decode_cpu,  # the torch reference off float32
    paged_attention_prefill=paged_attention_prefill_cpu,  # short chunks on numba, else the reference
    decode_attention=cpu_fused.DecodeAttention,
)


def _triton_ops() -> Ops:
    """Import the Triton launchers lazily (triton is optional on the CPU)."""
    if importlib.util.find_spec("triton") is None:  # the kernels import it at first launch
        raise ImportError("backend='triton' needs triton: pip install 'bargein[triton]'")
    found: dict[str, Callable[..., Any]] = {}
    for op, module_name in _OP_MODULES.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        fn = getattr(module, op, None)
        if fn is None:
            raise NotImplementedError(
                f"Triton kernel {op!r} is not implemented yet in engine/kernels/{module_name}.py; "
                "use backend='torch'"
            )
        found[op] = fn
    return Ops(**found)


def get_ops(backend: Literal["torch", "triton"]) -> Ops:
    """Return the kernel ops of ``backend``.

    Raises:
        ValueError: unknown backend.
        NotImplementedError: ``"triton"`` while a Triton launcher is missing.
        ImportError: ``"triton"`` without the triton package.
    """
    if backend == "torch":
        return TORCH_OPS
    if backend == "triton":
        return _triton_ops()
    raise ValueError(f"{backend=} must be 'torch' or 'triton'")
