"""Prefix caching through the server: every turn reuses the conversation's KV.

What a client sees: ``usage.cached_tokens`` of a turn counts the prompt tokens
whose KV the engine reused, whole KV blocks of the conversation so far; after
a barge-in, the reuse reaches into the heard part of the cut answer; and one
API key's prompts never show in another key's ``cached_tokens``. The servers
run on live_server's engine (its cache is shared by every test, so each test
uses prompts of its own).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.client.realtime_client import RealtimeClient
from bargein.session.conversation.config import SessionConfig
from tests.app.conftest import LiveServer, node_on_engine

pytestmark = pytest.mark.slow

KEYS = ("key-tenant-a", "key-tenant-b")
STORYTELLER = "You are a storyteller for the prefix cache test. Your stories are long and detailed."


def block_size(live_server: LiveServer) -> int:
    return int(live_server.state.runner.engine.pool.block_size)


def instructions() -> str:
    """A system prompt no other test sends (the cache is shared across tests)."""
    return f"You are a terse assistant. Session {uuid.uuid4().hex}. Answer in one sentence."


async def test_each_turn_reuses_the_conversation_so_far(live_server: LiveServer) -> None:
    size = block_size(live_server)
    async with RealtimeClient(live_server.ws_url) as client:
        await client.update(instructions=instructions())
        first = await client.chat("Name a colour.", max_tokens=12, temperature=0)
        assert first
        done1 = client.current.done  # type: ignore[union-attr]
        assert done1["usage"]["cached_tokens"] == 0  # a new system prompt: nothing to reuse
        await client.chat("And another one?", max_tokens=12, temperature=0)
        done2 = client.current.done  # type: ignore[union-attr]
    usage1, usage2 = done1["usage"], done2["usage"]
    cached = usage2["cached_tokens"]
    # Whole blocks only, at least the first turn's prompt, never more than turn 1 held.
    assert cached % size == 0
    assert cached >= usage1["prompt_tokens"] // size * size
    assert cached <= usage1["prompt_tokens"] + usage1["completion_tokens"]
    assert cached < usage2["prompt_tokens"]


async def test_after_a_barge_in_the_heard_prefix_is_reused(live_server: LiveServer) -> None:
    size = block_size(live_server)
    async with RealtimeClient(live_server.ws_url) as client:
        # A fixed prompt (no other test sends it): greedy, its answer runs past 40 tokens.
        await client.update(instructions=STORYTELLER)
        story = client.respond("Tell me a long story about a lighthouse.", max_tokens=64, temperature=0)
        async for _ in story:
            if client.current.end >= 40:  # type: ignore[union-attr]
                break  # the user speaks: the heard part spans more than one KV block
        response = client.current
        assert response is not None
        heard = len(response.text) * 3 // 4
        done1 = await client.cancel(heard_chars=heard)
        assert done1["finish_reason"] == "interrupted"
        await client.chat("Shorter, please.", max_tokens=8, temperature=0)
        done2 = client.current.done  # type: ignore[union-attr]
    prompt1 = done1["usage"]["prompt_tokens"]
    cached = done2["usage"]["cached_tokens"]
    assert cached % size == 0
    # Blocks past the first prompt were reused: the heard tokens' KV stayed cached ...
    assert cached > prompt1 // size * size, (cached, prompt1)
    # ... and nothing the user did not hear (three quarters of what came).
    assert cached <= prompt1 + done1["usage"]["completion_tokens"] * 3 // 4 + size


@pytest.fixture(scope="module")
def keyed(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=8),
            server=ServerConfig(port=0, log_level="warning", api_keys=",".join(KEYS)),
        ),
    ) as server:
        yield server


async def test_one_key_never_sees_another_keys_prefix(keyed: EmbeddedServer) -> None:
    base_url = f"http://{keyed.host}:{keyed.port}/v1"
    a = openai.AsyncOpenAI(base_url=base_url, api_key=KEYS[0], max_retries=0)
    b = openai.AsyncOpenAI(base_url=base_url, api_key=KEYS[1], max_retries=0)
    canary = [{"role": "user", "content": f"The secret canary is {uuid.uuid4().hex}. Repeat it back to me."}]

    async def ask(client: openai.AsyncOpenAI) -> openai.types.chat.ChatCompletion:
        return await client.chat.completions.create(
            model="bargein",
            messages=canary,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
        )

    first_a = await ask(a)
    again_a = await ask(a)
    first_b = await ask(b)
    again_b = await ask(b)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in (first_a, again_a, first_b, again_b)]  # type: ignore[union-attr]
    assert cached[0] == 0 and cached[1] > 0  # a reuses its own prompt
    assert cached[2] == 0  # b computes it anew: a's KV is not b's
    assert cached[3] == cached[1]  # and then reuses its own
    answers = {r.choices[0].message.content for r in (first_a, again_a, first_b, again_b)}
    assert len(answers) == 1  # the same greedy answer with and without reuse
    await a.close()
    await b.close()
