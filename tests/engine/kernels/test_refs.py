"""The torch references against naive dense formulas, on odd shapes."""

from __future__ import annotations

import math

import pytest
import torch

from bargein.engine.kernels import get_ops

OPS = get_ops("torch")


def _paged(kv: list[torch.Tensor], block_size: int, num_blocks: int, seed: int):
    """Scatter per-sequence ``[L, Hk, D]`` tensors into a shuffled block pool."""
    gen = torch.Generator().manual_seed(seed)
    hk, d = kv[0].shape[1:]
    cache = torch.randn(num_blocks, block_size, hk, d, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for x in kv:
        blocks = [free.pop() for _ in range(-(-x.shape[0] // block_size))]
        for i, b in enumerate(blocks):
            part = x[i * block_size : (i + 1) * block_size]
            cache[b, : part.shape[0]] = part
        tables.append(blocks)
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return cache, table


def _dense_attention(q, k, v, offset: int, scale: float) -> torch.Tensor:
    """q [n, Hq, D] at positions offset.., k/v [L, Hk, D]: naive causal GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    pos_q = torch.arange(q.shape[0])[:, None] + offset
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > pos_q, -math.inf)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("hq,hk", [(9, 3), (4, 4), (6, 1)])
@pytest.mark.parametrize("block_size", [1, 16, 5])
def test_decode_matches_dense(hq: int, hk: int, block_size: int) -> None:
    lens = [1, 17, 16, 33, 2]
    d = 8
    ks = [torch.randn(n, hk, d) for n in lens]
    vs = [torch.randn(n, hk, d) for n in lens]
    k_cache, table = _paged(ks, block_size, 128, 0)
    v_cache, _ = _paged(vs, block_size, 128, 0)
    q = torch.randn(len(lens), hq, d)
    before = (q.clone(), k_cache.clone(), table.clone())
    out = OPS.paged_attention_decode(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32), 0.3)
    for i, n in enumerate(lens):
        want = _dense_attention(q[i : i + 1], ks[i], vs[i], n - 1, 0.3)
        torch.testing.assert_close(out[i : i + 1], want, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k_cache, table)))


@pytest.mark.parametrize("block_size", [16, 3])
def test_prefill_matches_dense_with_cached_prefix(block_size: int) -> None:
    hq, hk, d = 9, 3, 8
    seq_lens, q_lens = [5, 40, 17, 1], [5, 7, 17, 1]
    ks = [torch.randn(n, hk, d) for n in seq_lens]
    vs = [torch.randn(n, hk, d) for n in seq_lens]
    k_cache, table = _paged(ks, block_size, 128, 1)
    v_cache, _ = _paged(vs, block_size, 128, 1)
    q = torch.randn(sum(q_lens), hq, d)
    loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    out = OPS.paged_attention_prefill(
        q, k_cache, v_cache, table, loc, torch.tensor(seq_lens, dtype=torch.int32), 0.5
    )
    for s, (n, ql) in enumerate(zip(seq_lens, q_lens)):
        want = _dense_attention(q[loc[s] : loc[s + 1]], ks[s], vs[s], n - ql, 0.5)
        torch.testing.assert_close(out[loc[s] : loc[s + 1]], want, atol=1e-5, rtol=1e-5)


def test_write_kv_cache_scatters_to_slots() -> None:
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    k_cache, v_cache = torch.zeros(4, 4, 2, 4), torch.zeros(4, 4, 2, 4)
    OPS.write_kv_cache(k, v, k_cache, v_cache, torch.tensor([5, 0, 15]))
    torch.testing.assert_close(k_cache[1, 1], k[0])
    torch.testing.assert_close(v_cache[0, 0], v[1])
    torch.testing.assert_close(k_cache[3, 3], k[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_residual(dtype: torch.dtype) -> None:
    x, r, w = torch.randn(3, 7), torch.randn(3, 7), torch.randn(7)
    out, res = OPS.rms_norm(x.to(dtype), w.to(dtype), 1e-6, r.to(dtype))
    s = x.to(dtype) + r.to(dtype)
    torch.testing.assert_close(res, s)
    s = s.float()
    want = s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.to(dtype).float()
    torch.testing.assert_close(out, want.to(dtype))
    out2, res2 = OPS.rms_norm(x, w, 1e-6)
    assert res2 is x or torch.equal(res2, x)


def test_silu_and_mul() -> None:
    x = torch.randn(5, 6)
    torch.testing.assert_close(OPS.silu_and_mul(x), torch.nn.functional.silu(x[:, :3]) * x[:, 3:])


def test_rotary_matches_hf_rotate_half() -> None:
    from bargein.engine.kernels.rotary import build_cos_sin_cache

    d = 8
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cache = build_cos_sin_cache(50, d, inv_freq)
    q, k, pos = torch.randn(4, 3, d), torch.randn(4, 1, d), torch.tensor([0, 7, 49, 3])
    q_out, k_out = OPS.rotary_embedding(q, k, pos, cache)
    emb = torch.cat((pos[:, None] * inv_freq, pos[:, None] * inv_freq), -1)[:, None]
    rot = lambda x: torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1)  # noqa: E731
    torch.testing.assert_close(q_out, q * emb.cos() + rot(q) * emb.sin())
    torch.testing.assert_close(k_out, k * emb.cos() + rot(k) * emb.sin())
