"""Prefill-only requests: KV computed ahead into the prefix cache, at the lowest priority.

A voice client's turn is known word by word before it ends: at a pause the
conversation plus the partial user text, under the chat template, is the
start of the prompt the turn's real request will have. A prefill-only
request (``EngineRequest.prefill_only``) computes the K/V of that prompt's
full blocks and registers them in the prefix cache, samples nothing and
sends no token; when the real request comes, its admission finds the
matching blocks (the prefix cache's own lookup: the blocks up to where the
final text departs from the partial one hit, the rest are simply never
looked up and age out as cached-free blocks).

Its priority is below every real request, in every resource a step spends
(:class:`~bargein.engine.scheduler.Scheduler` calls this):

- the step's token budget: it gets what the real decodes, prefill chunks
  and admissions left, and nothing in a step that preempted or while a real
  request waits (a real request blocked by slots, blocks or the ITL budget
  is not overtaken);
- running slots: it never counts against ``max_num_seqs`` for real
  requests (it runs beside them only while the sum is under the cap);
- KV blocks: a real sequence short of blocks drops a prefill-only one
  (newest first) before it preempts any real one; a prefill-only request
  that cannot get blocks is dropped, never queued for them;
- it is never preempted and requeued: dropped, it ends ``cancelled``. The
  blocks it already filled stay registered (their K/V are what any request
  with those tokens computes: "Exact by default", docs/design.md), so a
  dropped prefill's finished blocks may still be hit.

Every prefill-only request ends with one finished output without tokens:
``stop`` once its full blocks are cached, ``cancelled`` when dropped or
aborted.

Counters: the tokens prefill-only requests computed, and of those the
tokens a later real request's admission took from the prefix cache (each
block counted once, at its first hit), so ``hits / prefilled`` is the share
of speculative prefill that was used.
"""

from __future__ import annotations

from collections import deque

from bargein.engine.kv_cache import BlockHash
from bargein.engine.sequence import Sequence


class SpeculativePrefills:
    """The prefill-only sequences of one scheduler and their counters
    (bookkeeping only: the scheduler plans their steps).

    Args:
        block_size: tokens per KV block.
        max_tracked_blocks: most speculatively filled block hashes remembered
            for the hit counter (a block evicted from the cache is forgotten
            when the table is pruned at this size).

    Attributes:
        waiting: prefill-only sequences not admitted yet, oldest first.
        running: admitted ones, holding blocks, oldest first.
        ended: sequences that finished or were dropped since the engine last
            took them (:meth:`take_ended`).
        num_prefilled_tokens: counter, tokens computed by prefill-only sequences.
        num_hit_tokens: counter, of those the tokens a real request's
            admission later reused from the prefix cache.
    """

    def __init__(self, block_size: int, max_tracked_blocks: int) -> None:
        self.block_size = block_size
        self._max_tracked = max(1, max_tracked_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.ended: list[Sequence] = []
        self._filled: dict[BlockHash, None] = {}  # registered by a prefill, not hit yet (insertion order)
        self.num_prefilled_tokens = 0
        self.num_hit_tokens = 0

    def target(self, seq: Sequence) -> int:
        """Tokens of ``seq`` to compute: its full blocks (a partial last block
        is never cached, so computing it would be wasted)."""
        return seq.num_tokens // self.block_size * self.block_size

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def filled(self, block_hash: BlockHash) -> None:
        """A prefill-only sequence registered a block it computed."""
        if len(self._filled) >= self._max_tracked:
            # the oldest first: a block filled long ago is the likeliest to be gone
            del self._filled[next(iter(self._filled))]
        self._filled[block_hash] = None

    def computed(self, num_tokens: int) -> None:
        """A prefill-only sequence computed ``num_tokens`` tokens this step."""
        self.num_prefilled_tokens += num_tokens

    def count_hits(self, block_hashes: list[BlockHash]) -> None:
        """A real request's admission reused these blocks: count the ones a
        prefill filled (each once)."""
        for block_hash in block_hashes:
            if block_hash in self._filled:
                del self._filled[block_hash]
                self.num_hit_tokens += self.block_size

    def take_ended(self) -> list[Sequence]:
        """The sequences that ended since the last call (their outputs are due)."""
        ended, self.ended = self.ended, []
        return ended
