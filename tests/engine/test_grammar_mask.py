"""The token bitmask's layout and its application to logits (engine/grammar.py), no model."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.grammar import apply_bitmask
from bargein.engine.request import SamplingParams
from bargein.engine.sampler import Sampler


def bitmask_of(allowed: list[set[int]], vocab: int) -> torch.Tensor:
    """Bit ``t % 32`` of word ``t // 32`` set for each allowed token ``t`` (llguidance's layout)."""
    words = torch.zeros(len(allowed), (vocab + 31) // 32, dtype=torch.int64)
    for row, tokens in enumerate(allowed):
        for t in tokens:
            words[row, t // 32] |= 1 << (t % 32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@settings(max_examples=100, deadline=None)
@given(
    vocab=st.integers(1, 200),
    data=st.data(),
)
def test_masked_rows_keep_only_their_allowed_tokens(vocab: int, data: st.DataObject) -> None:
    num_rows = data.draw(st.integers(1, 4))
    rows = data.draw(st.lists(st.integers(0, num_rows - 1), unique=True, max_size=num_rows))
    allowed = [data.draw(st.sets(st.integers(0, vocab - 1), min_size=1)) for _ in rows]
    logits = torch.randn(num_rows, vocab)
    out = apply_bitmask(logits, rows, bitmask_of(allowed, vocab))
    for r in range(num_rows):
        if r not in rows:
            assert torch.equal(out[r], logits[r])  # the same numbers: an unconstrained row pays nothing
            continue
        keep = allowed[rows.index(r)]
        for t in range(vocab):
            assert out[r, t].item() == (logits[r, t].item() if t in keep else float("-inf"))
    assert not torch.equal(out, logits) or all(len(a) == vocab for a in allowed)


def test_the_sampler_draws_only_allowed_tokens() -> None:
    logits = torch.randn(3, 100)
    allowed = [{7}, {3, 50, 99}]
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, seed=5),
        SamplingParams(temperature=0),
    ]
    for _ in range(20):
        tokens = Sampler()(logits, params, [10, 10, 10], None, ([0, 1], bitmask_of(allowed, 100)))
        assert tokens[0] == 7 and tokens[1] in allowed[1] and tokens[2] == int(logits[2].argmax())
