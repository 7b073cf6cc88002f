"""SmoothQuant for the W8A8 linears: move activation outliers into the weights.

Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization
for Large Language Models" (ICML 2023, arXiv:2211.10438), eq. 4: for a
linear ``Y = X W^T`` and a per-input-channel ``s``,
``Y = (X diag(s)^-1) (W diag(s))^T``, with

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

so the activation's channels (quantized per token, one scale per row) lose
their outliers and the weight (quantized per output channel) takes them,
where per-channel scales absorb them. ``diag(s)^-1`` is folded into what
computes ``X``, so the model stays exactly the same function in exact
arithmetic:

- ``qkv`` and ``gate_up`` read an RMSNorm's output: the norm's gain ``/ s``;
- ``down`` reads ``silu(gate) * up``: ``up``'s output rows ``/ s``;
- ``o_proj`` reads the attention output, a mix of ``v`` rows per head:
  ``v``'s output rows ``/ s``, one ``s`` per KV channel (the max over the
  query heads sharing it, GQA).

``max|X_j|`` comes from a calibration pass of the fp32 model over
``calibration.txt`` (:func:`activation_absmax`), text not used by the
quality measurement (``loadtests/quality.py``), cached between starts in a
file named by the weights' content (:func:`calibration_key`) and checked
when read (:func:`cached_absmax`): anything else is calibrated again. Pure
torch, weights in and out as the checkpoint's names.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
ALPHA = 0.5  # the paper's default; measured here: docs/perf/quality.md
CALIBRATION_TOKENS = 1024  # of calibration.txt: a few seconds of fp32 prefill at load
CALIBRATION_WINDOW = 256  # tokens per calibration sequence (a small KV pool holds one)
LINEAR_KINDS = ("qkv", "o_proj", "gate_up", "down")
_SCALE_RANGE = (1e-2, 1e2)  # keeps a dead channel from blowing up its weight column
_EPS = 1e-5

AbsMax = dict[tuple[int, str], torch.Tensor]
HEADER_BYTES = 1 << 20  # of each weight file hashed into the cache key (with its size and mtime)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Smoothing:
    """How one fused linear of the smoothed model relates to the checkpoint's:
    ``W_smoothed = diag(1 / out_scale) @ W @ diag(in_scale)``, ``W [out, in]``.

    The smoothed model's input to it is ``x / in_scale`` and its output is
    the checkpoint's divided by ``out_scale``: a kernel over the checkpoint's
    own weights (``weight_only.Int4Linear``) computes the smoothed linear by
    multiplying its input by ``in_scale`` and dividing its output by ``out_scale``.

    Attributes:
        in_scale: ``[in]`` fp32.
        out_scale: ``[out]`` fp32, or None for all ones.
    """

    in_scale: torch.Tensor
    out_scale: torch.Tensor | None = None


class _Recording:
    """A linear layer that records ``max |x|`` per input channel, then computes."""

    def __init__(
        self, inner: Callable[[torch.Tensor], torch.Tensor], key: tuple[int, str], into: AbsMax
    ) -> None:
        self.inner = inner
        self.key = key
        self.into = into

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        seen = x.detach().abs().amax(0).float()
        old = self.into.get(self.key)
        self.into[self.key] = seen if old is None else torch.maximum(old, seen)
        return self.inner(x)


def activation_absmax(model: Any, run: Callable[[], None]) -> AbsMax:
    """``max |x|`` per input channel of every layer's four linears while ``run()``
    runs the model (fp32) over calibration text.

    Returns:
        ``{(layer, kind): [in_features] float32}``; kinds: :data:`LINEAR_KINDS`.
    """
    stats: AbsMax = {}
    originals = []
    for i, layer in enumerate(model.layers):
        for kind in LINEAR_KINDS:
            inner = getattr(layer, kind)
            originals.append((layer, kind, inner))
            object.__setattr__(layer, kind, _Recording(inner, (i, kind), stats))  # frozen dataclass
    try:
        run()
    finally:
        for layer, kind, inner in originals:
            object.__setattr__(layer, kind, inner)
    return stats


def cached_absmax(
    path: Path, compute: Callable[[], AbsMax], expected: Mapping[tuple[int, str], int] | None = None
) -> AbsMax:
    """:func:`activation_absmax`'s result from ``path`` if an earlier start
    saved it and it is sound, else ``compute()``, saved there (written whole,
    then renamed, so a crash never leaves half a file; an unwritable cache
    only costs the next start the calibration again).

    Sound (:func:`absmax_problem`): a file this user owns and others cannot
    write, holding a dict of ``"<layer>.<kind>"`` to 1-D finite, non-negative
    float32 tensors, with ``expected``'s keys and widths when given
    (``{(layer, kind): in_features}``, :func:`expected_widths`). Anything else
    is logged and calibrated again.
    """
    if path.is_file():
        problem = _file_problem(path)
        if problem is None:
            try:
                saved = torch.load(path, weights_only=True)
            except (OSError, RuntimeError, ValueError, IndexError, EOFError, pickle.UnpicklingError) as exc:
                problem = f"unreadable ({type(exc).__name__})"
            else:
                problem, stats = absmax_problem(saved, expected)
                if problem is None:
                    return stats
        logger.warning("SmoothQuant statistics %s: %s; calibrating again", path, problem)
    stats = compute()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({f"{i}.{kind}": t for (i, kind), t in stats.items()}, tmp)
        os.chmod(tmp, 0o644)
        tmp.replace(path)
    return stats


def _file_problem(path: Path) -> str | None:
    """Why a statistics file must not be trusted (another owner, writable by
    others: it decides the model's weights), or None."""
    info = path.stat()
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.filemode(info.st_mode)})"
    return None


