"""Our Llama-family forward (Llama, SmolLM2, Qwen2, Mistral) over a flat token batch.

Follows HF ``LlamaForCausalLM`` (Touvron et al. 2023): pre-norm decoder
layers of RMSNorm, rotary GQA attention and a SwiGLU MLP. The q/k/v and
gate/up projections are fused into one matrix each at load (one GEMM instead
of three or two; PERF-NOTES.md), Qwen2's q/k/v biases fused alike. Norms,
rotary, SiLU-mul, the KV write and attention go through the kernel ops of
one backend (``bargein.engine.kernels.get_ops``); only the GEMMs are plain torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from bargein.engine.attention import AttentionMetadata
from bargein.engine.kernels import Ops
from bargein.engine.kernels.rotary import build_cos_sin_cache
from bargein.engine.model.linear import make_linear

# a linear layer of any format: [T, in] -> [T, out] (bargein.engine.model.linear, weight_only)
LinearLayer = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerWeights:
    """One decoder layer, fused: ``qkv [(Hq+2Hk)*D, H]``, ``gate_up [2I, H]``."""

    input_norm: torch.Tensor
    qkv: LinearLayer
    o_proj: LinearLayer
    post_norm: torch.Tensor
    gate_up: LinearLayer
    down: LinearLayer


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """Sizes the forward and the KV pool need."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float


def model_shape(config: PretrainedConfig) -> ModelShape:
    """Read the sizes of a Llama-family transformers config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelShape(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.rms_norm_eps,
    )


def _check_supported(config: PretrainedConfig, max_model_len: int) -> None:
    """Refuse what this forward does not implement rather than compute wrong logits."""
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {config.hidden_act!r} (only silu)")
    if getattr(config, "mlp_bias", False):
        raise ValueError("unsupported: mlp_bias=True")
    window = getattr(config, "sliding_window", None)
    uses_window = getattr(config, "use_sliding_window", config.model_type == "mistral")
    if uses_window and window is not None and window < max_model_len:
        raise ValueError(f"unsupported: sliding_window={window} < {max_model_len=}")


def _tied(config: PretrainedConfig, weights: Mapping[str, torch.Tensor]) -> bool:
    return getattr(config, "tie_word_embeddings", False) or "lm_head.weight" not in weights


def head_weight(config: PretrainedConfig, weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The output head's ``[vocab, hidden]`` weight, in the checkpoint's dtype:
    the embedding where the checkpoint ties them (or has no ``lm_head``)."""
    return weights["model.embed_tokens.weight" if _tied(config, weights) else "lm_head.weight"]


