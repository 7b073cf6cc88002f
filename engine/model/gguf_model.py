"""A Llama-family model's config and weights straight from a GGUF file.

llama.cpp's converter (``convert_hf_to_gguf.py``) writes Llama, Mistral and
Qwen2 checkpoints under the GGUF names of ``gguf``'s tensor map
(``blk.N.attn_q.weight``, ...) with the architecture's hyperparameters under
``{arch}.*`` keys. This module reads them back as Hugging Face names and a
transformers config, so the forward (``llama.py``) is the same for every
source. Two things the converter changed are undone here: for the ``llama``
architecture it permutes the rows of ``attn_q`` and ``attn_k`` (ggml's
rotary pairs adjacent dims, HF's rotate_half pairs dim ``i`` with ``i + D/2``);
and a tied output head is written once, as ``token_embd``.

:class:`GgufWeights` serves a tensor two ways: dequantized to fp32 on access
(``gguf.quants.dequantize``; for the float formats and for transformers-style
consumers), or as the file's own rows of blocks (:meth:`GgufWeights.raw`)
for the block kernels, which never make an fp32 copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from gguf.quants import dequantize
from transformers import AutoConfig, PretrainedConfig

from bargein.engine.model.gguf_file import GgufFile

ARCHITECTURES = ("llama", "qwen2")

# GGUF tensor name (with {i} for the layer) -> Hugging Face name
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name; None for one the forward does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def architecture(file: GgufFile) -> str:
    """``general.architecture``, checked.

    Raises:
        ValueError: an architecture outside :data:`ARCHITECTURES`.
    """
    arch = str(file.metadata.get("general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    return arch


def config_from_gguf(file: GgufFile) -> PretrainedConfig:
    """The transformers config of ``file`` (``LlamaConfig`` or ``Qwen2Config``).

    Raises:
        ValueError: an unsupported architecture, rope scaling, or a file
            that lacks a required key.
    """
    arch = architecture(file)
    meta = file.metadata

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"the GGUF lacks {arch}.{name}")
        return value

    if "rope_freqs.weight" in file.tensors:
        raise ValueError(
            "unsupported: per-dimension rope frequencies (rope_freqs.weight, Llama 3.1 long context)"
        )
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    rope: dict[str, Any] = {"rope_theta": float(key("rope.freq_base", 10000.0)), "rope_type": "default"}
    if scaling == "linear":
        rope.update(rope_type="linear", factor=float(key("rope.scaling.factor")))
    elif scaling != "none":
        raise ValueError(f"unsupported rope scaling {scaling!r} (supported: none, linear)")
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (
        len(tokens) if tokens else file.tensors["token_embd.weight"].shape[0]
    )
    fields: dict[str, Any] = {
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "hidden_act": "silu",
    }
    for field, token in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        if f"tokenizer.ggml.{token}_token_id" in meta:
            fields[f"{field}_token_id"] = int(meta[f"tokenizer.ggml.{token}_token_id"])
    if arch == "llama":
        fields["attention_bias"] = "blk.0.attn_q.bias" in file.tensors
    else:
        fields["use_sliding_window"] = False
    return AutoConfig.for_model(arch, **fields)


def _unpermute_rows(rows: int, heads: int) -> np.ndarray:
    """Row order that undoes the converter's ``permute`` of a llama q/k
    projection of ``rows = heads * D``: HF row ``(h, t, j)`` is GGUF row
    ``(h, j, t)`` for ``t`` in 0..1, ``j`` in 0..D/2-1."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(rows)


class GgufWeights(Mapping[str, torch.Tensor]):
    """HF name -> fp32 tensor of a GGUF file, dequantized on each access (not kept).

    Args:
        file: the parsed, mapped file.

    Raises:
        ValueError: an unsupported architecture.
    """

    def __init__(self, file: GgufFile) -> None:
        self.file = file
        arch = architecture(file)
        self._names = {h: g for g in file.tensors if (h := hf_name(g)) is not None}
        heads = int(file.metadata[f"{arch}.attention.head_count"])
        kv_heads = int(file.metadata.get(f"{arch}.attention.head_count_kv", heads))
        # llama's q/k rows (and biases) as the converter permuted them; qwen2's are HF's
        self._heads = {"attn_q": heads, "attn_k": kv_heads} if arch == "llama" else {}

    def __getitem__(self, name: str) -> torch.Tensor:
        raw, ggml_type = self.raw(name, copy=False)
        info = self.file.tensors[self._names[name]]
        values = np.array(dequantize(raw, ggml_type).reshape(info.shape), dtype=np.float32)  # a copy
        self.file.release(self._names[name])
        return torch.from_numpy(values)

    def __contains__(self, name: object) -> bool:
        # Mapping's own test is ``self[name]``: it would dequantize the tensor
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        """HF tensor ``name``'s shape, torch order (``(out, in)`` for a matrix)."""
        return self.file.tensors[self._names[name]].shape

    def raw(self, name: str, copy: bool = True) -> tuple[np.ndarray, Any]:
        """``(rows of blocks [out, row_bytes] uint8, ggml type)`` of HF tensor
        ``name``, rows in HF order: a copy, the file's pages released
        (``GgufFile.release``); with ``copy=False`` a view of the map where no
        rows move (its pages stay in the process as they are read).

        Raises:
            KeyError: no such tensor.
        """
        gguf_name = self._names[name]
        info = self.file.tensors[gguf_name]
        raw = self.file.raw(gguf_name)
        kind = gguf_name.split(".")[-2]
        if kind in self._heads and raw.shape[0] > 1:  # the row gather copies
            raw = raw[_unpermute_rows(raw.shape[0], self._heads[kind])]
        elif kind in self._heads:  # a bias: one row of values
            width = raw.shape[1] // info.shape[0]
            values = raw.reshape(info.shape[0], width)[_unpermute_rows(info.shape[0], self._heads[kind])]
            raw = values.reshape(1, -1)
        elif copy:
            raw = np.array(raw)
        if copy:
            self.file.release(gguf_name)
        return raw, info.ggml_type
