"""Three ``bargein serve`` processes on one redis-server (issue 11).

Node A generates; node B serves resumes and cancels of A's streams, and takes
a stream over when A dies (SIGKILL) or when C shuts down (SIGTERM). Each node
loads the bundled model, once for the module. Engine counters come from each
node's ``/debug/engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from redis import Redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from loadtests.redis_server import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PROMPT = "Write a long story about a brave knight who meets a dragon in the mountains."
MAX_TOKENS = 160
LEASE_TTL_S = 2.0
SECRET = "multinode-test-secret"


@dataclass(slots=True)
class Node:
    """One ``bargein serve`` subprocess."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: str

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def engine(self) -> dict[str, Any]:
        """The node's ``/debug/engine`` stats."""
        stats: dict[str, Any] = self.debug()["stats"]
        return stats

    def debug(self) -> dict[str, Any]:
        """The node's whole ``/debug/engine`` answer."""
        body: dict[str, Any] = httpx.get(f"{self.http_url}/debug/engine", timeout=10).json()
        return body


def start_node(
    name: str, redis_url: str, log_dir: str, *, secret: str | None = SECRET, port: int | None = None
) -> Node:
    """Start ``bargein serve`` as node ``name`` (``secret=None``: no ``--secret``,
    the nodes share the key kept in Redis); its output goes to ``<log_dir>/<name>.log``
    (appended to, so a restarted node keeps one log)."""
    port = port or free_port()
    log_path = os.path.join(log_dir, f"{name}.log")
    key = [] if secret is None else ["--secret", secret]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bargein",
                "serve",
                "--port",
                str(port),
                "--redis-url",
                redis_url,
                "--node-id",
                name,
                *key,
                "--debug-endpoints",
                "true",
                "--lease-ttl",
                str(LEASE_TTL_S),
                "--max-model-len",
                "1024",
                "--max-tokens",
                "256",
                "--max-num-seqs",
                "8",
                "--log-level",
                "warning",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Node(name=name, port=port, proc=proc, log_path=log_path)


def wait_ready(node: Node, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"node {node.name} exited: {open(node.log_path).read()[-3000:]}")
        try:
            if httpx.get(f"{node.http_url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"node {node.name} not ready: {open(node.log_path).read()[-3000:]}")


@pytest.fixture(scope="module")
def nodes(redis_server: str) -> Iterator[dict[str, Node]]:
    """Nodes ``a``, ``b`` and ``c`` sharing the test redis-server (default key prefix)."""
    with tempfile.TemporaryDirectory(prefix="bargein-multinode-") as log_dir:
        started = {name: start_node(name, redis_server, log_dir) for name in ("a", "b", "c")}
        try:
            for node in started.values():
                wait_ready(node)
            yield started
        finally:
            stop_nodes(started.values())


def stop_nodes(nodes: Iterable[Node]) -> None:
    """SIGTERM every node still running (SIGCONT first: a paused one cannot
    handle it), then wait; SIGKILL what does not exit in 20 s."""
    nodes = list(nodes)
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGCONT)
            node.proc.terminate()
    for node in nodes:
        try:
            node.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()


@dataclass(slots=True)
class Reader:
    """What one connection received of one stream."""

    ws: ClientConnection
    deltas: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(d["text"] for d in self.deltas)

    @property
    def end(self) -> int:
        return self.deltas[-1]["end"] if self.deltas else 0

    async def next_event(self, timeout_s: float = 120) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), timeout_s))
        self.events.append(event)
        if event["type"] == "response.delta":
            self.deltas.append(event)
        elif event["type"] == "response.done":
            self.done = event
        elif event["type"] == "error":
            raise AssertionError(f"server error: {event}")
        return event

    async def until_end(self, end: int) -> None:
        while self.end < end and self.done is None:
            await self.next_event()

    async def until_done(self) -> dict[str, Any]:
        while self.done is None:
            await self.next_event()
        return self.done


