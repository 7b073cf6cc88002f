"""Barge-in end to end: interrupts reach the engine, every race ends each request once."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import LiveServer

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


def num_finished(stats: Any) -> int:
    return sum(stats.num_finished_by_reason.values())


async def events_until_done(client: RealtimeClient, response_id: str) -> list[dict]:
    """Events up to and including ``response_id``'s ``response.done``."""
    events = []
    while True:
        event = await client._recv()
        events.append(event)
        if event["type"] == "response.done" and event["response_id"] == response_id:
            return events


async def test_interrupt_active_replaces_the_answer_in_one_event(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {
                "type": "response.create",
                "response_id": "story",
                "input": STORY,
                "max_tokens": 64,
                "temperature": 0,
            }
        )
        heard = ""
        while len(heard) < 10:
            event = await client._recv()
            if event["type"] == "response.delta":
                heard += event["text"]
        await client.send(
            {
                "type": "response.create",
                "response_id": "short",
                "interrupt_active": True,
                "max_tokens": 4,
                "temperature": 0,
                "input": [{"role": "user", "content": "Stop. Say hi."}],
            }
        )
        events = await events_until_done(client, "short")
    story = [e for e in events if e.get("response_id") == "story"]
    assert story[-1]["type"] == "response.done"
    assert story[-1]["finish_reason"] == "interrupted"
    assert [e for e in events if e["type"] == "error"] == []
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    # Default cut: what was delivered when the interrupt arrived (at least what we read).
    turn = prompt.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0]
    assert turn.startswith(heard) or heard.startswith(turn)
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks
    assert num_finished(stats) - num_finished(start) == 2


async def test_cancel_races_each_end_the_request_exactly_once(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as client, RealtimeClient(live_server.ws_url) as other:
        # Cancel in the same burst of frames as the create (before any step).
        await client.send({"type": "response.create", "response_id": "a", "input": STORY, "max_tokens": 32})
        await client.send({"type": "response.cancel", "response_id": "a"})
        done = (await events_until_done(client, "a"))[-1]
        assert done["finish_reason"] == "interrupted"
        # Twice, and after it finished: response.done again, nothing else.
        await client.send({"type": "response.cancel", "response_id": "a"})
        again = (await events_until_done(client, "a"))[-1]
        assert (again["stream_id"], again["finish_reason"]) == (done["stream_id"], "interrupted")
        # The same client-chosen id, reused right after the cancel.
        await client.send(
            {
                "type": "response.create",
                "response_id": "a",
                "input": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 3,
                "temperature": 0,
            }
        )
        reused = await events_until_done(client, "a")
        assert reused[-1]["stream_id"] != done["stream_id"]
        assert reused[-1]["finish_reason"] in ("stop", "length")
        # Another session's response id is not found here, and nothing is aborted.
        await other.send(
            {
                "type": "response.create",
                "response_id": "b",
                "input": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 6,
                "temperature": 0,
            }
        )
        await client.send({"type": "response.cancel", "response_id": "b", "event_id": "x"})
        error = await client._recv()
        assert (error["type"], error["code"], error["event_id"]) == ("error", "not_found", "x")
        assert (await events_until_done(other, "b"))[-1]["finish_reason"] in ("stop", "length")
    stats = await live_server.wait_idle()
    assert num_finished(stats) - num_finished(start) == 3
    assert stats.num_free_blocks == start.num_free_blocks


async def test_cancel_during_prefill_of_a_long_prompt(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    long_prompt = "Summarize this: " + "the quick brown fox jumps over the lazy dog " * 40
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {
                "type": "response.create",
                "response_id": "long",
                "max_tokens": 32,
                "input": [{"role": "user", "content": long_prompt}],
            }
        )
        created = await client._expect("response.created")
        await client.send({"type": "response.cancel", "response_id": "long"})
        done = (await events_until_done(client, created["response_id"]))[-1]
    assert done["finish_reason"] == "interrupted"
    assert done["usage"]["prompt_tokens"] > 256  # more than one prefill chunk
    assert done["end"] < 3  # stopped at (or right after) the prefill
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks


async def test_fuzz_submit_then_cancel_leaks_nothing(live_server: LiveServer) -> None:
    """1,000 create-then-cancel rounds, cancel 0-50 ms later (0: same burst), from
    25 clients at once, while another session generates and must come out intact."""
    rng = random.Random(6)
    num_clients, rounds_each = 25, 40
    start = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as ref:
        reference = await ref.chat("Name three colors.", max_tokens=24, temperature=0)

    async def fuzz(index: int) -> int:
        for i in range(rounds_each):  # a new conversation each round: short prompts
            async with RealtimeClient(live_server.ws_url) as client:
                rid = f"f{index}-{i}"
                await client.send(
                    {
                        "type": "response.create",
                        "response_id": rid,
                        "input": [{"role": "user", "content": f"Count to {i}."}],
                        "max_tokens": 16,
                    }
                )
                delay = rng.choice([0.0, rng.uniform(0, 0.05)])
                if delay:  # a random moment of the answer to cancel at: what is tested
                    await asyncio.sleep(delay)
                await client.send({"type": "response.cancel", "response_id": rid})
                events = await events_until_done(client, rid)
                assert [e for e in events if e["type"] == "error"] == [], events
                assert sum(e["type"] == "response.done" for e in events) == 1
        return rounds_each

    async def bystander() -> list[str]:
        answers = []
        for _ in range(3):  # each in a new conversation, like the reference
            async with RealtimeClient(live_server.ws_url) as client:
                answers.append(await client.chat("Name three colors.", max_tokens=24, temperature=0))
        return answers

    results = await asyncio.gather(*(fuzz(i) for i in range(num_clients)), bystander())
    assert sum(results[:-1]) == 1000
    assert results[-1] == [reference] * 3
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks
    assert num_finished(stats) - num_finished(start) == 1000 + 4