def absmax_problem(
    saved: object, expected: Mapping[tuple[int, str], int] | None = None
) -> tuple[str | None, AbsMax]:
    """Check what a statistics file held: ``(None, statistics)`` when sound
    (see :func:`cached_absmax`), else ``(what is wrong, {})``."""
    if not isinstance(saved, dict):
        return f"holds a {type(saved).__name__}, not a dict", {}
    stats: AbsMax = {}
    for name, t in saved.items():
        layer, _, kind = str(name).partition(".")
        if not layer.isdigit() or kind not in LINEAR_KINDS:
            return f"unknown entry {str(name)[:40]!r}", {}
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.float32:
            return f"entry {name!r} is not a 1-D float32 tensor", {}
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            return f"entry {name!r} holds NaN, infinite or negative values", {}
        stats[(int(layer), kind)] = t
    if expected is not None:
        if stats.keys() != expected.keys():
            return f"holds {len(stats)} entries, the model has {len(expected)} linears", {}
        for key, t in stats.items():
            if t.numel() != expected[key]:
                return f"entry {key} is {t.numel()} wide, the model's is {expected[key]}", {}
    return None, stats


def expected_widths(weights: Mapping[str, torch.Tensor], num_layers: int) -> dict[tuple[int, str], int]:
    """``{(layer, kind): in_features}`` of the four linears of each layer of a
    checkpoint (names as in ``llama.py``): what its statistics must hold."""
    widths: dict[tuple[int, str], int] = {}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        widths[(i, "qkv")] = weights[p + "self_attn.q_proj.weight"].shape[1]
        widths[(i, "o_proj")] = weights[p + "self_attn.o_proj.weight"].shape[1]
        widths[(i, "gate_up")] = weights[p + "mlp.gate_proj.weight"].shape[1]
        widths[(i, "down")] = weights[p + "mlp.down_proj.weight"].shape[1]
    return widths


def calibration_key(files: Sequence[str]) -> str:
    """The cache file name of a model's statistics: the content of ``files``
    (its weight files and config; each one's name, size, modification time
    and first :data:`HEADER_BYTES`), the text and the pass; so new weights
    get their own statistics.

    Raises:
        TypeError: ``files`` is one string (a folder was the argument before
            the GGUF loader: its characters are not files).
    """
    if isinstance(files, str):
        raise TypeError(f"calibration_key takes the weight files, not one path: {files!r}")
    digest = hashlib.sha256(f"{CALIBRATION_TOKENS}|{CALIBRATION_WINDOW}|".encode())
    digest.update(CALIBRATION_TEXT.read_bytes())
    for file in sorted(map(Path, files)):
        info = file.stat()
        digest.update(f"|{file.name}|{info.st_size}|{info.st_mtime_ns}|".encode())
        with file.open("rb") as f:
            digest.update(f.read(HEADER_BYTES))
    return f"smoothquant-{digest.hexdigest()[:16]}.pt"


