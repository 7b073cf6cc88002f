"""Resume under every kind of disconnect, over real sockets on the bundled model.

The torture test cuts one greedy answer at 50 points: a few while the answer
is still being generated (each its own stream, since a cut of a live stream
can happen once), the rest against the completed stream, replayed from the
log. Resume on the Redis backend runs on two more servers in this process
that share ``live_server``'s engine runner (no second model load): two nodes
on one redis-server.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tests.app.conftest import LiveServer
from tests.app.resume_helpers import Conn, Received, assert_tiles

pytestmark = pytest.mark.slow

# Greedy SmolLM2 answers this with Japanese script among English words: many
# of its tokens are pieces of a UTF-8 character (alone they decode to U+FFFD).
PROMPT = ("How do you say 'thank you' in Japanese? Give the Japanese script and romaji, "
          "then a short explanation in English.")
N = 64  # tokens of the answer (live_server's max_tokens)
NUM_ROUNDS = 50
NUM_LIVE_ROUNDS = 6


async def _reference(live_server: LiveServer) -> tuple[dict[str, Any], Received]:
    """One uninterrupted greedy run: its response.created and all it received."""
    conn = await Conn.open(live_server.ws_url)
    await conn.send(type="session.update", session={"include_token_ids": True})
    await conn.expect("session.updated")
    created = await conn.create(PROMPT, temperature=0.0, max_tokens=N)
    received = await conn.read(Received())
    await conn.close()
    assert received.done is not None and received.done["end"] == N
    assert_tiles(received.deltas, 0, N)
    return created, received


def _cut_points(reference: Received, rng: random.Random) -> list[int]:
    """Offsets a replay round starts from: the edge cases, then random boundaries."""
    boundaries = [0] + [d["end"] for d in reference.deltas]  # offsets a client can hold
    ids = [t for d in reference.deltas for t in d["token_ids"]]
    mid_char = [b for b in boundaries if 0 < b <= len(ids)
                and "\ufffd" in _decode_one(ids[b - 1])]
    assert len(mid_char) >= 3, "the answer should hold multi-token characters"
    edges = [0, N - 1, N, *rng.sample(mid_char, 3)]
    assert N - 1 in boundaries, "a delta should end right before the last token"
    rest = NUM_ROUNDS - NUM_LIVE_ROUNDS - len(edges)
    return edges + [rng.choice(boundaries) for _ in range(rest)]


_TOKENIZER: Any = None


def _decode_one(token_id: int) -> str:
    return str(_TOKENIZER.decode([token_id]))


def _prefix(reference: Received, offset: int) -> str:
    """Text of the reference's tokens ``[0, offset)`` (``offset`` a delta boundary)."""
    return "".join(d["text"] for d in reference.deltas if d["end"] <= offset)


async def _replay_round(url: str, created: dict[str, Any], reference: Received,
                        start: int, num_before_drop: int) -> int:
    """Read from ``start``, drop after ``num_before_drop`` deltas, resume from the
    last end received; check the joined text. Returns the cut offset."""
    first = await Conn.open(url)
    await first.resume(created["stream_id"], created["resume_token"], start)
    before = await first.read(Received(), max_deltas=num_before_drop)
    first.drop()
    cut = start if before.end is None else before.end
    if before.done is not None:  # it ended before the drop: nothing left but its end
        assert before.done["end"] == N and cut == N
    assert_tiles(before.deltas, start, cut)
    second = await Conn.open(url)
    resumed = await second.resume(created["stream_id"], created["resume_token"], cut)
    assert resumed["status"] == "complete" and resumed["from"] == cut
    after = await second.read(Received())
    await second.close()
    assert_tiles(after.deltas, cut, N)
    assert after.done is not None and after.done["end"] == N
    joined = _prefix(reference, start) + before.text + after.text
    assert joined.encode() == reference.text.encode(), (start, cut)
    return cut


async def _live_round(live_server: LiveServer, target: int) -> tuple[int, Received]:
    """A new greedy response of its own, dropped once ``target`` tokens came
    (while it generates), resumed on a new connection. Returns the cut offset
    and everything received on both connections."""
    first = await Conn.open(live_server.ws_url)
    created = await first.create(PROMPT, temperature=0.0, max_tokens=N)
    before = Received()
    while (before.end or 0) < target:
        await first.read(before, max_deltas=1)
    first.drop()
    cut = before.end or 0
    second = await Conn.open(live_server.ws_url)
    await second.resume(created["stream_id"], created["resume_token"], cut)
    after = await second.read(Received())
    await second.close()
    assert_tiles(before.deltas, 0, cut)
    assert_tiles(after.deltas, cut, N)
    return cut, Received(deltas=before.deltas + after.deltas, done=after.done)


async def test_resume_torture(live_server: LiveServer) -> None:
    """50 cuts of one greedy answer: joined text byte-exact, offsets tile, no
    token generated twice."""
    global _TOKENIZER
    _TOKENIZER = live_server.tokenizer
    rng = random.Random(20261129)
    await live_server.wait_idle()
    tokens_at_start = live_server.stats().num_generated_tokens
    # The reference and the live rounds generate at once (one batch, greedy
    # output does not depend on it): drop before the first token, right
    # before the end, and in between.
    targets = (0, N - 1, *(rng.randrange(1, N - 1) for _ in range(NUM_LIVE_ROUNDS - 2)))
    (created, reference), *live = await asyncio.gather(
        _reference(live_server), *(_live_round(live_server, t) for t in targets))
    assert any(ord(c) > 127 for c in reference.text)
    cuts = []
    for cut, received in live:
        assert received.text.encode() == reference.text.encode(), cut
        cuts.append(cut)
    await live_server.wait_idle()
    tokens_after_live = live_server.stats().num_generated_tokens
    assert tokens_after_live - tokens_at_start == (1 + NUM_LIVE_ROUNDS) * N
    for start in _cut_points(reference, rng):
        cuts.append(await _replay_round(live_server.ws_url, created, reference, start,
                                        num_before_drop=rng.choice((0, 0, 1, 2))))
    assert len(cuts) == NUM_ROUNDS and {0, N - 1, N} <= set(cuts)
    # Once from an earlier offset than the last end received: the log still has it.
    earlier = reference.deltas[6]["end"]
    conn = await Conn.open(live_server.ws_url)
    await conn.resume(created["stream_id"], created["resume_token"], earlier)
    again = await conn.read(Received())
    await conn.close()
    assert_tiles(again.deltas, earlier, N)
    assert (_prefix(reference, earlier) + again.text).encode() == reference.text.encode()
    assert live_server.stats().num_generated_tokens == tokens_after_live, \
        "a replay must not generate"
