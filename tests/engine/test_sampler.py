"""The sampler on fixed logits: greedy, seeds across batches and positions, top-k and top-p sets."""

from __future__ import annotations

import math
import random

import torch

from bargein.engine.request import SamplingParams
from bargein.engine.sampler import Sampler, mask_banned, noise_seed

CPU = torch.device("cpu")
VOCAB = 64


def fixed_logits(seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax() -> None:
    logits = fixed_logits(0, rows=3)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(top_k=1),
        SamplingParams(temperature=0, top_p=0.1),
    ]
    tokens = Sampler()(logits, params, [5] * 3)
    assert tokens == logits.argmax(dim=-1).tolist()


def test_banned_tokens_are_never_sampled_greedy_or_not() -> None:
    logits = fixed_logits(2, rows=3)
    top = logits.argmax(dim=-1).tolist()
    banned = [{top[0]}, set(), set(logits[2].topk(VOCAB - 1).indices.tolist()) | {VOCAB + 5}]
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0), SamplingParams(seed=3)]
    for position in range(20):
        tokens = Sampler()(logits, params, [position] * 3, banned)
        assert tokens[0] == int(logits[0].topk(2).indices[1])  # the runner-up
        assert tokens[1] == top[1]
        assert tokens[2] == int(logits[2].argmin())  # the one token left
    assert torch.equal(mask_banned(logits, [set()] * 3), logits)  # not copied, not mutated
    masked = mask_banned(logits, banned)
    assert torch.isinf(masked[0, top[0]]) and torch.isfinite(logits).all()


def test_greedy_and_random_rows_mix_in_one_batch() -> None:
    logits = fixed_logits(1, rows=4)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(seed=1),
        SamplingParams(temperature=0),
        SamplingParams(),
    ]
    tokens = Sampler()(logits, params, [3, 3, 3, 3])
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
    assert all(0 <= t < VOCAB for t in tokens)


def draw_seeded(batch_position: int, others: list[SamplingParams], steps: int = 30) -> list[int]:
    """Tokens of a seeded request sampled at positions 0..steps-1 inside a batch of others."""
    sampler = Sampler()
    mine = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    own_logits = fixed_logits(7)
    tokens = []
    for step in range(steps):
        params = list(others)
        params.insert(batch_position, mine)
        positions = [step + 99] * len(others)
        positions.insert(batch_position, step)
        rows = [fixed_logits(100 + step + i) for i in range(len(others))]
        rows.insert(batch_position, own_logits)
        tokens.append(sampler(torch.cat(rows), params, positions)[batch_position])
    return tokens


def test_same_seed_same_tokens_whatever_shares_the_batch() -> None:
    alone = draw_seeded(0, [])
    assert len(set(alone)) > 3  # really sampling, not argmax
    crowded = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.5),
        SamplingParams(top_k=3, seed=5),
        SamplingParams(top_p=0.5),
    ]
    assert draw_seeded(2, crowded) == alone
    assert draw_seeded(4, crowded) == alone
    assert draw_seeded(1, crowded[:1]) == alone


def test_a_seeded_draw_depends_on_seed_and_position_only() -> None:
    """Issue 37: the token at a position is the same whatever was drawn before
    (a preemption's recompute, a resume or a takeover starts drawing there
    afresh): positions drawn in any order, by any sampler, give the same tokens."""
    logits = fixed_logits(3)
    params = [SamplingParams(temperature=0.8, seed=42)]
    in_order = [Sampler()(logits, params, [p])[0] for p in range(40)]
    assert len(set(in_order)) > 3
    shared = Sampler()
    shuffled = list(range(40))
    random.Random(0).shuffle(shuffled)
    again = {p: shared(logits, params, [p])[0] for p in shuffled}
    assert [again[p] for p in range(40)] == in_order
    resumed = Sampler()
    assert [resumed(logits, params, [p])[0] for p in range(25, 40)] == in_order[25:]


def test_noise_seed_is_a_pure_64_bit_function_of_seed_and_position() -> None:
    seeds = {noise_seed(s, p) for s in (0, 1, -1, 2**70) for p in range(50)}
    assert len(seeds) == 200 and all(0 <= k < 2**64 for k in seeds)
    assert noise_seed(7, 3) == noise_seed(7, 3) != noise_seed(3, 7)


def test_different_seeds_differ() -> None:
    logits = fixed_logits(3)

    def run(seed: int) -> list[int]:
        params = [SamplingParams(seed=seed)]
        return [Sampler()(logits, params, [p])[0] for p in range(20)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_top_k_never_picks_outside_the_k_most_likely() -> None:
    logits = fixed_logits(11)
    allowed = set(logits[0].topk(5).indices.tolist())
    batch = logits.expand(2000, VOCAB).contiguous()
    params = [SamplingParams(temperature=1.0, top_k=5)] * 2000
    picked = Sampler()(batch, params, [0] * 2000)
    assert set(picked) <= allowed
    assert set(picked) == allowed  # all five are reachable


def test_top_p_never_picks_outside_the_nucleus() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.1, 0.2, 0.15]])
    logits = probs.log()
    batch = logits.expand(2000, 5).contiguous()
    params = [SamplingParams(temperature=1.0, top_p=0.8)] * 2000
    picked = Sampler()(batch, params, [0] * 2000)
    assert set(picked) == {1, 3, 4}  # 0.5 + 0.2 + 0.15 >= 0.8


def test_top_k_and_top_p_together_take_the_smaller_set() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.1, 0.2, 0.15]])
    batch = probs.log().expand(1000, 5).contiguous()
    params = [SamplingParams(top_p=0.8, top_k=2)] * 1000
    assert set(Sampler()(batch, params, [0] * 1000)) == {1, 3}


def test_temperature_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 6000
    batch = probs.log().expand(n, 3).contiguous()
    # one seed, n positions: the keyed draws are independent samples of the distribution
    params = [SamplingParams(temperature=1.0, seed=0)] * n
    picked = torch.tensor(Sampler()(batch, params, range(n)))
    freq = torch.bincount(picked, minlength=3).float() / n
    # 5 standard errors of a binomial proportion.
    assert all(
        abs(f - p) < 5 * math.sqrt(p * (1 - p) / n)
        for f, p in zip(freq.tolist(), probs.tolist(), strict=True)
    )
