"""The model runner: owns the device, the weights and the paged KV pool.

``execute(seqs)`` runs one forward over a flat batch (decode tokens first,
then prefill chunks) and returns float32 logits for the sequences that sample.
Only this module touches devices.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import AutoTokenizer

from bargein.engine.attention import AttentionMetadata
from bargein.engine.config import CacheConfig, ModelConfig
from bargein.engine.host import cache_root
from bargein.engine.kernels import cpu_qblock, get_ops
from bargein.engine.model import gguf_linears, smooth, weight_only
from bargein.engine.model.linear import choose_linear_format, cpu_has_bf16
from bargein.engine.model.llama import (
    LayerWeights,
    LlamaModel,
    fused_linear_weights,
    head_weight,
    model_shape,
)
from bargein.engine.model.loader import load_model

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class SeqInput:
    """One sequence's slice of the flat batch for one step.

    Attributes:
        token_ids: new tokens this step (a prefill chunk, or 1 decode token).
        start_pos: position of ``token_ids[0]`` == tokens already in the KV cache.
        block_table: KV block ids covering ``start_pos + len(token_ids)`` tokens.
        sample: return logits for the last token (decode, or final prefill chunk).
    """

    token_ids: Sequence[int]
    start_pos: int
    block_table: Sequence[int]
    sample: bool


def choose_kv_cache_dtype(
    requested: str, *, device_type: str, backend: str, model_dtype: str, linear_format: str
) -> tuple[torch.dtype, str]:
    """``(dtype, why)`` of the KV cache (``CacheConfig.dtype``).

    ``"auto"``: bfloat16 on the CPU's torch backend when the linears are
    int8, int4 or bf16 (not exact fp32 already; measured in docs/perf/quality.md),
    else the model dtype, so the exact fp32 mode stays token for token with
    transformers.

    Raises:
        ValueError: a dtype the kernels do not read: with the Triton backend
            anything but the model dtype (its kernels read the cache in the
            query's dtype); on the CPU's torch backend anything but float32
            or bfloat16 under a float32 model.
    """
    cpu_kernels = device_type == "cpu" and backend == "torch" and model_dtype == "float32"
    if requested == "auto":
        if cpu_kernels and linear_format in ("int8", "int4", "bfloat16"):
            return torch.bfloat16, f"auto: {linear_format} linears -> bfloat16 K/V (half the bytes)"
        return _DTYPES[model_dtype], f"auto: the model dtype ({model_dtype})"
    if requested == model_dtype:
        return _DTYPES[requested], f"kv_cache_dtype={requested}"
    if cpu_kernels and requested == "bfloat16":
        return torch.bfloat16, "kv_cache_dtype=bfloat16"
    raise ValueError(
        f"kv_cache_dtype={requested!r} cannot run with a {model_dtype} model on {device_type} ({backend}): "
        "use auto or the model dtype (the CPU's torch backend also takes bfloat16 under a float32 model)"
    )


def placement(model_config: ModelConfig) -> tuple[torch.device, Literal["torch", "triton"]]:
    """``(device, kernel backend)`` the model runs on: ``"auto"`` device is CUDA
    when present, else the CPU; ``"auto"`` backend is ``triton`` on CUDA, ``torch``
    on the CPU."""
    device = model_config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = model_config.backend
    if backend == "auto":
        return torch.device(device), "triton" if device == "cuda" else "torch"
    return torch.device(device), backend


def _padded(tables: list[Sequence[int]], widths: list[int]) -> list[list[int]]:
    """The first ``widths[i]`` blocks of each table, 0-padded to one width."""
    width = max(widths, default=0)
    return [list(t[:w]) + [0] * (width - w) for t, w in zip(tables, widths)]


class ModelRunner:
    """Loads the model, allocates the KV pool, runs forward steps.

    Args:
        model_config: weights, dtype, device and kernel backend.
        cache_config: block size and the pool size (``num_blocks``, or a
            byte budget ``memory_bytes`` for K and V of all layers).
        max_model_len: the longest sequence (rotary cache size).

    Attributes:
        num_blocks, block_size: the KV pool.
        kv_bytes_per_token: K and V bytes of one token over all layers.
        eos_token_ids: token ids that end generation (config, generation config, tokenizer).
        linear_format: the linear layers' format (``choose_linear_format``).
        tokenizer, device, vocab_size.
    """

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, max_model_len: int) -> None:
        self.device, backend = placement(model_config)
        if self.device.type == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)
        dtype = _DTYPES[model_config.dtype]
        self.linear_format, why = choose_linear_format(
            model_config.quantization,
            model_config.linear_dtype,
            device_type=self.device.type,
            dtype=model_config.dtype,
            cache_dir=model_config.cache_dir,
        )
        logger.info("linear layers: %s (%s)", self.linear_format, why)
        self._cache_dir = model_config.cache_dir
        loaded = load_model(model_config)
        # the folder load_model found or made (no second parse of a GGUF header)
        self.tokenizer = AutoTokenizer.from_pretrained(loaded.folder)
        self.model_name = loaded.name
        shape = model_shape(loaded.config)
        self.vocab_size = shape.vocab_size
        self.max_model_len = max_model_len
        ops = get_ops(backend)
        self.eos_token_ids = _eos_token_ids(loaded.config, loaded.folder, self.tokenizer)
        self.block_size = cache_config.block_size
        kv_dtype, kv_why = choose_kv_cache_dtype(
            cache_config.dtype,
            device_type=self.device.type,
            backend=backend,
            model_dtype=model_config.dtype,
            linear_format=self.linear_format,
        )
        logger.info("KV cache: %s (%s)", str(kv_dtype).removeprefix("torch."), kv_why)
        self.kv_bytes_per_token = (
            2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * kv_dtype.itemsize
        )
        self.num_blocks = cache_config.num_blocks or cache_config.memory_bytes // (
            self.kv_bytes_per_token * self.block_size
        )
        assert self.num_blocks >= 1, f"{cache_config.memory_bytes=} holds no KV block"
        # kv_caches: [L, 2 (k, v), num_blocks, block_size, Hk, D]
        self.kv_caches = torch.zeros(
            shape.num_layers,
            2,
            self.num_blocks,
            self.block_size,
            shape.num_kv_heads,
            shape.head_dim,
            dtype=kv_dtype,
            device=self.device,
        )

        def build(weights: Mapping[str, torch.Tensor], linear_format: str, **parts: Any) -> LlamaModel:
            return LlamaModel(
                loaded.config, weights, ops, dtype, self.device, max_model_len, linear_format, **parts
            )

        if self.linear_format == "int8":
            self.model = self._smoothed_int8(loaded, build)
        elif self.linear_format == "int4":
            self.model = self._int4(loaded, build)
        else:
            self.model = build(loaded.weights, self.linear_format)
        # One decode step before the first request: the kernels compile (numba
        # on the CPU, from its disk cache after the first start; Triton on a
        # GPU) and oneDNN builds its primitives now, not in the first TTFT.
        # Block 0 is free: whatever this writes there is overwritten before a
        # sequence that owns it reads it.
        self.execute([SeqInput(token_ids=[0], start_pos=0, block_table=[0], sample=True)])

    def _smoothed_int8(self, loaded: Any, build: Callable[..., LlamaModel]) -> LlamaModel:
        """The int8 model of SmoothQuant-smoothed weights (engine/model/smooth.py),
        calibrated on the fp32 model over ``calibration.txt`` (built only when
        no earlier start cached the statistics); the output head and the first
        and last layers in bf16 where the CPU has bf16 dot products, else fp32
        (docs/perf/quality.md: mean KL 0.030 -> below 0.01)."""
        started = time.perf_counter()
        ids = self.tokenizer(smooth.CALIBRATION_TEXT.read_text(encoding="utf-8"))["input_ids"]
        window = min(smooth.CALIBRATION_WINDOW, self.num_blocks * self.block_size, self.max_model_len)
        table = list(range(-(-window // self.block_size)))

        def run() -> None:
            with torch.inference_mode():
                for lo in range(0, min(len(ids), smooth.CALIBRATION_TOKENS), window):
                    chunk = ids[lo : lo + window]
                    self.execute([SeqInput(token_ids=chunk, start_pos=0, block_table=table, sample=True)])

        cache = (
            cache_root(self._cache_dir)
            / "smoothquant"
            / smooth.calibration_key([*loaded.weight_files, f"{loaded.folder}/config.json"])
        )

        def calibrate() -> smooth.AbsMax:
            self.model = build(loaded.weights, "float32")
            return smooth.activation_absmax(self.model, run)

        shape = model_shape(loaded.config)
        absmax = smooth.cached_absmax(
            cache, calibrate, smooth.expected_widths(loaded.weights, shape.num_layers)
        )
        weights, smoothings = smooth.smooth_weights(loaded.weights, absmax, shape)
        keep = "bfloat16" if cpu_has_bf16() else "float32"
        model = build(weights, "int8", head_format=keep, edge_format=keep)
        small = self._int4_small_steps(model.layers, loaded.weights, smoothings)
        if small is not None:
            model.layers = small
        logger.info(
            "int8: smoothed (%d calibration tokens, %s) in %.1f s; head and edge layers in %s; %s",
            min(len(ids), smooth.CALIBRATION_TOKENS),
            cache,
            time.perf_counter() - started,
            keep,
            f"steps of up to {weight_only.MAX_ROWS} rows: the checkpoint's 4-bit weights"
            if small is not None
            else "no 4-bit path (the checkpoint's weights are not 4-bit, or torch lacks the kernel)",
        )
        return model

    def _int4(self, loaded: Any, build: Callable[..., LlamaModel]) -> LlamaModel:
        """The int4 format: the checkpoint's 4-bit weights and an 8-bit head.

        Where the block kernels run (``cpu_qblock``: AVX2, FMA, F16C and a C
        compiler), every step runs them whatever its row count: the layers
        Q4_1 and the head Q8_0 on int8 activations quantized per row and
        block of 32, so a row's output is the same bits whatever else shares
        its step (issue 37, docs/design.md "Exact by default"); no fp32 copy
        of those weights is kept. Elsewhere torch's W4A16 layers up to
        ``weight_only.FP32_MAX_ROWS`` rows and its int8 weight-only head up to
        ``weight_only.HEAD_MAX_ROWS``, fp32 above (``weight_only``'s tables):
        faster there, but a row's arithmetic then depends on the step's row
        count. A checkpoint not on a 4-bit grid keeps fp32 layers (4 bits
        would cost it quality); the head's 8 bits are its own rounding
        (docs/perf/quality.md)."""
        blocks = cpu_qblock.available(self._cache_dir)
        if blocks and loaded.gguf is not None:
            return self._gguf_blocks(loaded, build)
        model = build(loaded.weights, "float32")
        layer_rows = None if blocks else weight_only.FP32_MAX_ROWS
        small = self._int4_small_steps(model.layers, loaded.weights, None, layer_rows)
        if small is not None:
            model.layers = small
        head = head_weight(loaded.config, loaded.weights)
        if blocks:
            model.lm_head = cpu_qblock.Q8_0Linear(head)
        else:
            model.lm_head = weight_only.RowSplitLinear(
                weight_only.Int8WeightLinear(head), model.lm_head, weight_only.HEAD_MAX_ROWS
            )
        logger.info(
            "int4: %s; the head %s",
            (
                "the checkpoint's 4-bit weights: Q4_1 x int8 block kernels at every row count"
                if blocks
                else f"steps of up to {layer_rows} rows on the checkpoint's 4-bit weights (torch W4A16), "
                "fp32 above"
            )
            if small is not None
            else "fp32 layers (the checkpoint's weights are not 4-bit)",
            "Q8_0 x int8 at every row count"
            if blocks
            else f"on int8 weights up to {weight_only.HEAD_MAX_ROWS} rows, fp32 above (block kernels: "
            f"{cpu_qblock.unavailable_reason(self._cache_dir)}); rows not batch-invariant",
        )
        return model

    def _gguf_blocks(self, loaded: Any, build: Callable[..., LlamaModel]) -> LlamaModel:
        """The int4 format of a GGUF: every linear on the file's own blocks
        (``gguf_linears``: Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K x int8, any other
        type requantized to Q8_0), the embedding looked up in its blocks;
        built tensor by tensor from the mapped file, never in fp32."""
        started = time.perf_counter()
        used: Counter[str] = Counter()
        model = build(
            loaded.weights,
            "float32",
            linears=lambda i: gguf_linears.layer_linears(loaded.gguf, i, used),
            embedding=gguf_linears.GgufEmbedding(loaded.gguf),
            lm_head=gguf_linears.output_head(loaded.gguf, used),
        )
        logger.info(
            "int4: the GGUF's own blocks x int8 activations at every row count (%s), built in %.1f s",
            ", ".join(f"{n} x {kind}" for kind, n in sorted(used.items())),
            time.perf_counter() - started,
        )
        return model

    def _int4_small_steps(
        self,
        layers: list[LayerWeights],
        checkpoint: dict[str, torch.Tensor],
        smoothings: dict[tuple[int, str], smooth.Smoothing] | None,
        max_rows: int | None = weight_only.MAX_ROWS,
    ) -> list[LayerWeights] | None:
        """``layers`` with each linear run in 4 bits for inputs of up to
        ``max_rows`` rows, its own kernel above (``None``: the 4-bit kernel
        at every row count, the layer's own dropped); None where that would cost
        quality or cannot run: a weight not on a 4-bit grid (only a 4-bit
        checkpoint, such as the default Q4_1 GGUF, is held exactly) or no CPU
        4-bit kernel: the Q4_1 block kernels (``cpu_qblock``) where they run,
        else torch's W4A16 (torch >= 2.5).

        With ``smoothings`` (the int8 model's) the 4-bit kernel reads the
        checkpoint's weights with the smoothing around it
        (``smooth.Smoothing``); the smoothed model's bias is the checkpoint's
        divided by the output scale, as its output is."""
        blocks = smoothings is None and cpu_qblock.available(self._cache_dir)
        if self.device.type != "cpu" or not (blocks or weight_only.int4_kernel_available()):
            return None
        out = []
        for i, layer in enumerate(layers):
            small: dict[str, Any] = {}
            for kind, (w, b) in fused_linear_weights(checkpoint, i).items():
                groups = weight_only.exact_groups(w)
                if groups is None:
                    return None
                in_scale = out_scale = None
                if smoothings is not None:
                    scaling = smoothings[(i, kind)]
                    in_scale, out_scale = scaling.in_scale, scaling.out_scale
                if b is not None and out_scale is not None:
                    b = b.float() / out_scale
                kernel = (
                    cpu_qblock.Q4_1Linear(groups, b)
                    if blocks
                    else weight_only.Int4Linear.from_groups(groups, b, in_scale=in_scale, out_scale=out_scale)
                )
                small[kind] = (
                    kernel
                    if max_rows is None
                    else weight_only.RowSplitLinear(kernel, getattr(layer, kind), max_rows)
                )
            out.append(dataclasses.replace(layer, **small))
        return out

    @torch.inference_mode()
    def execute(self, seqs: Sequence[SeqInput]) -> torch.Tensor:
        """Run one forward step over ``seqs``; write their K/V into the pool.

        Returns:
            ``[num_sample, vocab]`` float32 logits of each ``sample=True``
            sequence's last token, in the order of ``seqs``.
        """
        assert seqs, "execute needs at least one sequence"
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids) != 1)
        ordered = [seqs[i] for i in order]
        input_ids, positions, meta = self._prepare(ordered)
        hidden = self.model.forward(input_ids, positions, meta, self.kv_caches)
        last_row = dict(zip(order, itertools.accumulate(len(s.token_ids) for s in ordered)))
        rows = [last_row[i] - 1 for i, s in enumerate(seqs) if s.sample]
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        return self.model.compute_logits(
            torch.index_select(hidden, 0, torch.tensor(rows, device=self.device))
        )

    def _prepare(self, seqs: list[SeqInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids, positions and attention metadata; decodes lead ``seqs``."""
        bs = self.block_size
        num_decode = sum(1 for s in seqs if len(s.token_ids) == 1)
        positions: list[int] = []
        slots: list[int] = []
        for s in seqs:
            end = s.start_pos + len(s.token_ids)
            assert s.token_ids and end <= self.max_model_len, (s.start_pos, len(s.token_ids))
            assert len(s.block_table) * bs >= end, f"{len(s.block_table)} blocks cannot hold {end} tokens"
            span = range(s.start_pos, end)
            positions.extend(span)
            slots.extend(s.block_table[p // bs] * bs + p % bs for p in span)
        seq_lens = [s.start_pos + len(s.token_ids) for s in seqs]
        widths = [-(-n // bs) for n in seq_lens]
        tables = [s.block_table for s in seqs]
        dec, pre = slice(0, num_decode), slice(num_decode, None)
        query_start = [0, *itertools.accumulate(len(s.token_ids) for s in seqs[pre])]
        dev, i32 = self.device, torch.int32
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_decode_tokens=num_decode,
            decode_block_tables=torch.tensor(_padded(tables[dec], widths[dec]), dtype=i32, device=dev),
            decode_seq_lens=torch.tensor(seq_lens[dec], dtype=i32, device=dev),
            prefill_block_tables=torch.tensor(_padded(tables[pre], widths[pre]), dtype=i32, device=dev),
            prefill_query_start_loc=torch.tensor(query_start, dtype=i32, device=dev),
            prefill_seq_lens=torch.tensor(seq_lens[pre], dtype=i32, device=dev),
        )
        input_ids = torch.tensor(list(itertools.chain.from_iterable(s.token_ids for s in seqs)), device=dev)
        return input_ids, torch.tensor(positions, device=dev), meta


def _eos_token_ids(config, folder: str, tokenizer) -> frozenset[int]:
    """EOS ids from the model config, its generation config and the tokenizer."""
    from transformers import GenerationConfig

    ids: set[int] = set()
    sources = [config.eos_token_id, tokenizer.eos_token_id]
    try:
        sources.append(GenerationConfig.from_pretrained(folder).eos_token_id)
    except OSError:  # a folder without generation_config.json
        pass
    for value in sources:
        if value is None:
            continue
        ids.update(value if isinstance(value, list) else [value])
    return frozenset(ids)
