"""Write GGUF files of real model shapes with seeded random weights, block by block.

For the benchmarks and tests of issue 42: a file of a Qwen2.5-1.5B or a
Llama-3.1-8B shape in Q4_K_M or Q8_0, written with the ``gguf`` package's
``GGUFWriter`` straight from random blocks, so that no float checkpoint of
the model's size ever exists on the machine. A block's codes are uniform
random bytes and its fp16 scales are set to a small positive value, so every
block is a valid block of its type and the weights stay about 0.02 in size
(the hidden states stay finite through the layers; the text is noise, so
benchmarks fix lengths with ``ignore_eos``). The tokenizer is the bundled
SmolLM2 GGUF's (gpt2 BPE, 49,152 tokens), padded with plain tokens to the
shape's vocabulary so that the embedding and head have the real size.

Q4_K_M is llama.cpp's mix (``llama_tensor_get_type`` in
``src/llama-quant.cpp``): Q4_K everywhere but Q6_K for the output head (the
embedding where tied) and for ``attn_v`` and ``ffn_down`` in the layers its
``use_more_bits`` rule picks (the first and last eighth and every third in
between).

Usage: ``python loadtests/gguf_synth.py --shape qwen2.5-1.5b --mix q4_k_m --out /tmp/q.gguf``
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bargein.engine.model.gguf_file import read_gguf  # noqa: E402
from bargein.engine.model.loader import default_model_path  # noqa: E402


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """A Llama-family shape (the sizes of its ``config.json``)."""

    arch: str  # "llama" or "qwen2"
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool
    rope_theta: float
    context: int = 32768


SHAPES = {
    # Qwen/Qwen2.5-1.5B-Instruct's config.json
    "qwen2.5-1.5b": Shape(
        arch="qwen2", layers=28, hidden=1536, ffn=8960, heads=12, kv_heads=2, vocab=151936,
        tied=True, qkv_bias=True, rope_theta=1e6,
    ),
    # meta-llama/Llama-3.1-8B-Instruct's (its rope_freqs long-context scaling left out)
    "llama-3.1-8b": Shape(
        arch="llama", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256,
        tied=False, qkv_bias=False, rope_theta=5e5,
    ),
    # small shapes whose K dims are multiples of 256 (every K-quant), for tests
    "tiny": Shape(
        arch="llama", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, vocab=49152,
        tied=True, qkv_bias=False, rope_theta=1e4, context=2048,
    ),
    "tiny-qwen2": Shape(
        arch="qwen2", layers=2, hidden=256, ffn=768, heads=4, kv_heads=2, vocab=49152,
        tied=False, qkv_bias=True, rope_theta=1e6, context=2048,
    ),
}  # fmt: skip

# byte ranges of each type's fp16 scales, set to SCALE[type] (the codes stay random)
_SCALES = {
    "Q4_0": [(0, 2)], "Q4_1": [(0, 2), (2, 4)], "Q8_0": [(0, 2)],
    "Q4_K": [(0, 2), (2, 4)], "Q5_K": [(0, 2), (2, 4)], "Q6_K": [(208, 210)],
}  # fmt: skip
# weights about 0.02-0.05: Q4_0 d(q - 8), Q8_0 d q, K-quants d sc q with sc up to 63 (Q6_K's s8)
SCALE = {"Q4_0": 4e-3, "Q4_1": 4e-3, "Q8_0": 3e-4, "Q4_K": 6e-5, "Q5_K": 3e-5, "Q6_K": 2e-5}
_FLOATS = {"F32": np.float32, "F16": np.float16}


def random_blocks(rng: np.random.Generator, ggml_type: str, rows: int, cols: int) -> np.ndarray:
    """``[rows, row_bytes]`` uint8 of valid random ``ggml_type`` blocks (or a float tensor)."""
    if ggml_type in _FLOATS:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(_FLOATS[ggml_type])
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.full((rows, cols // block), SCALE[ggml_type], np.float16).view(np.uint8).reshape(rows, -1, 2)
    for lo, hi in _SCALES[ggml_type]:
        raw[:, :, lo:hi] = scale
    return raw.reshape(rows, -1)


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_types(shape: Shape, mix: str) -> dict[str, str]:
    """GGUF tensor name -> ggml type name for ``mix`` (``q4_k_m``, ``q8_0`` or a type for all)."""
    names = ["token_embd.weight", *([] if shape.tied else ["output.weight"])]
    for i in range(shape.layers):
        names += [
            f"blk.{i}.{n}.weight"
            for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
        ]
    if mix == "q8_0":
        return dict.fromkeys(names, "Q8_0")
    if mix != "q4_k_m":
        return dict.fromkeys(names, mix.upper())
    types = dict.fromkeys(names, "Q4_K")
    types["output.weight" if not shape.tied else "token_embd.weight"] = "Q6_K"
    for i in range(shape.layers):
        if _more_bits(i, shape.layers):
            types[f"blk.{i}.attn_v.weight"] = types[f"blk.{i}.ffn_down.weight"] = "Q6_K"
    return types


def _matrix_shape(shape: Shape, name: str) -> tuple[int, int]:
    d = shape.hidden // shape.heads
    kind = name.split(".")[-2]
    return {
        "token_embd": (shape.vocab, shape.hidden),
        "output": (shape.vocab, shape.hidden),
        "attn_q": (shape.heads * d, shape.hidden),
        "attn_k": (shape.kv_heads * d, shape.hidden),
        "attn_v": (shape.kv_heads * d, shape.hidden),
        "attn_output": (shape.hidden, shape.heads * d),
        "ffn_gate": (shape.ffn, shape.hidden),
        "ffn_up": (shape.ffn, shape.hidden),
        "ffn_down": (shape.hidden, shape.ffn),
    }[kind]


def write_gguf(path: Path, shape: Shape, types: dict[str, str], seed: int = 0) -> None:
    """Write a GGUF of ``shape`` whose matrices take ``types`` (GGUF name -> type name)."""
    rng = np.random.default_rng(seed)
    source = read_gguf(default_model_path()).metadata
    tokens = list(source["tokenizer.ggml.tokens"])
    token_types = list(source["tokenizer.ggml.token_type"])
    pad = shape.vocab - len(tokens)
    # plain tokens, not "unused" ones: random logits land on them two times in
    # three, and a server that prints unused tokens as nothing would stream
    # no text to time
    tokens += [f"pad{i}" for i in range(pad)]
    token_types += [1] * pad  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL
    writer = GGUFWriter(str(path), shape.arch)
    a = shape.arch
    writer.add_name(f"random {path.stem}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{a}.vocab_size", shape.vocab)
    writer.add_tokenizer_model(source["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(source["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(list(source["tokenizer.ggml.merges"]))
    writer.add_bos_token_id(source["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(source["tokenizer.ggml.eos_token_id"])
    writer.add_chat_template(source["tokenizer.chat_template"])
    norms = ["output_norm.weight"] + [
        f"blk.{i}.{n}.weight" for i in range(shape.layers) for n in ("attn_norm", "ffn_norm")
    ]
    for name in norms:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape.hidden)).astype(np.float32))
    if shape.qkv_bias:
        d = shape.hidden // shape.heads
        for i in range(shape.layers):
            for n, rows in (
                ("attn_q", shape.heads * d),
                ("attn_k", shape.kv_heads * d),
                ("attn_v", shape.kv_heads * d),
            ):
                writer.add_tensor(f"blk.{i}.{n}.bias", (0.02 * rng.standard_normal(rows)).astype(np.float32))
    for name, ggml_type in types.items():
        rows, cols = _matrix_shape(shape, name)
        data = random_blocks(rng, ggml_type, rows, cols)
        raw_dtype = None if ggml_type in _FLOATS else GGMLQuantizationType[ggml_type]
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--mix", default="q4_k_m", help="q4_k_m, q8_0, or one ggml type for every matrix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    write_gguf(args.out, shape, tensor_types(shape, args.mix), args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
