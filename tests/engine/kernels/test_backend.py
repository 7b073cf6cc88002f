"""The backend switch, and the package without triton installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bargein.engine.kernels import TORCH_OPS, get_ops
from bargein.engine.kernels.paged_attention import paged_attention_decode
from bargein.engine.kernels.rms_norm import rms_norm


def test_get_ops_switches_between_references_and_kernels() -> None:
    assert get_ops("torch") is TORCH_OPS
    triton_ops = get_ops("triton")
    assert triton_ops.rms_norm is rms_norm and triton_ops.paged_attention_decode is paged_attention_decode
    with pytest.raises(ValueError, match="backend"):
        get_ops("cuda")  # type: ignore[arg-type]


def test_package_imports_and_runs_torch_ops_without_triton() -> None:
    """With triton unimportable, the references run and asking for the kernels raises ImportError."""
    code = """
import sys
sys.modules["triton"] = None  # import triton -> ImportError
import torch
from bargein.engine.kernels import get_ops
x = torch.randn(2, 8)
out, _ = get_ops("torch").rms_norm(x, torch.ones(8), 1e-6)
assert out.shape == (2, 8)
try:
    get_ops("triton")
except ImportError as e:
    print("ImportError:", e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ImportError: backend='triton' needs triton" in done.stdout
