"""One request's mutable state inside the engine: tokens, progress, KV blocks.

As in vLLM v1 there is no separate prefill and decode mode: a sequence has
``num_tokens`` tokens (prompt plus output) of which ``num_computed_tokens``
are in the KV cache; each step computes some of the rest. A prefill chunk is
``num_tokens - num_computed_tokens > 1``; a decode step computes the one
token sampled last step. Preemption resets ``num_computed_tokens`` to 0 and
the sequence recomputes prompt and output so far.
"""

from __future__ import annotations

import enum
from typing import Any

from bargein.engine.request import EngineRequest, FinishReason, SamplingParams


class SequenceStatus(enum.Enum):
    """Where a sequence is in the scheduler."""

    WAITING = "waiting"  # queued, or preempted and queued again; holds no blocks
    RUNNING = "running"  # admitted; holds blocks for its computed tokens
    FINISHED = "finished"  # done; holds no blocks


class Sequence:
    """The engine's record of one request (not thread-safe; engine thread only).

    Attributes:
        request: the request as submitted.
        seq_no: admission counter, unique per scheduler; larger is newer.
        token_ids: prompt followed by the output tokens so far.
        num_computed_tokens: tokens whose K/V are in the cache.
        block_table: KV block ids covering at least the computed tokens.
        status: see :class:`SequenceStatus`.
        finish_reason: set once finished.
        num_preemptions: times this sequence was preempted.
        first_scheduled_time: ``time.monotonic()`` when first scheduled (queue time ends).
        last_token_time: ``time.monotonic()`` when its last token was sampled.
        hash_root: root of its block-hash chain (model and ``cache_salt``);
            ``None`` while the scheduler does not cache prefixes.
        block_hashes: hashes of its first full blocks (grown lazily; tokens
            never change, so they survive preemption).
        num_registered_blocks: leading blocks of ``block_table`` already
            offered to the prefix cache (hits included).
        num_cached_tokens: prompt tokens found in the prefix cache at its first
            admission; ``None`` until then.
        grammar: its llguidance matcher when the request has a grammar, at
            the state after every output token so far (a preemption keeps
            the tokens, so the matcher stays valid; engine/grammar.py).
    """

    __slots__ = (
        "request",
        "seq_no",
        "token_ids",
        "num_prompt_tokens",
        "num_computed_tokens",
        "block_table",
        "status",
        "finish_reason",
        "num_preemptions",
        "first_scheduled_time",
        "last_token_time",
        "hash_root",
        "block_hashes",
        "num_registered_blocks",
        "num_cached_tokens",
        "grammar",
    )

    def __init__(self, request: EngineRequest, seq_no: int) -> None:
        assert request.prompt_token_ids, "empty prompt"
        self.request = request
        self.seq_no = seq_no
        self.token_ids: list[int] = list(request.prompt_token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.last_token_time: float | None = None
        self.hash_root: bytes | None = None
        self.block_hashes: list[bytes] = []
        self.num_registered_blocks = 0
        self.num_cached_tokens: int | None = None
        self.grammar: Any = None

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.params

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (a copy)."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        """Whether the sequence has ended."""
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, "
            f"blocks={len(self.block_table)})"
        )