def fused_linear_weights(
    weights: Mapping[str, torch.Tensor], i: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Layer ``i``'s linears as the forward runs them: ``{kind: (weight [out, in], bias [out] or None)}``
    for the kinds ``qkv`` (q, k, v rows stacked), ``o_proj``, ``gate_up``
    (gate, up rows stacked) and ``down``, in the checkpoint's dtype; biases where
    the checkpoint has them (Qwen2: q/k/v; Llama with ``attention_bias``: q/k/v and o)."""
    att, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    qkv_bias = o_bias = None
    if att + "q_proj.bias" in weights:
        qkv_bias = torch.cat([weights[f"{att}{x}_proj.bias"] for x in "qkv"])
    if att + "o_proj.bias" in weights:
        o_bias = weights[att + "o_proj.bias"]
    return {
        "qkv": (torch.cat([weights[f"{att}{x}_proj.weight"] for x in "qkv"]), qkv_bias),
        "o_proj": (weights[att + "o_proj.weight"], o_bias),
        "gate_up": (torch.cat([weights[mlp + "gate_proj.weight"], weights[mlp + "up_proj.weight"]]), None),
        "down": (weights[mlp + "down_proj.weight"], None),
    }


def _fused_layer(
    weights: Mapping[str, torch.Tensor],
    i: int,
    to: Callable[[torch.Tensor], torch.Tensor],
    linear: Callable[..., LinearLayer],
    linears: dict[str, LinearLayer] | None = None,
) -> LayerWeights:
    """Layer ``i``'s weights, q/k/v and gate/up fused (:func:`fused_linear_weights`),
    or ``linears`` where the caller built them."""
    p = f"model.layers.{i}."
    if linears is None:
        linears = {
            kind: linear(to(w), None if b is None else to(b))
            for kind, (w, b) in fused_linear_weights(weights, i).items()
        }
    return LayerWeights(
        input_norm=to(weights[p + "input_layernorm.weight"]),
        post_norm=to(weights[p + "post_attention_layernorm.weight"]),
        **linears,
    )


class LlamaModel:
    """The forward pass; holds fused weights and the rotary cache, no KV state.

    Args:
        config: a transformers Llama/Qwen2/Mistral config.
        weights: HF parameter names -> tensors (read, not kept).
        ops: kernel ops of the backend.
        dtype, device: where and in what the weights live.
        max_model_len: positions covered by the rotary cache.
        linear_format: format of the linear layers (``bargein.engine.model.linear``):
            ``"float32"`` keeps ``dtype``; ``"bfloat16"``/``"int8"`` convert.
        head_format: format of the output head; ``None`` is ``linear_format``.
            A tied head gets its own converted copy; the embedding lookup
            stays in ``dtype``.
        edge_format: format of the first and the last layer's linears
            (``None``: ``linear_format``): int8 keeps them in bf16, where
            quantization errors cost the most (docs/perf/quality.md).
        linears: layer ``i`` -> its linears, fused as
            :func:`fused_linear_weights` names them, built by the caller (a
            GGUF's blocks: ``gguf_linears``); ``weights`` then gives only
            the norms. None: built from ``weights`` in ``linear_format``.
        embedding: ``[T]`` ids -> ``[T, H]``, in place of a lookup in
            ``weights``' embedding (which ``embed`` then is not).
        lm_head: the output head, in place of one built from ``weights``.

    Raises:
        ValueError: a config feature this forward does not implement.
        KeyError: a weight missing from ``weights``.
    """

    def __init__(
        self,
        config: PretrainedConfig,
        weights: Mapping[str, torch.Tensor],
        ops: Ops,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
        linear_format: str = "float32",
        head_format: str | None = None,
        edge_format: str | None = None,
        *,
        linears: Callable[[int], dict[str, LinearLayer]] | None = None,
        embedding: Callable[[torch.Tensor], torch.Tensor] | None = None,
        lm_head: LinearLayer | None = None,
    ) -> None:
        _check_supported(config, max_model_len)
        self.linear_format = linear_format
        self.head_format = linear_format if head_format is None else head_format
        self.shape = model_shape(config)
        self.ops = ops

        def to(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype).contiguous()

        def linear(w: torch.Tensor, b: torch.Tensor | None = None) -> LinearLayer:
            return make_linear(w, b, linear_format)

        def edge_linear(w: torch.Tensor, b: torch.Tensor | None = None) -> LinearLayer:
            return make_linear(w, b, edge_format or linear_format)

        last = self.shape.num_layers - 1
        self.layers = [
            _fused_layer(
                weights,
                i,
                to,
                edge_linear if i in (0, last) else linear,
                None if linears is None else linears(i),
            )
            for i in range(self.shape.num_layers)
        ]
        self.norm = to(weights["model.norm.weight"])
        self.embed: torch.Tensor | None = None
        if embedding is None:
            table = to(weights["model.embed_tokens.weight"])
            self.embed = table
            self.embedding: Callable[[torch.Tensor], torch.Tensor] = lambda ids: F.embedding(ids, table)
        else:
            self.embedding = embedding
        if lm_head is None:
            head = self.embed if _tied(config, weights) else to(weights["lm_head.weight"])
            assert head is not None, "a tied head needs the embedding table"
            lm_head = make_linear(head, None, self.head_format)
        self.lm_head: LinearLayer = lm_head
        inv_freq, scaling = _rope_inv_freq(config)
        self.cos_sin_cache = build_cos_sin_cache(max_model_len, self.shape.head_dim, inv_freq, scaling).to(
            device
        )
        self.scale = self.shape.head_dim**-0.5

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states after the final norm.

        Args:
            input_ids: ``[T]`` int64, decode tokens first, then prefill chunks.
            positions: ``[T]`` int64.
            meta: where K/V go and what each query reads.
            kv_caches: ``[L, 2, num_blocks, block_size, Hk, D]``, written in place.

        Returns:
            ``[T, H]`` hidden states.
        """
        x = self.embedding(input_ids)
        residual = None
        decode = None  # the step's fused decode attention, prepared once for all layers
        if self.ops.decode_attention is not None and meta.num_prefill_seqs == 0:
            decode = self.ops.decode_attention(
                positions,
                self.cos_sin_cache,
                meta.slot_mapping,
                meta.decode_block_tables,
                meta.decode_seq_lens,
                self.shape.num_heads,
                self.scale,
            )
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = self.ops.rms_norm(x, layer.input_norm, self.shape.rms_norm_eps, residual)
            h = self._attention(h, layer, positions, meta, kv, decode)
            h, residual = self.ops.rms_norm(h, layer.post_norm, self.shape.rms_norm_eps, residual)
            x = self._mlp(h, layer)
        return self.ops.rms_norm(x, self.norm, self.shape.rms_norm_eps, residual)[0]

    def _mlp(self, h: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gate_up = layer.gate_up(h)
        # a down projection that takes the gate and up halves does the SiLU-mul
        # in its own pass (weight_only.RowSplitLinear.gated): one op less per
        # layer, 30 a step, at about 15 us each on a CPU at one sequence
        gated = getattr(layer.down, "gated", None)
        if gated is not None:
            return gated(gate_up)
        return layer.down(self.ops.silu_and_mul(gate_up))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` hidden states -> ``[N, vocab]`` float32 logits."""
        return self.lm_head(hidden).float()

    def _attention(
        self,
        h: torch.Tensor,
        layer: LayerWeights,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: torch.Tensor,
        decode: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None,
    ) -> torch.Tensor:
        # kv: [2 (k, v), num_blocks, block_size, Hk, D], this layer's cache
        s = self.shape
        num_tokens = h.shape[0]
        qkv = layer.qkv(h)
        if decode is not None:
            return layer.o_proj(decode(qkv, kv[0], kv[1]).view(num_tokens, -1))
        q, k, v = qkv.split(
            [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], -1
        )
        q, k = self.ops.rotary_embedding(
            q.view(num_tokens, s.num_heads, s.head_dim),
            k.view(num_tokens, s.num_kv_heads, s.head_dim),
            positions,
            self.cos_sin_cache,
        )
        v = v.view(num_tokens, s.num_kv_heads, s.head_dim)
        self.ops.write_kv_cache(k, v, kv[0], kv[1], meta.slot_mapping)
        out = self._paged_attention(q, meta, kv)
        return layer.o_proj(out.view(num_tokens, -1))

    def _paged_attention(self, q: torch.Tensor, meta: AttentionMetadata, kv: torch.Tensor) -> torch.Tensor:
        # q: [T, Hq, D]; decode rows [:B] take the batched path, the rest the varlen path
        num_decode = meta.num_decode_tokens
        if meta.num_prefill_seqs == 0:
            return self._decode_attention(q, meta, kv)
        prefill = self.ops.paged_attention_prefill(
            q[num_decode:],
            kv[0],
            kv[1],
            meta.prefill_block_tables,
            meta.prefill_query_start_loc,
            meta.prefill_seq_lens,
            self.scale,
        )
        if num_decode == 0:
            return prefill
        return torch.cat((self._decode_attention(q[:num_decode], meta, kv), prefill))

    def _decode_attention(self, q: torch.Tensor, meta: AttentionMetadata, kv: torch.Tensor) -> torch.Tensor:
        return self.ops.paged_attention_decode(
            q, kv[0], kv[1], meta.decode_block_tables, meta.decode_seq_lens, self.scale
        )


def _rope_inv_freq(config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """``(inv_freq [D/2], attention_scaling)`` as transformers computes them."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = model_shape(config).head_dim
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS or rope_type == "dynamic":
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    return ROPE_INIT_FUNCTIONS[rope_type](config)
