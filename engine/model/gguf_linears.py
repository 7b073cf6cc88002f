"""A GGUF's layers on the block kernels, built from the file's own blocks.

Each linear runs on the file's codes and scales (``cpu_qblock.BlockLinear``:
Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) with no fp32 copy at any time, so
building the model takes about the file's size in memory. The forward's
fused projections (q/k/v, gate/up) are one kernel where their parts share a
type, else one kernel a part, concatenated (a Q4_K_M file keeps ``attn_v``
in Q6_K on some layers). A tensor of another type (F16, BF16, F32, Q5_0,
Q2_K, ...) is requantized to Q8_0 blocks of 32 from its dequantized values
(a tensor at a time), so every row of every step still takes the same
integer arithmetic whatever shares the step (docs/design.md "Exact by
default"); such a tensor loses the rounding of 8 bits, measured in
docs/perf/quality.md.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gguf.quants import dequantize

from bargein.engine.kernels import cpu_qblock
from bargein.engine.kernels.cpu_qblock import BlockLinear
from bargein.engine.model.gguf_model import GgufWeights

logger = logging.getLogger(__name__)

LinearLayer = Callable[[torch.Tensor], torch.Tensor]


class ConcatLinear:
    """Parts run one after the other, outputs side by side: ``[rows, sum(out_i)]``."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[BlockLinear]) -> None:
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


class GgufEmbedding:
    """The token embedding looked up in the file's blocks: the rows asked
    for, dequantized (``gguf.quants.dequantize``) at each call; a float
    table is kept as fp32. ``[T]`` int64 ids -> ``[T, hidden]`` fp32."""

    __slots__ = ("raw", "ggml_type", "table")

    def __init__(self, weights: GgufWeights) -> None:
        name = "model.embed_tokens.weight"
        # a view: a lookup reads the rows it needs from the page cache
        self.raw, self.ggml_type = weights.raw(name, copy=False)
        self.table = weights[name] if self.ggml_type.name in ("F32", "F16", "BF16") else None

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table is not None:
            return F.embedding(ids, self.table)
        rows = dequantize(self.raw[ids.numpy()], self.ggml_type)
        return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))


def _block_linear(
    weights: GgufWeights, names: list[str], bias: torch.Tensor | None, used: Counter[str]
) -> LinearLayer:
    """One linear over HF tensors ``names`` stacked along the output."""
    raws = [weights.raw(name) for name in names]
    in_features = weights.shape(names[0])[-1]
    types = {ggml_type.name for _, ggml_type in raws}
    if len(types) == 1 and (ggml := types.pop()) in cpu_qblock.GGUF_TYPES:
        used[ggml] += 1
        raw = raws[0][0] if len(raws) == 1 else np.concatenate([r for r, _ in raws])
        return BlockLinear.from_gguf(raw, ggml, in_features, bias)
    if len(raws) > 1:
        parts, start = [], 0
        for name, (raw, _) in zip(names, raws):
            width = raw.shape[0]
            part_bias = None if bias is None else bias[start : start + width]
            parts.append(_block_linear(weights, [name], part_bias, used))
            start += width
        return ConcatLinear(parts)  # type: ignore[arg-type]
    used[f"{raws[0][1].name} as Q8_0"] += 1  # a type without a kernel: its values in Q8_0 blocks
    return cpu_qblock.Q8_0Linear(weights[names[0]], bias)


def layer_linears(weights: GgufWeights, i: int, used: Counter[str]) -> dict[str, LinearLayer]:
    """Layer ``i``'s linears as the forward fuses them (``llama.fused_linear_weights``'s kinds),
    counting the formats taken in ``used``."""
    att, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    qkv_bias = None
    if att + "q_proj.bias" in weights:
        qkv_bias = torch.cat([weights[f"{att}{x}_proj.bias"] for x in "qkv"])
    o_bias = weights[att + "o_proj.bias"] if att + "o_proj.bias" in weights else None
    return {
        "qkv": _block_linear(weights, [f"{att}{x}_proj.weight" for x in "qkv"], qkv_bias, used),
        "o_proj": _block_linear(weights, [att + "o_proj.weight"], o_bias, used),
        "gate_up": _block_linear(weights, [mlp + "gate_proj.weight", mlp + "up_proj.weight"], None, used),
        "down": _block_linear(weights, [mlp + "down_proj.weight"], None, used),
    }


def output_head(weights: GgufWeights, used: Counter[str]) -> LinearLayer:
    """The output head: ``output.weight``, or the embedding where the file ties them."""
    name = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    return _block_linear(weights, [name], None, used)
