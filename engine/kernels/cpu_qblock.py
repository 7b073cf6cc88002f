"""Q4_1 and Q8_0 block GEMMs with int8 activations for CPU steps.

At one to a few rows a decode step's GEMMs read every weight once and do
little arithmetic on it, so their time is the bytes read and how fast each
byte becomes a product; at more rows, how many products a vector op makes.
torch's ``_weight_int4pack_mm_for_cpu`` converts the 4-bit weights to bf16
and multiplies in floating point; ``cpu_qblock.c``
does what llama.cpp does on AVX2: the activations are quantized to int8 per
row and block of 32 and each block's dot product is an integer one
(``vpmaddubsw``). The blocks are interleaved in groups of up to 8 so that
each vector lane sums one block, and the float work per block (conversion,
scaling) is done 8 lanes at a time; the output channels go in tiles that
passes of 8 rows walk while their activations stay in L1. Measured on an
AVX2-only AMD EPYC (2 threads, the 30 layers' four GEMMs of SmolLM2-135M
with distinct weights, ms, best of 15 in a loop, one run, 2026-12-03)::

    rows                                1      2      4      8     16     32     64    128    256
    prepacked fp32                  21.38  21.97  29.72  32.84  45.86  67.30 124.61 210.70 365.44
    Q4_1 x int8, a block at a time   5.80   7.35  10.47  18.64  36.25  73.79 160.83 306.10 618.35
    interleaved super-blocks of 8,
      the 2 blocks after one by one  4.36   4.86   6.48   9.71  18.61  36.45  93.66 174.60 357.75
    + channel tiles, two vectors'
      codes a load, groups of 4/2/1  3.82   4.01   5.05   7.32  14.89  27.74  67.61 122.66 232.74

(``git log`` has the kernels of the middle rows; torch's W4A16
``_weight_int4pack_mm_for_cpu``, bf16 activations, was 8.0 / 21.5 ms at
1 / 8 rows on the same kind, another day.) At one row that is about 16 GB/s
of weights and scales, what the machine reads. The
int8 activations cost accuracy that the bf16 ones did not;
``docs/perf/quality.md`` measures it against fp32.

The C source is compiled on first use with the system's C compiler
(``$CC``, else ``cc``) into bargein's cache folder (``--cache-dir``'s
``kernels/``), keyed by its hash, as Triton and numba compile theirs. A
library is loaded only from a folder and a file this user owns and nobody
else may write (a library loaded is code run): another one is rebuilt, and a
folder that fails (or cannot be created: a read-only HOME) is replaced by a
private temporary one for this process, with a warning, rather than losing
the kernels. :func:`available` is False, with the reason in
:func:`unavailable_reason`, where the CPU lacks AVX2, FMA or F16C or no
compiler builds it, and the callers keep torch's kernels.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import logging
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from bargein.engine.host import cache_root, cpu_flags
from bargein.engine.kernels import kquant_layout

logger = logging.getLogger(__name__)

BLOCK = 32  # weights per block along the input (GGUF's QK4_1 and QK8_0)
REQUIRED_FLAGS = ("avx2", "fma", "f16c")
_SOURCE = Path(__file__).with_name("cpu_qblock.c")
# GGUF's block layouts (ggml-common.h: block_q4_1, block_q8_0), fp16 scales first
Q4_1_BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", BLOCK // 2)])
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", BLOCK)])
_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
NO_COMPILER = "no C compiler (set CC or install gcc)"
KINDS = ("q4_1", "q8_0", "q4_k", "q5_k", "q6_k")  # the kernels' layouts, each a GEMM


# The first library loaded, whatever its folder: every build of one source with
# one set of flags is the same code, so the kernels' callers need not know where.
_loaded: list[ctypes.CDLL] = []


def _untrusted(path: Path) -> str | None:
    """Why ``path`` (a folder or a library, links followed) must not be loaded
    from or built into: owned by another user, or writable by others; None when fine.

    Raises:
        OSError: ``path`` cannot be read (missing).
    """
    info = path.stat()
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not this user ({os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.filemode(info.st_mode)})"
    return None


def _kernel_folder(cache_dir: str | None) -> Path:
    """``cache_root(cache_dir)/kernels``, made if missing; else, if it cannot be
    made or trusted, a private temporary folder of this process, removed at
    exit (a warning says why)."""
    folder = cache_root(cache_dir) / "kernels"
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        why = _untrusted(folder)
    except OSError as exc:
        why = f"{folder} cannot be made: {exc}"
    if why is None:
        return folder
    private = Path(tempfile.mkdtemp(prefix="bargein-kernels-"))  # mode 0700, this user's
    # A loaded library outlives its file on Linux: the folder goes at exit.
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    logger.warning("block kernels: %s; building them in %s for this process instead", why, private)
    return private


def _missing_flags() -> str | None:
    """Why this CPU cannot run the kernels (it lacks AVX2, FMA or F16C), or None."""
    flags = cpu_flags()
    missing = [f for f in REQUIRED_FLAGS if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def _compiler() -> list[str] | None:
    """The C compiler to build with (a program and its arguments), or None without one."""
    # CC may carry a launcher or flags ("ccache gcc"), as make reads it
    command = shlex.split(os.environ.get("CC", "cc"))
    compiler = shutil.which(command[0]) if command else None
    return None if compiler is None else [compiler, *command[1:]]


def why_not_buildable() -> str | None:
    """Why the kernels cannot be built here, or None where they should be: an
    x86 CPU with AVX2, FMA and F16C, and a C compiler (``$CC``, else ``cc``),
    the conditions :func:`available` checks before it compiles. Where this is
    None and :func:`available` is False, the build itself failed: a broken
    source or toolchain, not a missing feature."""
    return _missing_flags() or (None if _compiler() is not None else NO_COMPILER)


@functools.cache
def _library(cache_dir: str | None = None) -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernels, built or found under ``cache_root(cache_dir)``
    (see the module doc), or None and why not."""
    missing = _missing_flags()
    if missing is not None:
        return None, missing
    key = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    target = _kernel_folder(cache_dir) / f"cpu_qblock-{key}.so"
    if target.exists():
        why = _untrusted(target)
        if why is None:
            return _load(target)
        logger.warning("block kernels: %s; building it again", why)
    compiler = _compiler()
    if compiler is None:
        return None, NO_COMPILER
    try:
        _compile(compiler, target)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not build {target}: {exc}"
    return _load(target)


