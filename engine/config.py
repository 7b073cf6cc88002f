"""Frozen configuration of the engine: model, KV cache, scheduler.

Each dataclass only validates in ``__post_init__``; values discovered at run
time (the number of KV blocks that fit a memory budget, the model's shapes)
live in separate objects, never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

DType = Literal["float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]
Backend = Literal["auto", "torch", "triton"]
DTYPES: tuple[str, ...] = get_args(DType)
DEVICES: tuple[str, ...] = get_args(Device)
Quantization = Literal["auto", "none", "int8", "int4"]
LinearDType = Literal["auto", "float32", "bfloat16"]
BACKENDS: tuple[str, ...] = get_args(Backend)
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
LINEAR_DTYPES: tuple[str, ...] = get_args(LinearDType)
KVCacheDType = Literal["auto", "float32", "bfloat16", "float16"]
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDType)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Where the weights come from and how they run.

    Attributes:
        path: a Hugging Face folder (config.json + safetensors), or a ``.gguf``
            file; ``None`` means the bundled SmolLM2-135M-Instruct GGUF.
        dtype: compute and weight dtype, ``float32``, ``bfloat16`` or
            ``float16`` (activations, norms, KV cache, embedding; the linears'
            weights unless ``quantization`` or ``linear_dtype`` say otherwise).
        device: ``"cpu"`` or ``"cuda"`` (``"auto"`` picks CUDA when present).
        backend: kernel backend; ``"auto"`` is ``triton`` on CUDA, ``torch``
            on the CPU.
        cache_dir: where a GGUF's tokenizer and config (a few MB, keyed by
            the file's header), the compiled kernels and SmoothQuant's
            statistics are cached; ``None`` means ``~/.cache/bargein``.
        quantization: the linear layers (and the output head) on a CPU with
            ``dtype`` ``float32``. ``"int4"`` runs the checkpoint's own blocks
            (a GGUF's Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K; other types as
            Q8_0) on int8 activations per row
            and block of 32, llama.cpp's arithmetic in an AVX2 kernel
            (``kernels/cpu_qblock``, compiled with the system's C compiler
            at the first start) at every step size, so a row's output is the
            same bits whatever shares its step (docs/design.md "Exact by
            default"); where that kernel cannot run, torch's W4A16 at a few
            rows and fp32 above. ``"int8"`` is W8A8 (int8 per-channel
            weights, per-token dynamic int8 activations on fbgemm,
            SmoothQuant-smoothed; steps of a few rows run the 4-bit weights;
            not row-invariant). ``"auto"`` is the fastest format whose
            quality holds (``linear.choose_linear_format``): int4 on every
            x86 CPU with AVX2, FMA, F16C and a C compiler; without them int8
            where the CPU has avx512_vnni, else bf16 where it has bf16 dot
            products, else int4 on torch's kernels on x86, else as
            ``linear_dtype``. ``"none"`` never quantizes. On CUDA ``auto``
            keeps the model dtype. Quality and speed of each:
            docs/perf/quality.md, docs/perf/formats.md.
        linear_dtype: the weight/GEMM dtype of linears that are not int8:
            ``"auto"`` is bfloat16 where the CPU has bf16 dot products
            (avx512_bf16, amx_bf16), else float32. Exact fp32 (token for
            token as transformers) is ``quantization`` ``"none"`` with
            ``linear_dtype`` ``"float32"``.
    """

    path: str | None = None
    dtype: DType = "float32"
    device: Device = "auto"
    backend: Backend = "auto"
    cache_dir: str | None = None
    quantization: Quantization = "auto"
    linear_dtype: LinearDType = "auto"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("dtype", DTYPES),
            ("device", DEVICES),
            ("backend", BACKENDS),
            ("quantization", QUANTIZATIONS),
            ("linear_dtype", LINEAR_DTYPES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r} must be one of {', '.join(allowed)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """The paged KV cache pool.

    Attributes:
        block_size: tokens per KV block.
        num_blocks: blocks in the pool; ``None`` derives it from
            ``memory_bytes``.
        memory_bytes: byte budget for K and V of all layers together, used
            when ``num_blocks`` is ``None``.
        dtype: the K/V dtype (vLLM's ``--kv-cache-dtype``). ``"auto"`` is
            bfloat16 on the CPU when the linears are not exact fp32 (int8, int4 or
            bf16: the step's attention reads half the bytes, and twice the
            tokens fit), else the model dtype. The CPU kernels take float32
            or bfloat16; on CUDA it must be the model dtype.
    """

    block_size: int = 16
    num_blocks: int | None = None
    memory_bytes: int = 512 * 1024 * 1024
    dtype: KVCacheDType = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"{self.block_size=} must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"{self.num_blocks=} must be >= 1")
        if self.memory_bytes < 1:
            raise ValueError(f"{self.memory_bytes=} must be >= 1")
        if self.dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {', '.join(KV_CACHE_DTYPES)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Continuous-batching limits, as in vLLM.

    Attributes:
        max_num_seqs: most sequences running in one step (a cap: with
            ``target_itl_s`` the step budget decides the batch).
        max_num_batched_tokens: tokens (decode + prefill chunks) in one step.
        max_model_len: prompt plus output tokens of one sequence.
        prefill_chunk_size: most prompt tokens of one sequence in one step.
        enable_prefix_caching: reuse the K/V of full blocks whose token
            prefix (and ``cache_salt``) another sequence already computed;
            ``False`` allocates and computes every block as before.
        target_itl_s: the inter-token latency target in seconds (in
            milliseconds as ``bargein serve``'s flag): each step
            is filled only up to what the engine's step-time model predicts
            fits it (decodes first, then prefill chunks sized to what is
            left), and a waiting sequence joins the running batch only while
            the batch's decodes still fit (engine/step_budget.py). 0: off,
            the token limits alone (the library default, so plans stay what
            the limits say; ``bargein serve`` turns it on).
        min_prefill_tokens: with a target, prefill tokens a step may take
            even when its decodes alone fill the budget (prompts progress).
        slow_headroom: with a target, where one stream's step alone is
            predicted past it (a loaded machine), the batch may take this
            many times that step (``StepBudget.slow_headroom``); 1: one
            stream only, whatever the others wait.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 2048
    prefill_chunk_size: int = 256
    enable_prefix_caching: bool = True
    target_itl_s: float = 0.0
    min_prefill_tokens: int = 16
    slow_headroom: float = 1.5

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"{self.max_num_seqs=} must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"{self.max_num_batched_tokens=} must be >= {self.max_num_seqs=}")
        if self.max_model_len < 2:
            raise ValueError(f"{self.max_model_len=} must be >= 2")
        if not 1 <= self.prefill_chunk_size <= self.max_num_batched_tokens:
            raise ValueError(f"{self.prefill_chunk_size=} must be in [1, {self.max_num_batched_tokens=}]")
        if not (self.target_itl_s >= 0 and self.target_itl_s < float("inf")):
            raise ValueError(f"{self.target_itl_s=} must be >= 0 (0: off)")
        if self.min_prefill_tokens < 1:
            raise ValueError(f"{self.min_prefill_tokens=} must be >= 1")
        if not 1 <= self.slow_headroom < float("inf"):
            raise ValueError(f"{self.slow_headroom=} must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Everything the engine is built from."""

    model: ModelConfig = ModelConfig()
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
