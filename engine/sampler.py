"""Turn one step's logits into one token per sampling sequence.

Greedy rows take the argmax of the raw logits (no softmax). The other rows
are scaled by temperature, filtered by top-k and top-p together over one
sort (as vLLM's ``apply_top_k_top_p``), and drawn with the exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``, equivalent to sampling from ``p``; the
trick vLLM and gpt-fast use). A seeded row's noise is a pure function of
(seed, position of the token being sampled): a generator seeded with a hash
of the two (:func:`noise_seed`) draws it, so the same seed gives the same
tokens whatever else shares the batch, and also after a preemption's
recompute, a resume or a takeover's re-prefill of the logged tokens (a
generator kept per request would count its draws instead, issue 37).
Unseeded rows draw from the global RNG.

Constrained rows (a request with a grammar) get ``-inf`` at every token
their grammar's bitmask forbids, after the banned tokens and before
anything else (engine/grammar.py), so greedy takes the best allowed token
and the others sample among the allowed ones, renormalized.

Banned tokens (``min_tokens``: EOS and the stop token ids of a request that
has not reached its minimum) get ``-inf`` logits before all of this, greedy
rows included, as vLLM's ``MinTokensLogitsProcessor`` does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import torch

from bargein.engine.grammar import apply_bitmask
from bargein.engine.request import SamplingParams


def noise_seed(seed: int, position: int) -> int:
    """The generator seed of a seeded row's draw: a 64-bit hash (BLAKE2b) of
    the request's ``seed`` (any int) and ``position``, the index in its
    sequence (prompt plus output) of the token being sampled. Distinct pairs
    give unrelated streams; the same pair, the same noise."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p set with ``-inf``.

    Args:
        logits: ``[B, V]`` float32 (temperature already applied); not mutated.
        top_k: ``[B]`` int64, ``k`` per row (``V`` disables); or ``None``.
        top_p: ``[B]`` float32 in (0, 1] (1 disables); or ``None``.

    Returns:
        ``[B, V]``: the top-p set is the smallest set of most likely tokens
        whose probability reaches ``p`` (the most likely token always stays);
        ties at the k-th logit are all kept.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        kth = sorted_logits.gather(1, (vocab - top_k).unsqueeze(1))  # [B, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - top_p).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def mask_banned(logits: torch.Tensor, banned: Sequence[Collection[int]]) -> torch.Tensor:
    """``logits`` with ``-inf`` at each row's banned token ids.

    Args:
        logits: ``[B, V]`` float32; not mutated.
        banned: ``B`` collections of token ids; ids outside ``[0, V)`` are
            skipped (a stop token id the vocabulary does not have can never be
            sampled anyway).

    Returns:
        ``[B, V]``: a masked copy, or ``logits`` itself when nothing is banned.
    """
    vocab = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    for row, ids in enumerate(banned):
        for token_id in ids:
            if 0 <= token_id < vocab:
                rows.append(row)
                cols.append(token_id)
    if not rows:
        return logits
    index = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
    return logits.index_put(index, torch.tensor(float("-inf"), device=logits.device))


def _rows_to_mask(
    logits: torch.Tensor, params: Sequence[SamplingParams], rows: Sequence[int], bitmask: torch.Tensor
) -> tuple[list[int], torch.Tensor]:
    """The constrained rows whose sampling the mask can change, and their bitmask rows.

    A greedy row whose raw argmax the grammar allows takes that token masked
    or not, so it is left out (the common case: one bit test instead of a
    row of ``V`` writes); the other rows keep their masks.
    """
    greedy = [i for i, row in enumerate(rows) if params[row].greedy]
    if not greedy:
        return list(rows), bitmask
    best = logits[[rows[i] for i in greedy]].argmax(dim=-1).tolist()
    words = bitmask.numpy()
    settled = {
        i for i, token in zip(greedy, best, strict=True) if (int(words[i, token // 32]) >> (token % 32)) & 1
    }
    keep = [i for i in range(len(rows)) if i not in settled]
    return [rows[i] for i in keep], bitmask[keep]


class Sampler:
    """Samples one token per row of logits according to per-row params.

    Holds one reusable generator per device, re-seeded for every seeded row
    (:func:`noise_seed`); not thread-safe (the engine thread owns it).
    """

    def __init__(self) -> None:
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        positions: Sequence[int],
        banned: Sequence[Collection[int]] | None = None,
        allowed: tuple[Sequence[int], torch.Tensor] | None = None,
    ) -> list[int]:
        """Pick the tokens.

        Args:
            logits: ``[B, V]`` float32, one row per sampling sequence.
            params: ``B`` sampling params, row order; a row with a ``seed``
                draws its noise from (seed, its position), others from the
                global RNG.
            positions: ``B`` positions (tokens before the one being sampled:
                prompt plus output so far) of each row's token.
            banned: ``B`` collections of token ids each row may not sample
                (see :func:`mask_banned`), or ``None``. A row must leave at
                least one token unbanned.
            allowed: ``(rows, bitmask)`` of the constrained rows: ``bitmask``
                ``[len(rows), ceil(V / 32)]`` int32, one bit per token a row
                may sample (:func:`~bargein.engine.grammar.apply_bitmask`);
                ``None``: no row is constrained.

        Returns:
            ``B`` token ids.
        """
        assert logits.dim() == 2 and logits.shape[0] == len(params) == len(positions)
        if banned is not None:
            assert len(banned) == len(params)
            logits = mask_banned(logits, banned)
        if allowed is not None:
            logits = apply_bitmask(logits, *_rows_to_mask(logits, params, *allowed))
        greedy_rows = [i for i, p in enumerate(params) if p.greedy]
        if len(greedy_rows) == len(params):
            return logits.argmax(dim=-1).tolist()
        tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
        if greedy_rows:
            tokens[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
        rand_rows = [i for i, p in enumerate(params) if not p.greedy]
        rand_params = [params[i] for i in rand_rows]
        probs = self._probs(logits[rand_rows], rand_params)
        noise = torch.empty_like(probs).exponential_()  # global RNG for unseeded rows
        for row, i in enumerate(rand_rows):
            seed = params[i].seed
            if seed is not None:  # seeded rows: noise keyed by (seed, position) alone
                gen = self._generator(logits.device).manual_seed(noise_seed(seed, positions[i]))
                noise[row].exponential_(generator=gen)
        tokens[rand_rows] = (probs / noise).argmax(dim=-1)
        return tokens.tolist()

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
        return gen

    @staticmethod
    def _probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """``[R, V]`` float32 probabilities after temperature, top-k, top-p."""
        device = logits.device
        temps = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temps.unsqueeze(1)
        vocab = logits.shape[-1]
        top_k = top_p = None
        if any(0 < p.top_k < vocab for p in params):
            ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
            top_k = torch.tensor(ks, dtype=torch.long, device=device)
        if any(p.top_p < 1 for p in params):
            top_p = torch.tensor([p.top_p for p in params], device=device)
        if top_k is not None or top_p is not None:
            logits = apply_top_k_top_p(logits, top_k, top_p)
        return logits.softmax(dim=-1)