def smoothing_scale(x_absmax: torch.Tensor, w: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    """``s [in]`` of SmoothQuant eq. 4 for activations with ``x_absmax [in]`` and
    weights ``w [out, in]`` (fp32), clamped to [0.01, 100]."""
    w_absmax = w.abs().amax(0).float().clamp_min(_EPS)
    s = x_absmax.clamp_min(_EPS).pow(alpha) / w_absmax.pow(1 - alpha)
    return s.clamp(*_SCALE_RANGE)


def smooth_weights(
    weights: dict[str, torch.Tensor], absmax: AbsMax, shape: Any, alpha: float = ALPHA
) -> tuple[dict[str, torch.Tensor], dict[tuple[int, str], Smoothing]]:
    """The checkpoint's weights with every layer's linears smoothed (a new dict;
    tensors it changes are new, fp32), and each fused linear's scales.
    The model they make computes the same function (up to rounding) as
    ``weights``'.

    Returns:
        ``(smoothed weights, {(layer, kind): Smoothing})``, kinds
        :data:`LINEAR_KINDS` (the fused q/k/v and gate/up of ``llama.py``).

    Args:
        weights: checkpoint names -> tensors.
        absmax: :func:`activation_absmax` of the model of ``weights``.
        shape: its :class:`bargein.engine.model.llama.ModelShape` (layers, heads, head size).
        alpha: SmoothQuant's migration strength.

    Raises:
        KeyError: a layer's weight or its statistics are missing.
    """
    w = dict(weights)
    smoothings: dict[tuple[int, str], Smoothing] = {}
    num_kv_heads, head_dim = shape.num_kv_heads, shape.head_dim
    group = shape.num_heads // num_kv_heads
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        att, mlp = p + "self_attn.", p + "mlp."
        qkv = [att + f"{x}_proj.weight" for x in "qkv"]
        s_qkv = smoothing_scale(absmax[(i, "qkv")], torch.cat([w[k] for k in qkv]), alpha)
        w[p + "input_layernorm.weight"] = w[p + "input_layernorm.weight"].float() / s_qkv
        for k in qkv:
            w[k] = w[k].float() * s_qkv

        gate, up = mlp + "gate_proj.weight", mlp + "up_proj.weight"
        s_gate_up = smoothing_scale(absmax[(i, "gate_up")], torch.cat([w[gate], w[up]]), alpha)
        w[p + "post_attention_layernorm.weight"] = (
            w[p + "post_attention_layernorm.weight"].float() / s_gate_up
        )
        w[gate], w[up] = w[gate].float() * s_gate_up, w[up].float() * s_gate_up

        down = mlp + "down_proj.weight"
        s_down = smoothing_scale(absmax[(i, "down")], w[down], alpha)
        w[up] = w[up] / s_down[:, None]
        w[down] = w[down].float() * s_down

        o, v = att + "o_proj.weight", att + "v_proj.weight"
        s = smoothing_scale(absmax[(i, "o_proj")], w[o], alpha)
        s_kv = s.view(num_kv_heads, group, head_dim).amax(1).reshape(-1)  # one scale per v channel
        s_o = s_kv.view(num_kv_heads, 1, head_dim).expand(num_kv_heads, group, head_dim).reshape(-1)
        w[v] = w[v].float() / s_kv[:, None]
        w[o] = w[o].float() * s_o
        if att + "v_proj.bias" in w:
            w[att + "v_proj.bias"] = w[att + "v_proj.bias"].float() / s_kv

        ones_qk = torch.ones(w[qkv[0]].shape[0] + w[qkv[1]].shape[0])
        smoothings[(i, "qkv")] = Smoothing(s_qkv, torch.cat((ones_qk, s_kv)))
        smoothings[(i, "o_proj")] = Smoothing(s_o)
        smoothings[(i, "gate_up")] = Smoothing(s_gate_up, torch.cat((torch.ones(w[gate].shape[0]), s_down)))
        smoothings[(i, "down")] = Smoothing(s_down)
    return w, smoothings
