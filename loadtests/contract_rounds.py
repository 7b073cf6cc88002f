"""Random rounds of the stream contract, seen from outside as a client sees it.

One round opens a connection, starts a response and then, at a random moment
(after a random number of deltas, and a random pause), does one of: nothing,
``response.cancel`` (with or without ``heard_chars``), a ``response.create``
with ``interrupt_active``, or a dropped socket followed by a ``stream.resume``
on a new connection from an offset the client really held. Afterwards a third
connection replays the stream from 0 and from a random offset it held.

The three views must agree in every round:

- *delivered*: the deltas the live client got tile ``[0, end)`` in order;
- ``response.done``: its ``end`` is the end of the last delta (0 with none),
  and a second ``response.done`` (after a resume, or in a replay) says the same;
- *replay*: a ``stream.resume`` from any held offset gives the same text and
  offsets as the live client got from there.

And under ``interrupt_active`` every event of the old response precedes the
new one's ``response.created``. Used by tests/app/test_stream_contract.py (a
few hundred rounds) and loadtests/stream_contract.py (thousands).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loadtests.bare_client import Conn, Received, assert_tiles

PROMPTS = [
    "Tell me a story about a cat.",
    "Count from one to twenty.",
    "Describe the sea.",
    "Name some colors.",
    "Write a poem about rain.",
]
SCENARIOS = ("read", "cancel", "cancel_heard", "interrupt_active", "drop_resume")


@dataclass(slots=True)
class Tally:
    """Rounds run, by scenario, and the finish reasons they ended with."""

    scenarios: Counter[str] = field(default_factory=Counter)
    finish_reasons: Counter[str] = field(default_factory=Counter)
    tokens: int = 0


def _texts_by_offset(deltas: list[dict[str, Any]]) -> dict[int, str]:
    """Text of the stream from each delta's start on, keyed by that start."""
    tails: dict[int, str] = {}
    for i, delta in enumerate(deltas):
        tails[delta["start"]] = "".join(d["text"] for d in deltas[i:])
    return tails


async def _read_live(
    conn: Conn, response_id: str, received: Received, max_deltas: int | None = None
) -> list[dict[str, Any]]:
    """Read ``response_id``'s deltas and done into ``received``; return other events."""
    others: list[dict[str, Any]] = []
    await conn.read(received, max_deltas, response_id=response_id, others=others)
    return others


def _check_done(received: Received, start: int = 0) -> None:
    """Delivered deltas tile ``[start, done.end)``: ``done.end`` is the last delta's end."""
    assert received.done is not None
    end = received.done["end"]
    assert_tiles(received.deltas, start, end)
    assert "\ufffd" not in received.text[-1:], "a stream ends inside a character"


async def _replay(url: str, created: dict[str, Any], from_: int) -> Received:
    conn = await Conn.open(url)
    try:
        resumed = await conn.resume(created["stream_id"], created["resume_token"], from_)
        assert resumed["status"] == "complete", resumed
        return await conn.read(Received())
    finally:
        await conn.close()


async def run_round(url: str, rng: random.Random, tally: Tally) -> None:
    """One random round; raises AssertionError when a view disagrees."""
    scenario = rng.choice(SCENARIOS)
    tally.scenarios[scenario] += 1
    params = {
        "max_tokens": rng.randint(2, 24),
        "temperature": rng.choice([0, 1]),
        "seed": rng.randint(0, 1000),
    }
    conn = await Conn.open(url)
    live = Received()
    try:
        created = await conn.create(rng.choice(PROMPTS), **params)
        rid = created["response_id"]
        await _read_live(conn, rid, live, max_deltas=rng.randint(0, 4))
        await asyncio.sleep(rng.uniform(0, 0.08))  # a random pause before acting: what is tested
        if scenario in ("cancel", "cancel_heard") and live.done is None:
            heard = {"heard_chars": rng.randint(0, len(live.text))} if scenario == "cancel_heard" else {}
            await conn.send(type="response.cancel", response_id=rid, **heard)
        elif scenario == "interrupt_active" and live.done is None:
            await conn.send(
                type="response.create",
                interrupt_active=True,
                max_tokens=2,
                temperature=0,
                input=[{"role": "user", "content": "Stop."}],
            )
            others = await _read_live(conn, rid, live)
            assert all(e["type"] != "response.created" for e in others), (
                f"an event of the interrupted response came after the next response.created: {others}"
            )
            nxt = await conn.expect("response.created") if not others else others[0]
            assert nxt["type"] == "response.created", nxt
            await conn.read(Received())  # the new response to its end
        elif scenario == "drop_resume" and live.done is None:
            conn.drop()
            held = rng.choice([0] + [d["end"] for d in live.deltas])
            live.deltas = [d for d in live.deltas if d["end"] <= held]
            conn = await Conn.open(url)
            await conn.resume(created["stream_id"], created["resume_token"], held)
        await _read_live(conn, rid, live)
    finally:
        await conn.close()
    _check_done(live)
    assert live.done is not None
    tally.finish_reasons[live.done["finish_reason"]] += 1
    tally.tokens += live.done["end"]
    full = await _replay(url, created, 0)
    _check_done(full)
    assert full.text == live.text, (full.text, live.text)
    assert {k: full.done[k] for k in ("end", "finish_reason", "usage")} == {  # type: ignore[index]
        k: live.done[k] for k in ("end", "finish_reason", "usage")
    }
    held = rng.choice([0] + [d["end"] for d in live.deltas])
    part = await _replay(url, created, held)
    _check_done(part, held)
    if held < live.done["end"]:
        assert part.text == _texts_by_offset(live.deltas)[held]
