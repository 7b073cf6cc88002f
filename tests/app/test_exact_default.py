"""Issue 37 over real sockets: the server's exactness promises in the DEFAULT format.

``live_server`` runs ``--quantization auto`` (int4 on the block kernels on
x86), not exact fp32. Each test computes a reference answer on an idle
server, then the same request in a different situation, and wants the
same text:

- the same greedy request again (the second hits the prefix cache, its tail
  is prefilled over cached blocks);
- a greedy stream whose connection drops mid-answer, resumed, while other
  requests of other lengths share its steps;
- a retry after a cancel (the cancelled attempt's blocks cached);
- a seeded request at temperature 0.8 alone and among concurrent requests;
- a stop-string request: the prefix of the same request without the stop.

Every reference starts cold: its system prompt names its test, so no other
test's prefix cache entries touch it (and the texts are the same each run). Takeover by a second node is
tests/app/test_multinode.py (three ``bargein serve`` processes, default
format too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from bargein.client.realtime_client import RealtimeClient
from bargein.engine.model.linear import choose_linear_format
from tests.app.conftest import LiveServer
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

STORY = "Write a long story about a fox who finds a lantern in the snow."
MAX_TOKENS = 32
LOAD_MAX_TOKENS = 24
SEEDED: dict[str, Any] = {"temperature": 0.8, "seed": 4242}
GREEDY: dict[str, Any] = {"temperature": 0}

T = TypeVar("T")


def fresh_instructions(name: str) -> str:
    """A system prompt no other test sends: the first answer to it starts cold."""
    return f"You are a storyteller. Session exact-default-{name}."


async def answer(
    url: str, instructions: str, prompt: str = STORY, max_tokens: int = MAX_TOKENS, **params: Any
) -> tuple[str, dict[str, Any]]:
    """One response on a new connection: (its text, its ``response.done``)."""
    async with RealtimeClient(url) as client:
        text = await client.chat(prompt, instructions=instructions, max_tokens=max_tokens, **params)
        assert client.current is not None and client.current.done is not None
        return text, client.current.done


async def load(url: str) -> None:
    """Several concurrent requests of other prompt and answer lengths, greedy and seeded."""
    prompts = ["Hi.", "Name three rivers in Europe and one fact about each.", STORY * 3]
    await asyncio.gather(
        *(
            answer(url, f"load {i}", prompt, LOAD_MAX_TOKENS, temperature=0.8 if i % 2 else 0, seed=i)
            for i, prompt in enumerate(prompts)
        )
    )


async def under_load(live_server: LiveServer, request: Awaitable[T]) -> T:
    """Await ``request`` (not yet started) once the load's requests are generating,
    so that it joins running steps of other rows and other prefill chunks."""
    start = live_server.stats().num_generated_tokens
    others = asyncio.ensure_future(load(live_server.ws_url))
    await wait_until(lambda: live_server.stats().num_generated_tokens - start >= 4, "the others to decode")
    result = await request
    await others
    return result


def test_the_server_runs_the_default_format(live_server: LiveServer) -> None:
    """These tests would prove nothing about users' arithmetic in exact fp32."""
    auto, _ = choose_linear_format("auto", "auto", device_type="cpu", dtype="float32")
    assert live_server.state.runner.engine.runner.linear_format == auto


async def test_the_same_greedy_request_twice_gives_the_same_text(live_server: LiveServer) -> None:
    instructions = fresh_instructions("twice")
    await live_server.wait_idle()
    first, done1 = await answer(live_server.ws_url, instructions, **GREEDY)
    second, done2 = await answer(live_server.ws_url, instructions, **GREEDY)
    assert done1["usage"]["cached_tokens"] == 0
    assert 0 < done2["usage"]["cached_tokens"] < done2["usage"]["prompt_tokens"]  # a tail to prefill
    assert done1["end"] > 8, first
    assert second == first


async def test_a_resumed_stream_under_load_equals_the_uninterrupted_one(live_server: LiveServer) -> None:
    instructions = fresh_instructions("resume")
    await live_server.wait_idle()
    reference, _ = await answer(live_server.ws_url, instructions, **GREEDY)

    async def dropped_and_resumed() -> tuple[str, int]:
        async with RealtimeClient(live_server.ws_url) as client:
            parts = []
            async for delta in client.respond(
                STORY, instructions=instructions, max_tokens=MAX_TOKENS, **GREEDY
            ):
                parts.append(delta)
                if len(parts) == 3:
                    client.abort_transport()  # the network drops; the client resumes from its end
            return "".join(parts), client.num_resumes

    text, num_resumes = await under_load(live_server, dropped_and_resumed())
    assert num_resumes == 1
    assert text == reference


async def test_a_retry_after_a_cancel_repeats_the_idle_answer(live_server: LiveServer) -> None:
    instructions = fresh_instructions("retry")
    await live_server.wait_idle()
    reference, _ = await answer(live_server.ws_url, instructions, **GREEDY)
    async with RealtimeClient(live_server.ws_url) as client:
        async for _ in client.respond(STORY, instructions=instructions, max_tokens=MAX_TOKENS, **GREEDY):
            if client.current is not None and client.current.end >= 5:
                break
        cancelled = await client.cancel()
    assert cancelled["finish_reason"] == "interrupted"
    retry, _ = await under_load(live_server, answer(live_server.ws_url, instructions, **GREEDY))
    assert retry == reference


async def test_a_seed_gives_the_same_text_alone_and_under_load(live_server: LiveServer) -> None:
    instructions = fresh_instructions("seed")
    await live_server.wait_idle()
    alone, _ = await answer(live_server.ws_url, instructions, **SEEDED)
    greedy, _ = await answer(live_server.ws_url, instructions, **GREEDY)
    assert alone != greedy, "the seeded answer should really sample"
    loaded, _ = await under_load(live_server, answer(live_server.ws_url, instructions, **SEEDED))
    assert loaded == alone


async def test_a_stop_string_answer_is_the_prefix_of_the_answer_without_it(live_server: LiveServer) -> None:
    instructions = fresh_instructions("stop")
    await live_server.wait_idle()
    full, _ = await answer(live_server.ws_url, instructions, **GREEDY)
    words = full.split()
    assert len(words) > 6, full
    stop = words[len(words) // 2]  # a word from the middle of the answer
    cut, done = await under_load(live_server, answer(live_server.ws_url, instructions, stop=[stop], **GREEDY))
    assert done["finish_reason"] == "stop"
    assert cut == full[: full.index(stop)]