async def create(url: str) -> tuple[Reader, dict[str, Any]]:
    """Open a session and start the long greedy answer; returns its ``response.created``."""
    reader = Reader(await connect(url, subprotocols=["bargein.v1.json"]))  # type: ignore[list-item]
    await reader.next_event()  # session.created
    await reader.ws.send(
        json.dumps(
            {
                "type": "response.create",
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "input": [{"role": "user", "content": PROMPT}],
            }
        )
    )
    while True:
        event = await reader.next_event()
        if event["type"] == "response.created":
            return reader, event


async def resume(url: str, created: dict[str, Any], from_: int) -> Reader:
    reader = Reader(await connect(url, subprotocols=["bargein.v1.json"]))  # type: ignore[list-item]
    await reader.next_event()  # session.created
    await reader.ws.send(
        json.dumps(
            {
                "type": "stream.resume",
                "stream_id": created["stream_id"],
                "resume_token": created["resume_token"],
                "from": from_,
            }
        )
    )
    event = await reader.next_event()
    assert event["type"] == "stream.resumed", event
    return reader


def contiguous(deltas: list[dict[str, Any]], start: int) -> bool:
    """Each delta starts where the previous one ended (no gap, no duplicate)."""
    ends = [start] + [d["end"] for d in deltas]
    return all(d["start"] == e for d, e in zip(deltas, ends)) and all(d["end"] > d["start"] for d in deltas)


async def test_a_resume_on_another_node_replays_and_follows_without_generating(
    nodes: dict[str, Node],
) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(10)
    generated_on_b = b.engine()["num_generated_tokens"]
    on_b = await resume(b.ws_url, created, 0)
    done_b, done_a = await asyncio.gather(on_b.until_done(), on_a.until_done())
    assert on_b.text == on_a.text and on_b.end == on_a.end == done_b["end"] == done_a["end"]
    assert contiguous(on_b.deltas, 0) and contiguous(on_a.deltas, 0)
    assert done_b["finish_reason"] == done_a["finish_reason"] in ("stop", "length")
    assert b.engine()["num_generated_tokens"] == generated_on_b, "B generated tokens"
    await on_a.ws.close()
    await on_b.ws.close()


async def test_a_cancel_on_another_node_frees_the_owners_blocks(nodes: dict[str, Node]) -> None:
    a, b = nodes["a"], nodes["b"]
    interrupted_before = a.engine()["num_finished_by_reason"].get("interrupted", 0)
    on_a, created = await create(a.ws_url)
    await on_a.until_end(5)
    on_b = await resume(b.ws_url, created, on_a.end)
    await on_b.ws.send(json.dumps({"type": "response.cancel", "response_id": created["response_id"]}))
    done_b, done_a = await asyncio.gather(on_b.until_done(), on_a.until_done())
    assert done_b["finish_reason"] == done_a["finish_reason"] == "interrupted"
    assert done_b["end"] == done_a["end"] < MAX_TOKENS
    stats = a.engine()
    assert stats["num_finished_by_reason"]["interrupted"] == interrupted_before + 1
    assert stats["num_running"] == 0 and stats["num_free_blocks"] == stats["num_total_blocks"]
    await on_a.ws.close()
    await on_b.ws.close()


async def test_an_http_cancel_on_another_node_interrupts_the_stream(nodes: dict[str, Node]) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(5)
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(f"{b.http_url}/v1/streams/{created['stream_id']}/cancel")
    assert answer.status_code == 200, answer.text
    assert answer.json()["finish_reason"] == "interrupted"
    assert (await on_a.until_done())["finish_reason"] == "interrupted"
    await on_a.ws.close()


@pytest.fixture(scope="module")
def reference(nodes: dict[str, Node]) -> Reader:
    """The prompt's answer on B, uninterrupted (greedy)."""

    async def answer() -> Reader:
        reader, _ = await create(nodes["b"].ws_url)
        await reader.until_done()
        await reader.ws.close()
        return reader

    reader = asyncio.run(answer())
    assert reader.end > 60, "the reference answer is too short to stop a node mid-answer"
    return reader


