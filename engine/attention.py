"""Attention metadata of one forward step over a flat batch of tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to.

    The flat batch holds the decode tokens first (one per decode sequence),
    then the prefill chunks; prefill tensors index that second part only.

    Attributes:
        slot_mapping: ``[T]`` int64 cache slot of every token
            (``block_id * block_size + offset``).
        num_decode_tokens: ``B``, the leading rows that are decode tokens.
        decode_block_tables: ``[B, max_blocks]`` int32 (0-padded).
        decode_seq_lens: ``[B]`` int32 tokens in the cache after this step.
        prefill_block_tables: ``[S, max_blocks]`` int32 (0-padded).
        prefill_query_start_loc: ``[S + 1]`` int32 cumulative chunk lengths,
            from 0 at the first prefill token.
        prefill_seq_lens: ``[S]`` int32 tokens in the cache after this step.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_query_start_loc: torch.Tensor
    prefill_seq_lens: torch.Tensor

    @property
    def num_prefill_seqs(self) -> int:
        """``S``, the prefill sequences of this step."""
        return self.prefill_seq_lens.shape[0]
