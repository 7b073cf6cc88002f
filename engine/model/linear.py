"""Linear layers with oneDNN-prepacked weights for batched CPU steps.

On the CPU, ``F.linear`` re-lays out the weight for every small-batch GEMM;
oneDNN can lay it out once at load (``mkldnn._reorder_linear_weight``, what
inductor's ``freezing=True`` does) and then runs batched decode steps about
1.4-1.7x faster (measured here at 8 and 32 rows, fp32). At one row plain
``F.linear`` is as fast or faster, so small inputs keep it; the price is a
second copy of the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# rows from which the prepacked GEMM wins (measured: slower at 1, faster at 8)
PACKED_MIN_ROWS = 4


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear:
    """``y = x @ weight.T + bias`` for ``x [T, in]``, ``weight [out, in]``.

    Args:
        weight: ``[out, in]``, kept as is for small inputs.
        bias: ``[out]`` or None.
        prepack: also keep a oneDNN-prepacked copy for inputs of at least
            PACKED_MIN_ROWS rows (CPU fp32 only; ignored elsewhere).
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True
    ) -> None:
        self.weight = weight
        self.bias = bias
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(weight) if prepack and _can_pack(weight) else None
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.shape[0] >= PACKED_MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
