"""The abandon grace covers HTTP streams: a completion whose client left is
released like a WebSocket's response, and an SSE reader of
``/v1/streams/{id}/events`` counts as a reader.

The server here runs on live_server's engine loop (no second model load),
with ``on_disconnect: continue`` and a short abandon grace; answers are long
(up to 448 tokens) so that generating them outlasts the grace, which each test
checks (the stream still generating) before it relies on it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from loadtests.bare_client import Conn, Received
from tests.app.conftest import LiveServer, node_on_engine

pytestmark = pytest.mark.slow

GRACE_S = 0.4
MAX_TOKENS = 448  # live_server's max_model_len is 512
FOLLOWED_TOKENS = 128  # read to the end: enough to outlast 2.5 graces, no more
STORY = "Write a very long story about a dragon who learns to cook. Use many chapters."


@pytest.fixture(scope="module")
def graced(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(
                max_tokens=MAX_TOKENS,
                default_max_tokens=32,
                on_disconnect="continue",
                abandon_grace_s=GRACE_S,
            ),
            server=ServerConfig(port=0, debug_endpoints=True, log_level="warning"),
        ),
    ) as server:
        yield server


@pytest.fixture
async def client(graced: EmbeddedServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=graced.http_url + "/v1", api_key="sk-grace", max_retries=0
    ) as client:
        yield client


def _generating(server: EmbeddedServer, stream_id: str) -> bool:
    assert server.state.service is not None
    return server.state.service.is_generating(stream_id)


async def _final_event(server: EmbeddedServer, stream_id: str) -> dict[str, Any]:
    """Replay the whole (ended) stream over SSE; its chunk with the finish reason."""
    finish: dict[str, Any] | None = None
    async with httpx.AsyncClient(
        base_url=server.http_url, timeout=60, headers={"Authorization": "Bearer sk-grace"}
    ) as http:
        async with http.stream("GET", f"/v1/streams/{stream_id}/events?from=0") as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    body = json.loads(line[6:])
                    if body["choices"] and body["choices"][0]["finish_reason"]:
                        finish = body
    assert finish is not None
    return finish


async def test_a_streamed_completion_whose_client_left_is_cancelled_after_the_grace(
    graced: EmbeddedServer, live_server: LiveServer, client: openai.AsyncOpenAI
) -> None:
    await live_server.wait_idle()
    stream = await client.chat.completions.create(
        model="bargein",
        messages=[{"role": "user", "content": STORY}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    stream_id = ""
    async for chunk in stream:
        stream_id = chunk.id.removeprefix("chatcmpl-")
        if chunk.choices and chunk.choices[0].delta.content:
            break
    assert _generating(graced, stream_id), "the answer must outlast the test's first chunk"
    await stream.close()  # the client leaves; the server's policy is continue
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks
    finish = await _final_event(graced, stream_id)
    assert finish["choices"][0]["finish_reason"] == "cancelled"


async def test_a_completion_whose_client_left_before_the_answer_is_cancelled_too(
    graced: EmbeddedServer, live_server: LiveServer
) -> None:
    await live_server.wait_idle()
    before = {r.request_id for r in graced.state.service.recent_requests}  # type: ignore[union-attr]
    async with openai.AsyncOpenAI(
        base_url=graced.http_url + "/v1", api_key="sk-grace", max_retries=0, timeout=0.3
    ) as impatient:
        with pytest.raises(openai.APITimeoutError):
            await impatient.chat.completions.create(
                model="bargein",
                messages=[{"role": "user", "content": STORY}],
                max_tokens=MAX_TOKENS,
                temperature=0,
            )
    assert graced.state.service is not None
    new = [r.request_id for r in graced.state.service.recent_requests if r.request_id not in before]
    assert len(new) == 1
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks
    finish = await _final_event(graced, new[0])
    assert finish["choices"][0]["finish_reason"] == "cancelled"


async def test_a_websocket_stream_followed_over_sse_is_not_abandoned(
    graced: EmbeddedServer, live_server: LiveServer
) -> None:
    await live_server.wait_idle()
    conn = await Conn.open(graced.ws_url)
    created = await conn.create(STORY, temperature=0.0, max_tokens=FOLLOWED_TOKENS)
    await conn.read(Received(), max_deltas=1)
    conn.drop()  # released: only a reader keeps it going past the grace
    stream_id = created["stream_id"]
    finish: str | None = None
    async with httpx.AsyncClient(base_url=graced.http_url, timeout=60) as http:
        async with http.stream("GET", f"/v1/streams/{stream_id}/events?from=0") as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            assert (await anext(lines)).startswith("id:")
            assert _generating(graced, stream_id)
            # The grace period passing is what is tested (a lower bound: a loaded
            # box only waits longer): the reader holds the stream meanwhile.
            await asyncio.sleep(2.5 * GRACE_S)
            assert _generating(graced, stream_id), "an SSE reader must keep it alive"
            async for line in lines:
                if line.startswith("data: {"):
                    choices = json.loads(line[6:])["choices"]
                    if choices and choices[0]["finish_reason"]:
                        finish = choices[0]["finish_reason"]
    assert finish in ("stop", "length")