async def test_a_node_shutting_down_hands_its_streams_to_the_node_they_resume_on(
    nodes: dict[str, Node], reference: Reader
) -> None:
    b, c = nodes["b"], nodes["c"]
    takeovers = b.debug()["cluster"]["takeovers"]
    on_c, created = await create(c.ws_url)
    await on_c.until_end(25)
    c.proc.send_signal(signal.SIGTERM)  # a rolling restart: no "cancelled" for the user
    with contextlib.suppress(ConnectionClosed):
        await on_c.until_done()
    assert on_c.done is None, "the shutdown ended the stream"
    # This client resumes over HTTP (SSE), from the offset it had.
    text, ends, finish_reason = await sse_resume(b, created["stream_id"], on_c.end)
    assert on_c.text + text == reference.text
    assert contiguous(on_c.deltas, 0) and ends == sorted(set(ends)) and ends[0] > on_c.end
    assert ends[-1] == reference.end and finish_reason == reference.done["finish_reason"]
    assert b.debug()["cluster"]["takeovers"] == takeovers + 1
    assert c.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    await on_c.ws.close()


async def engine_idle(node: Node) -> None:
    """Until ``node``'s engine runs and queues nothing (the hang guard fails the test).

    Its generated-token counter is node-wide: a stream an earlier test left
    to it (a takeover during a primary failover finishes on its own time)
    would count into the next test's tokens."""

    def idle() -> bool:
        stats = node.engine()
        return stats["num_running"] == 0 and stats["num_waiting"] == 0

    await wait_until(idle, f"{node.name}'s engine to run nothing (an earlier test's stream)", poll_s=0.2)


async def check_killed_owner_is_continued(
    a: Node, b: Node, reference: Reader, last_logged_offset: Callable[[str], int]
) -> None:
    """A answers the reference prompt and is SIGKILLed after 25 tokens; a
    resume on B continues the stream from its log: the text is the
    reference's, B generates exactly the tokens past the last logged offset
    (``last_logged_offset(stream_id)``) and counts one takeover."""
    await engine_idle(b)
    takeovers = b.debug()["cluster"]["takeovers"]
    on_a, created = await create(a.ws_url)
    on_b: Reader | None = None
    try:
        await on_a.until_end(25)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=10)
        seen_end, seen_text = on_a.end, on_a.text
        last_logged = last_logged_offset(created["stream_id"])
        assert seen_end <= last_logged < reference.end, "A must die mid-answer"
        generated_on_b = b.engine()["num_generated_tokens"]
        on_b = await resume(b.ws_url, created, seen_end)
        done = await on_b.until_done()
        assert seen_text + on_b.text == reference.text
        assert contiguous(on_b.deltas, seen_end)
        assert done["end"] == reference.end and done["finish_reason"] == reference.done["finish_reason"]
        assert done["usage"]["completion_tokens"] == reference.end
        assert b.engine()["num_generated_tokens"] - generated_on_b == reference.end - last_logged
        assert b.debug()["cluster"]["takeovers"] == takeovers + 1
    finally:  # a failed assertion must not leak the sockets into the next test's warnings
        await on_a.ws.close()
        if on_b is not None:
            await on_b.ws.close()


async def test_when_the_owner_is_killed_the_resuming_node_continues_the_stream_exactly(
    nodes: dict[str, Node], reference: Reader, redis_server: str
) -> None:
    await check_killed_owner_is_continued(
        nodes["a"], nodes["b"], reference, lambda stream_id: last_logged_offset(redis_server, stream_id)
    )


async def sse_resume(node: Node, stream_id: str, from_: int) -> tuple[str, list[int], str]:
    """``GET /v1/streams/{id}/events?from=``: the text, each chunk's end, the finish reason."""
    text, ends, finish_reason = "", [], ""
    url = f"{node.http_url}/v1/streams/{stream_id}/events?from={from_}"
    async with httpx.AsyncClient(timeout=120) as http, http.stream("GET", url) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            if line.startswith("id: "):
                ends.append(int(line.rpartition(":")[2]))
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text += choice["delta"].get("content", "")
            finish_reason = choice.get("finish_reason") or finish_reason
    return text, ends, finish_reason


def last_logged_offset(redis_url: str, stream_id: str) -> int:
    """End offset of the newest entry of the stream's Redis log (ids are ``<end>-0``)."""
    with Redis.from_url(redis_url) as redis:
        newest = redis.xrevrange(f"bargein:{{{stream_id}}}:log", "+", "-", count=1)
    return int(newest[0][0].split(b"-")[0]) if newest else 0
