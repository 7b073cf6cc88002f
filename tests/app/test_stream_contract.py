"""The stream contract under races: what was delivered, what ``response.done``
says and what a replay gives always agree (issue 16), against the real server
and model over real sockets."""

from __future__ import annotations

import asyncio
import random

import pytest

from loadtests.bare_client import Conn, Received, assert_tiles
from loadtests.contract_rounds import SCENARIOS, Tally, run_round
from tests.app.conftest import LiveServer

pytestmark = pytest.mark.slow

STORY = "Write a long story about a dragon."
NUM_ROUNDS = 200
NUM_CLIENTS = 4


async def test_a_cancelled_stream_ends_where_its_last_delta_ended(live_server: LiveServer) -> None:
    # The cancel goes out right after a delta, while the engine's next step is
    # in flight: that step's token is sampled after the cancel, so it is not
    # logged, and response.done's end is the end of the last delta received.
    for num_deltas in (1, 2, 3, 5, 8):
        conn = await Conn.open(live_server.ws_url)
        try:
            created = await conn.create(STORY, max_tokens=48, temperature=0)
            live = await conn.read(Received(), max_deltas=num_deltas)
            await conn.send(type="response.cancel", response_id=created["response_id"])
            await conn.read(live)
        finally:
            await conn.close()
        assert live.done is not None and live.done["finish_reason"] == "interrupted"
        assert_tiles(live.deltas, 0, live.done["end"])
        assert live.done["usage"]["completion_tokens"] == live.done["end"]
        again = await Conn.open(live_server.ws_url)
        try:
            await again.resume(created["stream_id"], created["resume_token"], 0)
            logged = await again.read(Received())
        finally:
            await again.close()
        assert (logged.text, logged.end) == (live.text, live.end)
        assert logged.done == live.done
    await live_server.wait_idle()


async def test_interrupt_active_sends_the_old_response_to_its_done_first(live_server: LiveServer) -> None:
    for num_deltas in (1, 3, 6):
        conn = await Conn.open(live_server.ws_url)
        try:
            old = await conn.create(STORY, max_tokens=48, temperature=0)
            await conn.read(Received(), max_deltas=num_deltas)
            await conn.send(
                type="response.create",
                interrupt_active=True,
                max_tokens=4,
                temperature=0,
                input=[{"role": "user", "content": "Stop."}],
            )
            events = []
            while (
                not events
                or events[-1]["type"] != "response.done"
                or events[-1]["response_id"] == old["response_id"]
            ):
                events.append(await conn.recv())
        finally:
            await conn.close()
        kinds = [(e["type"], e.get("response_id") == old["response_id"]) for e in events]
        created_at = kinds.index(("response.created", False))
        assert ("response.done", True) in kinds[:created_at], kinds
        assert all(not is_old for _, is_old in kinds[created_at:]), kinds
    await live_server.wait_idle()


async def test_random_interleavings_agree_in_every_round(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    tally = Tally()

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for round_ in range(NUM_ROUNDS // NUM_CLIENTS):
            try:
                await run_round(live_server.ws_url, rng, tally)
            except AssertionError as exc:
                raise AssertionError(f"client {seed}, round {round_}: {exc}") from exc

    await asyncio.gather(*(client(seed) for seed in range(NUM_CLIENTS)))
    assert set(tally.scenarios) == set(SCENARIOS)
    assert tally.finish_reasons["interrupted"] > 0
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks


async def test_a_stream_cut_inside_a_character_ends_with_the_last_whole_one(live_server: LiveServer) -> None:
    # The model answers this with emoji of several byte-level tokens each; a
    # max_tokens that ends between two of them must not end the text with
    # U+FFFD. The cut token still counts in offsets and usage.
    async def answer(max_tokens: int) -> Received:
        conn = await Conn.open(live_server.ws_url)
        try:
            await conn.send(type="session.update", session={"include_token_ids": True})
            await conn.expect("session.updated")
            await conn.create("Reply with three emoji.", max_tokens=max_tokens, temperature=0)
            return await conn.read(Received())
        finally:
            await conn.close()

    full = await answer(24)
    ids = [t for d in full.deltas for t in d["token_ids"]]
    decode = live_server.tokenizer.decode
    cut = next(k for k in range(1, len(ids)) if decode(ids[:k], skip_special_tokens=True).endswith("\ufffd"))
    short = await answer(cut)
    assert short.done is not None
    assert (short.done["end"], short.done["finish_reason"]) == (cut, "length")
    assert short.done["usage"]["completion_tokens"] == cut
    assert "\ufffd" not in short.text
    assert short.text == decode(ids[:cut], skip_special_tokens=True).rstrip("\ufffd")
    assert full.text.startswith(short.text)
