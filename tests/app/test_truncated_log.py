"""Resuming a stream whose Redis log lost entries: an explicit refusal, never a gap.

A server on the Redis backend (sharing ``live_server``'s engine loop: no
second model load) answers a stream; then its log is trimmed the way an
operator's ``XTRIM`` (or an eviction) would, keeping the stream's metadata.
A ``stream.resume`` gets ``error`` ``stream_truncated``; an SSE resume gets
HTTP 410 with an OpenAI-style error body.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from bargein.app.embedded import EmbeddedServer
from bargein.session.runtime.tokens import make_resume_token
from bargein.session.streams.log import LogEntry, StreamInfo, StreamWrite
from bargein.session.streams.log.redis_format import Keys
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from loadtests.bare_client import Conn, Received
from tests.app.conftest import LiveServer, redis_node_on_engine

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PROMPT = "Count from one to ten in words."
NUM_TOKENS = 12
AUTH = {"Authorization": "Bearer sk-test-trim"}


@pytest.fixture(scope="module")
def redis_node(live_server: LiveServer, redis_server: str) -> Iterator[EmbeddedServer]:
    with redis_node_on_engine(live_server, redis_server, "trim-a") as server:
        yield server


@pytest.fixture
async def raw(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


async def trim_all_but_the_end(raw: Redis, stream_id: str) -> None:
    """``XTRIM MAXLEN 1``: every token entry goes, the finish entry stays."""
    key = Keys("bargein:").log(stream_id)  # the server's default key prefix
    assert await raw.xtrim(key, maxlen=1, approximate=False) >= 1


async def test_stream_resume_of_a_trimmed_log_is_refused(redis_node: EmbeddedServer, raw: Redis) -> None:
    first = await Conn.open(redis_node.ws_url)
    created = await first.create(PROMPT, max_tokens=NUM_TOKENS, temperature=0)
    received = await first.read(Received())
    await first.close()
    assert received.done is not None and received.done["end"] == NUM_TOKENS
    await trim_all_but_the_end(raw, created["stream_id"])

    second = await Conn.open(redis_node.ws_url)
    try:
        await second.resume(created["stream_id"], created["resume_token"], 2)
        error = await second.recv()  # no delta first: the missing tokens are not skipped
        assert error["type"] == "error", error
        assert error["code"] == "stream_truncated" and error["retryable"] is False
        assert error["response_id"] == created["response_id"] and error["message"]
        # A client that holds every token up to the end still gets the end.
        await second.resume(created["stream_id"], created["resume_token"], NUM_TOKENS)
        done = await second.expect("response.done")
        assert done["end"] == NUM_TOKENS
    finally:
        await second.close()


async def test_sse_resume_of_a_trimmed_log_is_410_gone(redis_node: EmbeddedServer, raw: Redis) -> None:
    async with httpx.AsyncClient(base_url=redis_node.http_url, headers=AUTH, timeout=60) as http:
        body = {
            "model": "bargein",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": NUM_TOKENS,
            "temperature": 0,
            "stream": True,
        }
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        stream_id = response.headers["x-bargein-stream-id"]
        await trim_all_but_the_end(raw, stream_id)
        url = f"/v1/streams/{stream_id}/events"
        gone = await http.get(url, headers={"Last-Event-ID": f"{stream_id}:1"})
        assert gone.status_code == 410
        error = gone.json()["error"]
        assert error["code"] == "stream_truncated" and error["message"]
        assert error["type"] == "invalid_request_error"
        # From the end nothing is missing: the closing events and [DONE].
        end = await http.get(url, headers={"Last-Event-ID": f"{stream_id}:{NUM_TOKENS}"})
        assert end.status_code == 200
        events = [line for line in end.text.splitlines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[0][5:])["choices"][0]["finish_reason"] == "length"  # max_tokens


# ---- a stream whose generating node died, and whose log then lost entries -------------

ANSWER_WITHIN_S = 10.0  # a refusal needs a few log round trips and one takeover attempt


# How the dead node's log lost entries: its head (XTRIM MINID), or all of them (the
# entries key expired or evicted: the end the log still shows is then 0, below the resume's).
LOSSES = {
    "head-trimmed": lambda raw, key: raw.xtrim(key, minid="4-0", approximate=False),
    "entries-gone": lambda raw, key: raw.delete(key),
}


async def ghost_stream(redis_url: str, principal: str, loss: str) -> str:
    """A live stream as a node that then died leaves it (entries ``[0, 8)`` in
    steps of 2, no finish, no lease), that then lost entries (``LOSSES``)."""
    ghost = RedisTokenLog(redis_url, node_id="ghost", config=RedisLogConfig(key_prefix="bargein:"))
    stream_id = f"ghost{uuid.uuid4().hex}"
    info = StreamInfo(
        stream_id=stream_id,
        response_id=f"chatcmpl-{stream_id}",
        principal=principal,
        session_id=f"sess-{stream_id}",
        owner_node="ghost",
        status="live",
        end=0,
        finish=None,
    )
    try:
        await ghost.create_stream(info)
        for start in range(0, 8, 2):
            entry = LogEntry(start=start, end=start + 2, text=f"<{start}>", token_ids=(7, 7))
            await ghost.write_step([StreamWrite(stream_id=stream_id, entry=entry, finish=None)])
    finally:
        await ghost.close()
    async with Redis.from_url(redis_url) as raw:
        await LOSSES[loss](raw, Keys("bargein:").log(stream_id))
    return stream_id


async def principal_of(raw: Redis, stream_id: str) -> str:
    principal: bytes = await raw.hget(Keys("bargein:").meta(stream_id), "principal")
    return principal.decode()


@pytest.mark.parametrize("loss", list(LOSSES))
async def test_stream_resume_past_the_loss_in_a_dead_nodes_stream_is_refused(
    redis_node: EmbeddedServer, redis_server: str, raw: Redis, loss: str
) -> None:
    """The takeover cannot continue a stream without its whole prefix: the
    resume that needs none of the lost tokens still gets ``stream_truncated``
    at once, not a wait for tokens nobody will write."""
    conn = await Conn.open(redis_node.ws_url)
    try:
        created = await conn.create(PROMPT, max_tokens=2, temperature=0)
        await conn.read(Received())
        principal = await principal_of(raw, created["stream_id"])
        stream_id = await ghost_stream(redis_server, principal, loss)
        token = make_resume_token(redis_node.state.service.secret, stream_id, principal)
        async with asyncio.timeout(ANSWER_WITHIN_S):
            await conn.resume(stream_id, token, 6)
            events = [await conn.recv()]
            while events[-1]["type"] == "response.delta":
                events.append(await conn.recv())
        assert events[-1]["type"] == "error" and events[-1]["code"] == "stream_truncated", events
        assert events[-1]["retryable"] is False
        assert len(events) == 1  # the stream was ended before the delivery began: no deltas
    finally:
        await conn.close()


@pytest.mark.parametrize("loss", list(LOSSES))
async def test_sse_resume_past_the_loss_in_a_dead_nodes_stream_is_refused(
    redis_node: EmbeddedServer, redis_server: str, raw: Redis, loss: str
) -> None:
    async with httpx.AsyncClient(base_url=redis_node.http_url, headers=AUTH, timeout=60) as http:
        body = {"model": "bargein", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2}
        first = await http.post("/v1/chat/completions", json=body)
        principal = await principal_of(raw, first.headers["x-bargein-stream-id"])
        stream_id = await ghost_stream(redis_server, principal, loss)
        async with asyncio.timeout(ANSWER_WITHIN_S):
            answer = await http.get(
                f"/v1/streams/{stream_id}/events", headers={"Last-Event-ID": f"{stream_id}:8"}
            )
        assert answer.status_code == 410, answer.text
        assert answer.json()["error"]["code"] == "stream_truncated"
