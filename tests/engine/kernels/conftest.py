"""Kernel tests: compiled on CUDA when there is a GPU, else Triton's CPU interpreter.

The root ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` without CUDA (it
must be set before ``triton.language`` is imported). ``gpu`` tests skip
themselves without CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU if there is one (compiled), else the CPU (interpreted)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make ``torch.empty``/``empty_like`` return NaN-filled floats, so an output
    element a kernel forgets to write fails the comparison."""
    empty, empty_like = torch.empty, torch.empty_like

    def _poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: _poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: _poison(empty_like(*a, **kw)))
    yield