def _load(target: Path) -> tuple[ctypes.CDLL | None, str]:
    """The library at ``target`` (trusted) with its functions' signatures, or None and why not."""
    try:
        # torch is loaded first: the library's libgomp.so.1 resolves to torch's, one thread pool
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        return None, f"could not load {target}: {exc}"
    for name in (f"{kind}_gemm{fused}" for kind in KINDS for fused in ("", "_silu")):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = ctypes.c_int
    for name in ("q4_1_interleave", "q8_0_interleave"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
        fn.restype = None
    for name in ("q4_k_layout", "q5_k_layout", "q6_k_layout"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64]
        fn.restype = None
    lib.exp_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.exp_f32.restype = None
    if not _loaded:
        _loaded.append(lib)
    return lib, ""


def _compile(compiler: list[str], target: Path) -> None:
    """Build the library at ``target`` with ``compiler`` (a program and its arguments).

    Raises OSError or SubprocessError (with the compiler's message).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: processes that compile
    # at once each publish a whole library.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [*compiler, *_FLAGS, str(_SOURCE), "-o", partial], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{' '.join(compiler)} failed: {done.stderr.strip()[-400:]}")
        os.chmod(partial, 0o755)  # the linker's mode follows the umask: never group-writable
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def available(cache_dir: str | None = None) -> bool:
    """This CPU and system run the block kernels (compiling them on first call
    under ``cache_root(cache_dir)``, ``--cache-dir``)."""
    return _library(cache_dir)[0] is not None


def unavailable_reason(cache_dir: str | None = None) -> str:
    """Why :func:`available` is False; empty when it is True."""
    return _library(cache_dir)[1]


def _kernels() -> ctypes.CDLL:
    """The loaded library: the first one :func:`available` loaded, else the default folder's.

    Raises:
        RuntimeError: the block kernels do not run here.
    """
    lib = _loaded[0] if _loaded else _library()[0]
    if lib is None:
        raise RuntimeError(f"the block kernels do not run here: {unavailable_reason()}")
    return lib


def pack_q4_1(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_1 blocks of ``w = scale * q + minimum``.

    Args:
        q: ``[out, in]`` integer codes in 0..15, ``in`` a multiple of 32.
        scale, minimum: ``[out, in / 32]`` fp32, rounded to fp16 here.

    Returns:
        ``[out, in / 32 * 20]`` uint8, the blocks of each output channel.
    """
    out, k = q.shape
    codes = q.to(torch.uint8).reshape(out, k // BLOCK, BLOCK).numpy()
    blocks = np.empty((out, k // BLOCK), Q4_1_BLOCK)
    blocks["d"] = scale.float().numpy()
    blocks["m"] = minimum.float().numpy()
    blocks["qs"] = codes[..., : BLOCK // 2] | (codes[..., BLOCK // 2 :] << 4)
    return torch.from_numpy(blocks.view(np.uint8).reshape(out, -1).copy())


def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 codes and scales of ``weight`` (symmetric, absmax / 127 per block of 32).

    The codes are rounded on the fp16 scale the kernel reads, so each weight
    is within half a step of ``scale * q``; a Q8_0 checkpoint's weights come
    back exactly.

    Args:
        weight: ``[out, in]`` float, ``in`` a multiple of 32.

    Returns:
        ``q`` ``[out, in]`` int8 in -127..127 and ``scale`` ``[out, in / 32]``
        fp32 (fp16 values).
    """
    out, k = weight.shape
    groups = weight.float().reshape(out, k // BLOCK, BLOCK)
    scale = (groups.abs().amax(-1) / 127.0).half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(groups / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(out, k), scale


def pack_q8_0(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 blocks: ``q`` ``[out, in]`` int8, ``scale`` ``[out, in / 32]``
    -> ``[out, in / 32 * 34]`` uint8."""
    out, k = q.shape
    blocks = np.empty((out, k // BLOCK), Q8_0_BLOCK)
    blocks["d"] = scale.float().numpy()
    blocks["qs"] = q.reshape(out, k // BLOCK, BLOCK).numpy()
    return torch.from_numpy(blocks.view(np.uint8).reshape(out, -1).copy())


def interleave(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """GGUF blocks in the kernels' layout: the same bytes, each run of 8 blocks
    of a channel interleaved so that a vector lane holds one block
    (``cpu_qblock.c``).

    Args:
        blocks: ``[out, in / 32 * size]`` uint8, what :func:`pack_q4_1`
            (``kind="q4_1"``) or :func:`pack_q8_0` (``"q8_0"``) return.

    Returns:
        a tensor of the same shape and dtype.
    """
    lib = _kernels()
    size = (Q4_1_BLOCK if kind == "q4_1" else Q8_0_BLOCK).itemsize
    blocks = blocks.contiguous()
    out = torch.empty_like(blocks)
    getattr(lib, f"{kind}_interleave")(
        blocks.data_ptr(), out.data_ptr(), blocks.shape[0], blocks.shape[1] // size
    )
    return out


def _gemm(
    name: str, blocks: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, k: int
) -> torch.Tensor:
    lib = _kernels()
    if x.dtype != torch.float32 or x.dim() != 2:
        raise ValueError(f"x must be [rows, in] float32, got {tuple(x.shape)} {x.dtype}")
    x = x.contiguous()
    rows = x.shape[0]
    out = blocks.shape[0]
    y = torch.empty(rows, out)
    if rows:
        status = getattr(lib, name)(
            blocks.data_ptr(), x.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
            rows, out, k, torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise MemoryError(f"{name}: no memory for the quantized activations of {rows} x {k}")
    return y


# ggml types the kernels run, by their name in ``gguf.GGMLQuantizationType``
GGUF_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
_SUPER = {"q4_k", "q5_k", "q6_k"}  # K-quants: super-blocks of 256 along the input


def kernel_blocks(raw: np.ndarray, ggml_type: str) -> tuple[str, torch.Tensor]:
    """A GGUF tensor's blocks in the kernels' layout: ``(kind, blocks)``.

    Q4_0 (``w = d (q - 8)``) becomes Q4_1 with ``m = -8 d``, exact in fp16;
    Q4_1 and Q8_0 are interleaved in C (:func:`interleave`), the K-quants
    rebuilt in C (:func:`k_layout`). A copy: the file's pages are not kept.

    Args:
        raw: ``[out, row_bytes]`` uint8, the file's rows of blocks.
        ggml_type: one of :data:`GGUF_TYPES`.

    Returns:
        ``kind`` (``q4_1``, ``q8_0``, ``q4_k``, ``q5_k`` or ``q6_k``) and
        ``[out, bytes]`` uint8.

    Raises:
        ValueError: a type outside :data:`GGUF_TYPES`.
    """
    if ggml_type not in GGUF_TYPES:
        raise ValueError(f"no block kernel for {ggml_type} (kernels: {', '.join(GGUF_TYPES)})")
    kind = ggml_type.lower()
    if kind in _SUPER:
        return kind, k_layout(raw, kind)
    if kind == "q4_0":
        q4_0 = np.ascontiguousarray(raw).view(np.dtype([("d", "<f2"), ("qs", "u1", BLOCK // 2)]))
        blocks = np.empty(q4_0.shape, Q4_1_BLOCK)
        blocks["d"], blocks["m"], blocks["qs"] = q4_0["d"], q4_0["d"] * np.float16(-8), q4_0["qs"]
        raw, kind = blocks.view(np.uint8).reshape(raw.shape[0], -1), "q4_1"
    return kind, interleave(torch.from_numpy(np.require(raw, requirements=["C", "W"])), kind)


def k_layout(raw: np.ndarray, kind: str) -> torch.Tensor:
    """A K-quant tensor's ``[out, row_bytes]`` GGUF blocks in the kernels' layout,
    converted in C (``kquant_layout`` is the same in numpy, its reference;
    the C pass is about 10x faster at load).

    Raises:
        ValueError: rows that are not whole super-blocks.
    """
    rows, nbytes = raw.shape
    size = kquant_layout.FILE_BYTES[kind]
    if nbytes % size:
        raise ValueError(f"{kind} rows of {nbytes} bytes are not whole super-blocks of {size}")
    src = np.ascontiguousarray(raw)
    out = torch.empty(rows, nbytes // size * kquant_layout.KERNEL_BYTES[kind], dtype=torch.uint8)
    getattr(_kernels(), f"{kind}_layout")(src.ctypes.data, out.data_ptr(), rows * (nbytes // size))
    return out


class BlockLinear:
    """fp32 in and out: ``y = x @ W^T + bias`` on block weights and int8 activations
    (per row and block of 32; ``cpu_qblock.c``).

    Args:
        kind: the layout of ``blocks``: ``q4_1``, ``q8_0``, ``q4_k``, ``q5_k``, ``q6_k``.
        blocks: ``[out, bytes]`` uint8 in the kernels' layout (:func:`kernel_blocks`).
        in_features: ``in``; a multiple of 32, of 256 for the K-quants.
        bias: ``[out]`` or None.

    Raises:
        ValueError: ``in_features`` is not a whole number of blocks, or (on
            call) ``x`` is not ``[rows, in]`` float32.
    """

    __slots__ = ("kind", "blocks", "bias", "in_features")

    def __init__(
        self, kind: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None
    ) -> None:
        block = kquant_layout.QK_K if kind in _SUPER else BLOCK
        if in_features % block:
            raise ValueError(f"in_features={in_features} is not a multiple of {block}")
        self.kind = kind
        self.in_features = in_features
        self.blocks = blocks
        self.bias = None if bias is None else bias.float().contiguous()

    @classmethod
    def from_gguf(
        cls, raw: np.ndarray, ggml_type: str, in_features: int, bias: torch.Tensor | None = None
    ) -> BlockLinear:
        """The layer over a GGUF tensor's ``[out, row_bytes]`` blocks (:func:`kernel_blocks`)."""
        kind, blocks = kernel_blocks(raw, ggml_type)
        return cls(kind, blocks, in_features, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features, the layer takes {self.in_features}")
        return _gemm(f"{self.kind}_gemm", self.blocks, x, self.bias, self.in_features)

    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``self(silu(gate) * up)`` for ``gate_up`` ``[rows, 2 * in]`` fp32 = ``[gate | up]``
        (the fused gate and up projections' output), the SiLU-mul done in the
        kernel's activation pass (``kernels.activation.silu_and_mul_ref``'s
        function, to float32 rounding).

        Raises:
            ValueError: ``gate_up`` is not ``[rows, 2 * in]`` float32.
        """
        if gate_up.shape[-1] != 2 * self.in_features:
            raise ValueError(
                f"gate_up has {gate_up.shape[-1]} features, the layer takes 2 x {self.in_features}"
            )
        return _gemm(f"{self.kind}_gemm_silu", self.blocks, gate_up, self.bias, self.in_features)


class Q4_1Linear(BlockLinear):
    """:class:`BlockLinear` over 4-bit groups: ``y = x @ (scale * q + minimum)^T + bias``.

    Args:
        groups: ``(q, scale, minimum)``, what ``weight_only.quantize_groups``
            or ``exact_groups`` return: ``[out, in]`` codes in 0..15 and
            ``[out, in / 32]`` fp32 (rounded to fp16 here, as in the GGUF).
        bias: ``[out]`` or None.

    Raises:
        ValueError: as :class:`BlockLinear`.
    """

    __slots__ = ()

    def __init__(
        self, groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor], bias: torch.Tensor | None = None
    ):
        q, scale, minimum = groups
        if q.shape[1] % BLOCK:
            raise ValueError(f"in_features={q.shape[1]} is not a multiple of {BLOCK}")
        super().__init__("q4_1", interleave(pack_q4_1(q, scale, minimum), "q4_1"), q.shape[1], bias)


class Q8_0Linear(BlockLinear):
    """:class:`BlockLinear` of ``y = x @ (scale * q)^T + bias`` (the output head of
    the int4 format on a checkpoint whose head is not in blocks already, and a
    GGUF tensor of a type without a kernel).

    Args:
        weight: ``[out, in]`` float, ``in`` a multiple of 32 (quantized by
            :func:`quantize_q8_0`; only the blocks are kept).
        bias: ``[out]`` or None.

    Raises:
        ValueError: as :class:`BlockLinear`.
    """

    __slots__ = ()

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.shape[1] % BLOCK:
            raise ValueError(f"in_features={weight.shape[1]} is not a multiple of {BLOCK}")
        blocks = interleave(pack_q8_0(*quantize_q8_0(weight)), "q8_0")
        super().__init__("q8_0", blocks, weight.shape[1], bias)
