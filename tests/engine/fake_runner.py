"""A stand-in model runner for pure engine-logic tests only (no model).

Its "model" reads every earlier token of a sequence back out of a paged
token store through the block table it is given (as attention reads K/V),
and predicts ``next_token(history)``, a fixed function of the whole history.
Wrong block tables, stale blocks or a lost preemption state therefore change
the tokens. Tests that check the real model's tokens use the real
``ModelRunner``; this fake is for scheduling, stops, aborts and bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

EOS = 0
VOCAB = 32


def next_token(history: Sequence[int]) -> int:
    """The fake model's greedy prediction after ``history``."""
    h = 17
    for token in history:  # a polynomial hash: every token and its place matter
        h = (h * 1_000_003 + token + 1) % 2_147_483_647
    return (h >> 5) % VOCAB


def reference(
    prompt: Sequence[int], max_tokens: int, max_model_len: int, *, ignore_eos: bool = False
) -> list[int]:
    """What greedy decoding of the fake model returns for ``prompt``."""
    tokens = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens and len(tokens) < max_model_len:
        token = next_token(tokens)
        tokens.append(token)
        out.append(token)
        if token == EOS and not ignore_eos:
            break
    return out


class FakeTokenizer:
    """Token ``i`` decodes to letter ``i`` of the alphabet; EOS is special."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids if not (skip_special_tokens and t == EOS))


class FakeRunner:
    """Satisfies the engine's ``ModelRunnerLike`` over a paged token store."""

    def __init__(self, num_blocks: int, block_size: int = 4) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_bytes_per_token = 8
        self.eos_token_ids = frozenset({EOS})
        self.tokenizer = FakeTokenizer()
        self.device = torch.device("cpu")
        self.model_name = "fake"
        self.slots: dict[int, int] = {}  # slot -> token id ("the KV cache")
        self.calls: list[list[Any]] = []
        self.before_execute: Any = None  # optional hook(seqs), on the caller's thread

    def _slot(self, table: Sequence[int], pos: int) -> int:
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, seqs: Sequence[Any]) -> torch.Tensor:
        if self.before_execute is not None:
            self.before_execute(seqs)
        self.calls.append(list(seqs))
        rows = []
        for s in seqs:
            assert len(s.block_table) * self.block_size >= s.start_pos + len(s.token_ids)
            for i, token in enumerate(s.token_ids):
                self.slots[self._slot(s.block_table, s.start_pos + i)] = token
            if s.sample:
                end = s.start_pos + len(s.token_ids)
                history = [self.slots[self._slot(s.block_table, p)] for p in range(end)]
                row = torch.zeros(VOCAB)
                row[next_token(history)] = 20.0
                rows.append(row)
        return torch.stack(rows) if rows else torch.empty(0, VOCAB)
