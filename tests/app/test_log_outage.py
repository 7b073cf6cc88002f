"""A token-log outage fails the events that needed the log, never the connection.

A node on its own redis-server (this test stops that server with SIGSTOP: a
hung Redis, connections open, nothing answers), sharing ``live_server``'s
engine loop. While Redis hangs, a ``stream.resume`` and a
``response.cancel`` of a finished response both need the log: each is
answered with a retryable ``internal_error`` that echoes its ``event_id``
(and ``response_id``), while another stream of the same connection goes on
being delivered. Once Redis answers again, the same connection resumes,
cancels and generates as before.

The client is a raw socket with a small receive window (tests/app/rawws.py)
on a node with a small send buffer: one large ``session.updated`` fills the
buffers, so the other stream's delivery is still waiting to write when the
log fails; the client reads only once the server has answered the resume.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from bargein.session.streams.log.redis_format import Keys
from loadtests.redis_server import RedisServer, redis_server_binary
from tests.app.conftest import LiveServer, node_on_engine
from tests.app.log_capture import Records, server_log
from tests.app.rawws import ServerFrames, masked_text, raw_upgrade
from tests.waiting import HANG_GUARD_S, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]

BIG_INSTRUCTIONS = "x" * (256 * 1024)  # its session.updated alone passes every buffer


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this module alone: it is stopped in the middle of a test."""
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (make test installs Debian's redis-server)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def outage_node(live_server: LiveServer, own_redis: RedisServer) -> Iterator[EmbeddedServer]:
    """A node on ``own_redis``; no keepalive pings and no 4008 (the raw client
    answers no ping and stops reading on purpose)."""
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=32),
            server=ServerConfig(
                port=0,
                log_level="warning",
                redis_url=own_redis.url,
                token_log_backend="redis",
                node_id="outage-a",
                ws_ping_interval_s=0,
                slow_client_timeout_s=0,
                debug_endpoints=True,
            ),
        ),
        sndbuf=8192,
    ) as server:
        yield server


@dataclass(slots=True)
class Stream:
    """What the client got of one response."""

    created: dict[str, Any]
    text: str = ""
    end: int = 0
    done: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)


