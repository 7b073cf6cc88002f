"""The paged KV cache's block pool: which blocks are free, which are taken.

Pure bookkeeping, no tensors: the model runner owns the K/V tensors
(``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer) and this
pool hands out indices into their first dimension. A sequence's block table
is a plain ``list[int]``; token ``i`` of a sequence lives in block
``table[i // block_size]`` at offset ``i % block_size``.

Layout after nano-vllm's ``BlockManager`` and vLLM's ``BlockPool``, without
prefix sharing (yet).
"""

from __future__ import annotations

from collections import deque


def cdiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for non-negative ints."""
    return -(-a // b)


class BlockPool:
    """A fixed pool of ``num_blocks`` KV blocks of ``block_size`` tokens each.

    Running out is a return value (``False``), never an exception; misuse
    (freeing a block twice, a negative count) is an ``AssertionError``.
    """

    __slots__ = ("block_size", "num_total_blocks", "_free", "_taken")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        assert num_blocks >= 1 and block_size >= 1, (num_blocks, block_size)
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        # FIFO reuse: the least recently freed block goes out first.
        self._free: deque[int] = deque(range(num_blocks))
        self._taken: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any sequence."""
        return len(self._free)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks a table needs to hold ``num_tokens`` tokens."""
        assert num_tokens >= 0, num_tokens
        return cdiv(num_tokens, self.block_size)

    def can_append(self, block_table: list[int], num_tokens: int) -> bool:
        """Whether ``block_table`` can grow to cover ``num_tokens`` tokens now."""
        missing = self.num_blocks_for(num_tokens) - len(block_table)
        return missing <= len(self._free)

    def append_slots(self, block_table: list[int], num_tokens: int) -> bool:
        """Grow ``block_table`` in place so it covers ``num_tokens`` tokens.

        Returns:
            ``True`` when the table now covers ``num_tokens`` (possibly without
            allocating); ``False`` when the pool lacks blocks, in which case
            nothing was allocated and the table is unchanged.
        """
        missing = self.num_blocks_for(num_tokens) - len(block_table)
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        for _ in range(missing):
            block_id = self._free.popleft()
            self._taken.add(block_id)
            block_table.append(block_id)
        return True

    def free(self, block_table: list[int]) -> None:
        """Return every block of ``block_table`` to the pool and empty the table."""
        for block_id in block_table:
            assert block_id in self._taken, f"block {block_id} freed twice"
            self._taken.remove(block_id)
            self._free.append(block_id)
        block_table.clear()
