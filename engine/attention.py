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
        decode_block_ids: ``[B, max_blocks]`` int64 copy of
            ``decode_block_tables``, or None; built once per step for the
            torch (CPU) path so its 30 layers skip the conversion.
        decode_max_seq_len: ``max(decode_seq_lens)`` with ``decode_block_ids``.
        decode_attn_mask: ``[B, 1, 1, max(decode_seq_lens)]`` additive float
            mask (0 or -inf past each length), or None when every decode
            sequence has the same length (nothing to mask) or off the CPU path.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_query_start_loc: torch.Tensor
    prefill_seq_lens: torch.Tensor
    decode_block_ids: torch.Tensor | None = None
    decode_max_seq_len: int = 0
    decode_attn_mask: torch.Tensor | None = None

    @property
    def num_prefill_seqs(self) -> int:
        """``S``, the prefill sequences of this step."""
        return self.prefill_seq_lens.shape[0]