class Client:
    """The raw connection: sends events, sorts what it reads by stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = ServerFrames(sock)
        self.streams: dict[str, Stream] = {}  # by response_id
        self.errors: dict[str, dict[str, Any]] = {}  # by event_id
        self.order: list[dict[str, Any]] = []  # every event read, in order

    def send(self, **event: Any) -> None:
        self.sock.sendall(masked_text(json.dumps(event).encode()))

    def read_until(self, done: Callable[[], bool]) -> list[dict[str, Any]]:
        """Read events until ``done()``; return those not about a stream."""
        others = []
        while not done():
            event = self.frames.event()
            self.order.append(event)
            kind, response_id = event["type"], event.get("response_id")
            if kind == "response.created":
                self.streams[response_id] = Stream(created=event)
            elif kind == "response.delta":
                stream = self.streams[response_id]
                assert event["start"] == stream.end, (event, stream)  # no gap, no repeat
                stream.text, stream.end = stream.text + event["text"], event["end"]
            elif kind == "response.done" and response_id in self.streams:
                self.streams[response_id].done = event
            elif kind == "error" and event.get("event_id") is not None:
                self.errors[event["event_id"]] = event
            elif kind == "error" and response_id in self.streams:
                self.streams[response_id].errors.append(event)
            else:
                others.append(event)
        return others

    def create(self, prompt: str, **params: Any) -> Stream:
        """Send a ``response.create`` and read its answer to ``response.done``."""
        before = set(self.streams)
        self.send(type="response.create", input=[{"role": "user", "content": prompt}], **params)
        others = self.read_until(lambda: bool(set(self.streams) - before))
        assert not others, others  # a refusal would be an error here
        (new,) = set(self.streams) - before
        stream = self.streams[new]
        self.read_until(lambda: stream.done is not None)
        return stream

    def resume(self, stream: Stream, from_: int, event_id: str) -> None:
        self.send(
            type="stream.resume",
            stream_id=stream.created["stream_id"],
            resume_token=stream.created["resume_token"],
            event_id=event_id,
            **{"from": from_},
        )


def _log_failure_answered(log: Records) -> bool:
    """The server gave up on the log for an event: it answered it (fixed) or
    failed the whole connection (the bug this test guards against)."""
    return any(
        r.name == "bargein.session.runtime.connection"
        and "token log" in r.getMessage()
        or r.getMessage() == "connection failed"
        for r in log.records
    )


async def _wait_logged_to_end(node: EmbeddedServer, redis_url: str, num_before: int) -> None:
    """The next request submitted after ``num_before`` ones has its finish in
    Redis (so resuming it later never waits for a write lost in the outage)."""
    service = node.state.service
    assert service is not None
    await wait_until(lambda: len(service.recent_requests) > num_before, "the answer submitted", poll_s=0.05)
    stream_id = service.recent_requests[num_before].request_id  # the stream's id
    meta = Keys("bargein:").meta(stream_id)  # the server's default key prefix
    with redis.Redis.from_url(redis_url) as raw:
        await wait_until(
            lambda: raw.hget(meta, "status") == b"complete", "the stream logged to its end", poll_s=0.05
        )


async def test_a_log_outage_fails_the_event_and_keeps_the_connection(
    live_server: LiveServer, outage_node: EmbeddedServer, own_redis: RedisServer
) -> None:
    sock = raw_upgrade(outage_node.port, rcvbuf=4096)
    sock.settimeout(HANG_GUARD_S)
    client = Client(sock)
    try:
        assert client.frames.event()["type"] == "session.created"
        first = client.create("Count from one to five.", max_tokens=8, temperature=0.0)
        # A second answer, then one update whose answer fills the buffers: the
        # second stream's delivery waits to write while the client reads nothing.
        assert outage_node.state.service is not None
        num_before = len(outage_node.state.service.recent_requests)
        client.send(
            type="response.create",
            max_tokens=48,
            temperature=0.0,
            input=[{"role": "user", "content": "Name ten rivers of Europe."}],
        )
        client.send(type="session.update", session={"instructions": BIG_INSTRUCTIONS})
        await _wait_logged_to_end(outage_node, own_redis.url, num_before)
        with server_log("bargein", "bargein.session.runtime.connection", level=logging.WARNING) as log:
            own_redis.pause()
            try:
                client.resume(first, 0, event_id="resume-in-outage")
                await wait_until(lambda: _log_failure_answered(log), "the resume to fail", poll_s=0.05)
                # Now the client reads: the update's answer, the second stream, the error.
                others = client.read_until(lambda: "resume-in-outage" in client.errors)
                client.send(
                    type="response.cancel",
                    response_id=first.created["response_id"],
                    event_id="cancel-in-outage",
                )
                client.read_until(lambda: "cancel-in-outage" in client.errors)
            finally:
                own_redis.resume()
        (second,) = (s for s in client.streams.values() if s is not first)
        assert [e["type"] for e in others] == ["session.updated"]
        for event_id, response_id in (
            ("resume-in-outage", None),
            ("cancel-in-outage", first.created["response_id"]),
        ):
            error = client.errors[event_id]
            assert (error["code"], error["retryable"]) == ("internal_error", True), error
            assert error.get("response_id") == response_id, error
        # The second stream's delivery was still waiting to write when the resume
        # failed, and that did not cut it: it ended after the resume's error, on
        # its own terms (done, or its own retryable error if the log failed it too).
        failed_at = client.order.index(client.errors["resume-in-outage"])
        ended = second.done if second.done is not None else second.errors[0]
        assert client.order.index(ended) > failed_at
        assert second.done is not None or [e["code"] for e in second.errors] == ["internal_error"], second
        # Redis is back: the same connection resumes, cancels and generates.
        if second.done is None:
            client.resume(second, second.end, event_id="resume-second")
            client.read_until(lambda: second.done is not None)
        assert second.done is not None and second.end == second.done["end"]
        replay = Stream(created=first.created)
        client.streams[first.created["response_id"]] = replay
        client.resume(replay, 0, event_id="resume-after")
        client.read_until(lambda: replay.done is not None)
        assert replay.text == first.text and replay.done == first.done
        client.send(type="session.update", session={"instructions": ""})  # fits the context
        assert client.frames.event()["type"] == "session.updated"
        third = client.create("Say hello.", max_tokens=4, temperature=0.0)
        assert third.done is not None and third.done["end"] >= 1
        assert set(client.errors) == {"resume-in-outage", "cancel-in-outage"}
    finally:
        sock.close()


async def test_every_503_says_when_to_retry(outage_node: EmbeddedServer, own_redis: RedisServer) -> None:
    """A request the log fails (a new completion, a stream's events) is a 503
    with ``Retry-After``, as admission's refusals are (RFC 9110)."""
    body = {"model": "bargein", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=outage_node.http_url, timeout=HANG_GUARD_S) as http:
        own_redis.pause()
        try:
            answers = [
                await http.post("/v1/chat/completions", json=body),
                await http.get("/v1/streams/some-stream/events"),
            ]
        finally:
            own_redis.resume()
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert answer.json()["error"]["code"] == "internal_error"
