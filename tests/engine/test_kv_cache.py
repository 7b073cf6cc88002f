"""The KV block pool: allocation covers tokens, running out is a value, no leaks."""

from __future__ import annotations

import pytest

from bargein.engine.kv_cache import BlockPool, cdiv


def test_append_slots_covers_tokens_block_by_block() -> None:
    pool = BlockPool(num_blocks=4, block_size=16)
    table: list[int] = []
    assert pool.append_slots(table, 1)
    assert len(table) == 1 and pool.num_free_blocks == 3
    assert pool.append_slots(table, 16)  # still one block
    assert len(table) == 1
    assert pool.append_slots(table, 17)
    assert len(table) == 2 and pool.num_free_blocks == 2
    assert len(set(table)) == 2


def test_running_out_allocates_nothing() -> None:
    pool = BlockPool(num_blocks=3, block_size=4)
    table: list[int] = []
    assert pool.append_slots(table, 8)
    other: list[int] = []
    assert not pool.can_append(other, 8)
    assert not pool.append_slots(other, 8)
    assert other == [] and pool.num_free_blocks == 1
    assert pool.append_slots(other, 4)


def test_free_returns_blocks_and_empties_the_table() -> None:
    pool = BlockPool(num_blocks=8, block_size=2)
    tables = [[] for _ in range(3)]
    for n, table in zip((3, 5, 4), tables, strict=True):
        assert pool.append_slots(table, n)
    assert pool.num_free_blocks == 8 - 2 - 3 - 2
    taken = [b for t in tables for b in t]
    assert len(set(taken)) == len(taken)  # no block handed out twice
    for table in tables:
        pool.free(table)
        assert table == []
    assert pool.num_free_blocks == 8


def test_double_free_is_misuse() -> None:
    pool = BlockPool(num_blocks=2, block_size=2)
    table: list[int] = []
    pool.append_slots(table, 2)
    copy = list(table)
    pool.free(table)
    with pytest.raises(AssertionError):
        pool.free(copy)


@pytest.mark.parametrize(("a", "b", "expected"), [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2)])
def test_cdiv(a: int, b: int, expected: int) -> None:
    assert cdiv(a, b) == expected
