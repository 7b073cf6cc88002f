"""The paged KV cache's block pool: reference counts and a prefix cache.

Pure bookkeeping, no tensors: the model runner owns the K/V tensors
(``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer) and this
pool hands out indices into their first dimension. A sequence's block table
is a plain ``list[int]``; token ``i`` of a sequence lives in block
``table[i // block_size]`` at offset ``i % block_size``.

Automatic prefix caching, after vLLM v1's ``BlockPool``/``KVCacheManager``:
a *full* block whose K/V are computed is registered under a hash chained over
its token ids and the previous block's hash (:func:`hash_block`), rooted in
the model identity and the request's ``cache_salt`` (:meth:`BlockPool.root_hash`).
A new sequence looks up the longest chain of its full blocks that is
registered, takes references on those blocks and computes only the rest.

Every block is in exactly one state:

- *held*: reference count >= 1 (in the tables of that many sequences);
  registered or not;
- *free*: count 0, not registered; handed out first;
- *cached-free*: count 0 and registered; still a hit for a later sequence,
  evicted least recently freed first (and unregistered) when the pool has
  no free block left.

Free and cached-free blocks both count as available (``num_free_blocks``).

Hashes are SHA-256 digests (32 bytes) over a fixed little-endian encoding,
not Python's ``hash()``: a prompt an attacker chooses must not be able to
collide with another tenant's block (``hash()`` of ints is the value modulo
``2**61 - 1``, trivially collided; vLLM's CVE-2025-25183 was this bug), and a
digest is a fixed-size dict key, where a nested tuple key would compare the
whole chain on every lookup.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence

BlockHash = bytes  # 32-byte SHA-256 digest

_ROOT_TAG = b"bargein/kv-prefix/v1\x00"


def cdiv(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for non-negative ints."""
    return -(-a // b)


def _encode_str(value: str | None) -> bytes:
    """Length-prefixed UTF-8, with ``None`` distinct from every string (``""`` too)."""
    if value is None:
        return b"\x00"
    data = value.encode("utf-8")
    return b"\x01" + struct.pack("<Q", len(data)) + data


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The hash of one full block: SHA-256 of its parent's hash and its token ids.

    Args:
        parent: the previous block's hash, or the chain's root
            (:meth:`BlockPool.root_hash`) for block 0.
        token_ids: the block's ``block_size`` token ids (non-negative, < 2**63).

    Returns:
        a 32-byte digest; equal digests mean equal token prefixes under the
        same root (barring a SHA-256 collision).
    """
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}q", *token_ids)).digest()


def extend_block_hashes(
    hashes: list[BlockHash], root: BlockHash, token_ids: Sequence[int], block_size: int, num_blocks: int
) -> None:
    """Append to ``hashes`` (in place) until it holds the first ``num_blocks`` block hashes.

    ``hashes`` must be the hashes of the first ``len(hashes)`` blocks of
    ``token_ids`` under ``root``; each block is hashed once, so a sequence
    pays ``O(new tokens)`` as it grows.
    """
    assert num_blocks * block_size <= len(token_ids), (num_blocks, block_size, len(token_ids))
    for i in range(len(hashes), num_blocks):
        parent = hashes[i - 1] if i else root
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size]))


class BlockPool:
    """A fixed pool of ``num_blocks`` KV blocks of ``block_size`` tokens each.

    Args:
        num_blocks: blocks in the pool (>= 1).
        block_size: tokens per block (>= 1).
        model_id: what identifies the K/V a token produces besides the tokens
            (model name, weights, dtype); part of every hash chain's root.

    A pool nobody calls :meth:`register` on behaves as a plain allocator
    (FIFO reuse, no hashing). Running out is a return value (``False``),
    never an exception; misuse (freeing a block twice, a negative count) is
    an ``AssertionError``.
    """

    __slots__ = (
        "block_size",
        "num_total_blocks",
        "model_id",
        "_refs",
        "_hash_of",
        "_cached",
        "_free",
        "_cached_free",
        "num_evictions",
    )

    def __init__(self, num_blocks: int, block_size: int, *, model_id: str = "") -> None:
        assert num_blocks >= 1 and block_size >= 1, (num_blocks, block_size)
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        self.model_id = model_id
        self._refs = [0] * num_blocks  # sequences holding each block
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}  # registered hash -> block id
        # FIFO reuse: the least recently freed block goes out first.
        self._free: deque[int] = deque(range(num_blocks))
        # count 0 and registered, oldest first (eviction order); values unused
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0  # cached-free blocks reused for other tokens

    # ---- counts ---------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks held by no sequence: free plus cached-free (both allocatable)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Blocks held by no sequence that are still registered (prefix hits)."""
        return len(self._cached_free)

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks, held or not."""
        return len(self._cached)

    def ref_count(self, block_id: int) -> int:
        """Sequences holding ``block_id``."""
        return self._refs[block_id]

    def is_registered(self, block_id: int) -> bool:
        """Whether ``block_id`` is in the hash map."""
        return self._hash_of[block_id] is not None

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks a table needs to hold ``num_tokens`` tokens."""
        assert num_tokens >= 0, num_tokens
        return cdiv(num_tokens, self.block_size)

    # ---- the prefix cache ---------------------------------------------------------

    def root_hash(self, cache_salt: str | None) -> BlockHash:
        """The root of a request's hash chain: the model identity and its salt.

        Requests with different salts (or a salt and ``None``) never share a
        block, whatever their tokens.
        """
        return hashlib.sha256(_ROOT_TAG + _encode_str(self.model_id) + _encode_str(cache_salt)).digest()

    def lookup(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """The blocks of the longest registered prefix of ``block_hashes``.

        Takes no reference (see :meth:`touch`); a miss at block ``i`` ends the
        prefix even if later hashes are registered (they cannot be: a hash
        names its whole prefix).
        """
        hits: list[int] = []
        for block_hash in block_hashes:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_free_after_touch(self, block_ids: Sequence[int]) -> int:
        """``num_free_blocks`` once ``block_ids`` (lookup hits) are touched.

        Hits that are cached-free leave the free count when a sequence takes
        them, so they cost admission a free block like a new one does.
        """
        return self.num_free_blocks - sum(1 for b in block_ids if self._refs[b] == 0)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take one reference on each (registered) block; cached-free ones become held."""
        for block_id in block_ids:
            assert self._hash_of[block_id] is not None, f"block {block_id} is not registered"
            if self._refs[block_id] == 0:
                del self._cached_free[block_id]
            self._refs[block_id] += 1

    def register(self, block_id: int, block_hash: BlockHash) -> bool:
        """Register a held, full, computed block under ``block_hash``.

        Returns:
            ``True`` when the block is now registered under ``block_hash``;
            ``False`` when another block already holds that hash (two
            sequences computed the same prefix at once): this one stays
            unregistered and is freed as a plain block.
        """
        assert self._refs[block_id] > 0, f"block {block_id} registered while free"
        current = self._hash_of[block_id]
        if current is not None:
            assert current == block_hash, f"block {block_id} registered under two hashes"
            return True
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    # ---- allocation --------------------------------------------------------------

    def can_append(self, block_table: list[int], num_tokens: int) -> bool:
        """Whether ``block_table`` can grow to cover ``num_tokens`` tokens now."""
        missing = self.num_blocks_for(num_tokens) - len(block_table)
        return missing <= self.num_free_blocks

    def append_slots(self, block_table: list[int], num_tokens: int) -> bool:
        """Grow ``block_table`` in place so it covers ``num_tokens`` tokens.

        New blocks come from the free blocks first, then from the cached-free
        ones, least recently freed first (evicted: unregistered).

        Returns:
            ``True`` when the table now covers ``num_tokens`` (possibly without
            allocating); ``False`` when the pool lacks blocks, in which case
            nothing was allocated and the table is unchanged.
        """
        missing = self.num_blocks_for(num_tokens) - len(block_table)
        if missing <= 0:
            return True
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            block_id = self._pop_free()
            self._refs[block_id] = 1
            block_table.append(block_id)
        return True

    def _pop_free(self) -> int:
        if self._free:
            return self._free.popleft()
        block_id, _ = self._cached_free.popitem(last=False)
        self._unregister(block_id)
        self.num_evictions += 1
        return block_id

    def _unregister(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        assert block_hash is not None and self._cached[block_hash] == block_id, block_id
        del self._cached[block_hash]
        self._hash_of[block_id] = None

    # ---- release -----------------------------------------------------------------

    def free(self, block_table: list[int], keep_tokens: int | None = None) -> None:
        """Drop one reference on every block of ``block_table`` and empty the table.

        A block no sequence holds any more stays registered (cached-free) or
        becomes free. The table's blocks are released last first, so the
        tail of a prefix is evicted before its head (a tail without its head
        can never hit).

        Args:
            block_table: the sequence's blocks, in token order.
            keep_tokens: ``None`` keeps every registered block cached. Else
                only blocks that lie wholly within the first ``keep_tokens``
                tokens stay cached; a later block that no other sequence
                holds is unregistered and free at once (its tokens will not
                come back: barge-in keeps the prefix the user heard).
                Blocks other sequences hold stay registered: they are theirs too.

        Raises:
            AssertionError: a block of the table is not held (a double free),
                or ``keep_tokens < 0``.
        """
        assert keep_tokens is None or keep_tokens >= 0, keep_tokens
        num_kept = len(block_table) if keep_tokens is None else keep_tokens // self.block_size
        plain: list[int] = []
        for index in range(len(block_table) - 1, -1, -1):
            block_id = block_table[index]
            assert self._refs[block_id] > 0, f"block {block_id} freed twice"
            self._refs[block_id] -= 1
            if self._refs[block_id] > 0:
                continue
            if self._hash_of[block_id] is not None and index >= num_kept:
                self._unregister(block_id)
            if self._hash_of[block_id] is None:
                plain.append(block_id)
            else:
                self._cached_free[block_id] = None  # most recently freed: evicted last
        self._free.extend(reversed(plain))  # table order, as a pool without caching did
        block_table.clear()

    def reset_prefix_cache(self) -> int:
        """Unregister every cached-free block (e.g. after new weights); returns how many.

        Held blocks stay registered: their sequences are still using them.
        """
        dropped = list(self._cached_free)
        self._cached_free.clear()
        for block_id in dropped:
            self._unregister(block_id)
            self._free.append(block_id)
        return len(dropped)

    def assert_consistent(self, held: Sequence[Sequence[int]] | None = None) -> None:
        """Check the pool's invariants (tests); ``held``: every live block table.

        Raises:
            AssertionError: a block in two states, a map out of step with the
                blocks' hashes, or (given ``held``) reference counts that differ
                from how many tables hold each block.
        """
        free, cached_free = set(self._free), set(self._cached_free)
        assert len(free) == len(self._free) and not free & cached_free
        for block_id in range(self.num_total_blocks):
            refs, block_hash = self._refs[block_id], self._hash_of[block_id]
            assert refs >= 0
            assert (block_id in free) == (refs == 0 and block_hash is None), block_id
            assert (block_id in cached_free) == (refs == 0 and block_hash is not None), block_id
            if block_hash is not None:
                assert self._cached[block_hash] == block_id
        assert len(self._cached) == sum(h is not None for h in self._hash_of)
        if held is not None:
            counts = [0] * self.num_total_blocks
            for table in held:
                for block_id in table:
                    counts[block_id] += 1
            assert counts == self._refs, "reference counts differ from the block tables"
