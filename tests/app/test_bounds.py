"""Offsets and counts from clients are bounded at the protocol edge.

Huge numbers are refused where they come in, with the protocol's error
(``invalid_parameter`` on the WebSocket, an OpenAI-style 400 over HTTP):
never a 500 (Python's int-parsing limit), never a value that reaches Redis
and comes back as "token log unavailable". The server runs on the Redis
backend and on live_server's engine loop (no second model load); the
stream read is live, so no "past the end" check answers first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from bargein.app.embedded import EmbeddedServer
from loadtests.bare_client import Conn, Received
from tests.app.conftest import LiveServer, redis_node_on_engine

pytestmark = [pytest.mark.slow, pytest.mark.redis]

HUGE_OFFSETS = ["9" * 5000, str(2**64), str(2**63), str(2**31)]


@pytest.fixture(scope="module")
def redis_node(live_server: LiveServer, redis_server: str) -> Iterator[EmbeddedServer]:
    with redis_node_on_engine(live_server, redis_server, "bounds-a") as server:
        yield server


@pytest.fixture
async def live_stream(redis_node: EmbeddedServer) -> AsyncIterator[tuple[Conn, dict]]:
    """A WebSocket response still generating: (its connection, its response.created)."""
    conn = await Conn.open(redis_node.ws_url)
    created = await conn.create("Write a long story about a dragon.", temperature=0, max_tokens=64)
    await conn.read(Received(), max_deltas=1)
    try:
        yield conn, created
    finally:
        await conn.send(type="response.cancel", response_id=created["response_id"])
        await conn.close()


async def test_huge_sse_positions_are_a_400(
    redis_node: EmbeddedServer, live_stream: tuple[Conn, dict]
) -> None:
    _, created = live_stream
    stream_id = created["stream_id"]
    url = f"/v1/streams/{stream_id}/events"
    async with httpx.AsyncClient(base_url=redis_node.http_url, timeout=30) as http:
        for offset in HUGE_OFFSETS:
            for params, headers, param in (
                ({"from": offset}, {}, "from"),
                ({}, {"Last-Event-ID": f"{stream_id}:{offset}"}, "Last-Event-ID"),
            ):
                response = await http.get(url, params=params, headers=headers)
                assert response.status_code == 400, (offset[:30], param, response.text)
                error = response.json()["error"]
                assert error["param"] == param and error["type"] == "invalid_request_error"
        assert (await http.get("/readyz")).status_code == 200  # Redis was never asked


async def test_huge_resume_offsets_are_invalid_parameter(
    redis_node: EmbeddedServer, live_stream: tuple[Conn, dict]
) -> None:
    conn, created = live_stream
    other = await Conn.open(redis_node.ws_url)
    try:
        for offset in (2**63 - 1, 2**31):
            await other.send(
                type="stream.resume",
                stream_id=created["stream_id"],
                resume_token=created["resume_token"],
                **{"from": offset},
            )
            error = await other.expect("error")
            assert error["code"] == "invalid_parameter" and "from" in error["message"]
        await other.send(type="ping")
        await other.expect("pong")  # the connection is still serving
    finally:
        await other.close()
