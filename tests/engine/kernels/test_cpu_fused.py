"""The numba CPU small ops against their torch references, on random shapes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.engine.kernels import cpu_attention, cpu_fused
from bargein.engine.kernels.kv_cache_write import write_kv_cache_ref
from bargein.engine.kernels.paged_attention import paged_attention_decode_ref
from bargein.engine.kernels.rms_norm import rms_norm_ref
from bargein.engine.kernels.rotary import build_cos_sin_cache, rotary_embedding_ref

TOL = {"atol": 2e-5, "rtol": 2e-5}  # float32, sums in another order


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 40),
    hidden=st.sampled_from([1, 7, 64, 576, 1000]),
    residual=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_matches_the_reference(tokens: int, hidden: int, residual: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen) * 3
    res = torch.randn(tokens, hidden, generator=gen) if residual else None
    weight = torch.randn(hidden, generator=gen)
    before = [t.clone() for t in (x, weight) + ((res,) if res is not None else ())]
    out, res_out = cpu_fused.rms_norm(x, weight, 1e-5, res)
    want, want_res = rms_norm_ref(x, weight, 1e-5, res)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(res_out, want_res, **TOL)
    after = [x, weight] + ([res] if res is not None else [])
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "an input was mutated"


def test_rms_norm_of_a_strided_input_and_other_dtypes_take_the_reference() -> None:
    x = torch.randn(5, 16)[:, ::2]  # not contiguous
    weight = torch.randn(8)
    torch.testing.assert_close(
        cpu_fused.rms_norm(x, weight, 1e-6)[0], rms_norm_ref(x, weight, 1e-6)[0], **TOL
    )
    xb, wb = x.bfloat16(), weight.bfloat16()
    assert torch.equal(cpu_fused.rms_norm(xb, wb, 1e-6)[0], rms_norm_ref(xb, wb, 1e-6)[0])


def _unfused(qkv, positions, cos_sin, k_cache, v_cache, slots, table, lens, hq, scale):
    """The three reference ops the fused kernel replaces."""
    hk, d = k_cache.shape[2], k_cache.shape[3]
    q, k, v = qkv.split([hq * d, hk * d, hk * d], -1)
    q, k = rotary_embedding_ref(q.reshape(-1, hq, d), k.reshape(-1, hk, d), positions, cos_sin)
    write_kv_cache_ref(k, v.reshape(-1, hk, d), k_cache, v_cache, slots)
    return paged_attention_decode_ref(q, k_cache, v_cache, table, lens, scale)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 200), min_size=1, max_size=9),
    group=st.sampled_from([1, 3, 4]),
    hk=st.integers(1, 3),
    d=st.sampled_from([2, 8, 64]),
    block_size=st.sampled_from([1, 5, 16]),
    seed=st.integers(0, 2**16),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_decode_attention_equals_rotary_then_kv_write_then_attention(
    lens: list[int], group: int, hk: int, d: int, block_size: int, seed: int, cache_dtype: torch.dtype
) -> None:
    """Each sequence's last position is this step's token: its K/V land in
    its slot, and the output is what the three reference ops give. A
    cache holds K and V bit for bit as torch's rotary and write leave them
    (rounded to nearest even in bfloat16): a token's K row is the same
    whether a decode step or a prefill wrote it."""
    gen = torch.Generator().manual_seed(seed)
    hq = group * hk
    widths = [-(-n // block_size) for n in lens]
    num_blocks = sum(widths) + 2
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(lens), max(widths), dtype=torch.int32)
    for i, w in enumerate(widths):
        table[i, :w] = torch.tensor(ids[:w])
        ids = ids[w:]
    positions = torch.tensor([n - 1 for n in lens], dtype=torch.int64)
    slots = torch.stack(
        [table[i, p // block_size].long() * block_size + p % block_size for i, p in enumerate(positions)]
    )
    k_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(cache_dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(cache_dtype)
    qkv = torch.randn(len(lens), (hq + 2 * hk) * d, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    cos_sin = build_cos_sin_cache(256, d, inv_freq)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    want = _unfused(qkv, positions, cos_sin, k_want, v_want, slots, table, seq_lens, hq, d**-0.5)
    out = cpu_fused.decode_attention(
        qkv, positions, cos_sin, k_cache, v_cache, slots, table, seq_lens, hq, d**-0.5
    )
    assert out.dtype == torch.float32
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
    torch.testing.assert_close(out, want, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_decode_attention_off_float32_is_the_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    hq, hk, d, bs = 4, 2, 8, 4
    k_cache = torch.randn(3, bs, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(3, bs, hk, d, generator=gen).to(dtype)
    qkv = torch.randn(2, (hq + 2 * hk) * d, generator=gen).to(dtype)
    table = torch.tensor([[2, 0], [1, 0]], dtype=torch.int32)
    positions, slots = torch.tensor([5, 2]), torch.tensor([0 * bs + 1, 1 * bs + 2])
    lens = torch.tensor([6, 3], dtype=torch.int32)
    cos_sin = build_cos_sin_cache(16, d, 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d)))
    k_want, v_want = k_cache.clone(), v_cache.clone()
    want = _unfused(qkv, positions, cos_sin, k_want, v_want, slots, table, lens, hq, 0.3)
    out = cpu_fused.decode_attention(qkv, positions, cos_sin, k_cache, v_cache, slots, table, lens, hq, 0.3)
    assert out.dtype == dtype
    assert torch.equal(out, want) and torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


def test_decode_attention_over_many_tiles_is_the_reference() -> None:
    """Split-K by tiles of a fixed size: each softmaxed alone, then merged in
    order, equals the reference; tiles past a short context's end are empty."""
    gen = torch.Generator().manual_seed(7)
    hq, hk, d, bs = 6, 2, 16, 4
    tile = cpu_attention.TILE_TOKENS
    lens = [1, 5, tile - 1, tile, tile + 1, 2 * tile + 44, 5 * tile + 3]
    widths = [-(-n // bs) for n in lens]
    table = torch.zeros(len(lens), max(widths), dtype=torch.int32)
    ids = torch.randperm(sum(widths), generator=gen).tolist()
    for i, w in enumerate(widths):
        table[i, :w] = torch.tensor(ids[:w])
        ids = ids[w:]
    positions = torch.tensor([n - 1 for n in lens])
    slots = torch.stack([table[i, p // bs].long() * bs + p % bs for i, p in enumerate(positions)])
    k_cache = torch.randn(sum(widths), bs, hk, d, generator=gen)
    v_cache = torch.randn(sum(widths), bs, hk, d, generator=gen)
    qkv = torch.randn(len(lens), (hq + 2 * hk) * d, generator=gen)
    cos_sin = build_cos_sin_cache(
        max(lens), d, 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    )
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    want = _unfused(qkv, positions, cos_sin, k_want, v_want, slots, table, seq_lens, hq, 0.25)
    out = cpu_fused.decode_attention(
        qkv, positions, cos_sin, k_cache, v_cache, slots, table, seq_lens, hq, 0.25
    )
    torch.testing.assert_close(out, want, **TOL)


def test_contexts_are_cut_in_tiles_of_a_fixed_size() -> None:
    """The tile count depends on the length alone, never on the batch or the cores."""
    tile = cpu_attention.TILE_TOKENS
    assert [cpu_attention.num_tiles(n) for n in (1, tile, tile + 1, 2000)] == [1, 1, 2, -(-2000 // tile)]


def test_a_single_task_runs_in_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence with one tile takes the serial kernel (no thread wake-ups);
    two sequences, or one context in two tiles, the parallel one; both give the reference."""
    ran: list[str] = []
    for name in ("_decode_attention_kernel", "_decode_attention_serial"):
        real = getattr(cpu_fused, name)
        monkeypatch.setattr(cpu_fused, name, lambda *a, real=real, name=name: (ran.append(name), real(*a)))
    gen = torch.Generator().manual_seed(3)
    hq, hk, d, bs = 4, 2, 8, 4
    cos_sin = build_cos_sin_cache(16, d, 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float) / d)))
    for num_seqs, tiles in ((1, 1), (2, 1), (1, 2)):
        monkeypatch.setattr(cpu_fused, "num_tiles", lambda *_, t=tiles: t)
        k_cache, v_cache = torch.randn(4, bs, hk, d, generator=gen), torch.randn(4, bs, hk, d, generator=gen)
        qkv = torch.randn(num_seqs, (hq + 2 * hk) * d, generator=gen)
        table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)[:num_seqs]
        positions, slots = torch.tensor([5, 6])[:num_seqs], torch.tensor([0 * bs + 1, 3 * bs + 2])[:num_seqs]
        lens = torch.tensor([6, 7], dtype=torch.int32)[:num_seqs]
        k_want, v_want = k_cache.clone(), v_cache.clone()
        want = _unfused(qkv, positions, cos_sin, k_want, v_want, slots, table, lens, hq, 0.3)
        out = cpu_fused.decode_attention(
            qkv, positions, cos_sin, k_cache, v_cache, slots, table, lens, hq, 0.3
        )
        torch.testing.assert_close(out, want, **TOL)
    assert ran == ["_decode_attention_serial", "_decode_attention_kernel", "_decode_attention_kernel"]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), spread=st.sampled_from([0.1, 5.0, 60.0, 200.0]), seed=st.integers(0, 2**16))
def test_the_softmax_exp_is_exp_to_float32_rounding(n: int, spread: float, seed: int) -> None:
    """The kernel's vectorizable exp against float64 ``exp`` of the same
    float32 difference: the polynomial's 1.6e-7 plus the rounding of
    ``y = (x - top) log2 e`` (relative ``|x - top| 2^-24``), and no denormal
    or negative value far below the top score."""
    import numpy as np

    row = (np.random.default_rng(seed).standard_normal(n) * spread).astype(np.float32)
    top = np.float32(row.max())
    diff = (row - top).astype(np.float64)
    want = np.exp(diff)
    got = np.array([cpu_attention._exp(x - top) for x in row], dtype=np.float32)
    total = got.astype(np.float64).sum()
    normal = diff > -87
    bound = 2e-7 + 1e-7 * np.abs(diff[normal])
    assert (np.abs(got[normal] / want[normal] - 1) <= bound).all()
    assert ((got[~normal] >= 1e-38) & (got[~normal] <= 2e-38)).all(), "clamped at exp(-87), not denormal"
    assert total == pytest.approx(want.sum(), rel=1e-6)
    assert got.max() == pytest.approx(1.0, rel=3e-7)
