"""Two ``bargein serve`` processes on one redis-server, started WITHOUT ``--secret``
(issue 16): they share the resume-token key kept in Redis, a restarted node
still accepts the tokens it gave out, and a node paused past its lease (a
zombie) never writes the stream another node took over.

The node helpers are those of tests/app/test_multinode.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.app.test_multinode import (
    Node,
    Reader,
    contiguous,
    create,
    resume,
    start_node,
    stop_nodes,
    wait_ready,
)
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture(scope="module")
def log_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="bargein-cluster-faults-") as path:
        yield path


@pytest.fixture(scope="module")
def nodes(redis_server: str, log_dir: str) -> Iterator[dict[str, Node]]:
    """Nodes ``x`` and ``y`` without ``--secret`` (default key prefix)."""
    started = {name: start_node(name, redis_server, log_dir, secret=None) for name in "xy"}
    try:
        for node in started.values():
            wait_ready(node)
        yield started
    finally:
        stop_nodes(started.values())


async def open_session(url: str) -> tuple[Reader, dict[str, Any]]:
    """A new connection and its ``session.created``."""
    reader = Reader(await connect(url, subprotocols=["bargein.v1.json"]))  # type: ignore[list-item]
    return reader, await reader.next_event()


async def session_resume(url: str, created: dict[str, Any]) -> dict[str, Any]:
    """``session.resume`` of ``created``'s session on a new connection: the answer
    (asked again while it is ``not_found``: the session is saved as its
    connection closes, maybe after the ask)."""

    async def answered() -> dict[str, Any] | None:
        reader, _ = await open_session(url)
        await reader.ws.send(
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "session_token": created["session_token"],
                }
            )
        )
        answer: dict[str, Any] = json.loads(await asyncio.wait_for(reader.ws.recv(), HANG_GUARD_S))
        await reader.ws.close()
        return None if answer.get("code") == "not_found" else answer

    return await wait_until_async(answered, "the saved session", poll_s=0.2)


async def test_nodes_without_a_secret_accept_each_others_tokens(nodes: dict[str, Node]) -> None:
    x, y = nodes["x"], nodes["y"]
    on_x, created = await create(x.ws_url)
    on_y = await resume(y.ws_url, created, 0)  # forbidden if y had a key of its own
    done_y, done_x = await asyncio.gather(on_y.until_done(), on_x.until_done())
    assert on_y.text == on_x.text and done_y["end"] == done_x["end"]
    await on_x.ws.close()
    await on_y.ws.close()
    answer = await session_resume(y.ws_url, on_x.events[0])  # x's session.created
    assert answer["type"] == "session.resumed", answer


def raw_log(
    redis_url: str, stream_id: str
) -> tuple[list[tuple[int, int]], list[tuple[int, str]], dict[bytes, bytes]]:
    """The stream as Redis holds it: entries ``(start, end)`` and finishes
    ``(end, finish_reason)`` in log order, and the metadata hash."""
    entries: list[tuple[int, int]] = []
    finishes: list[tuple[int, str]] = []
    with Redis.from_url(redis_url) as redis:
        for rid, fields in redis.xrange(f"bargein:{{{stream_id}}}:log"):
            end, seq = (int(part) for part in rid.split(b"-"))
            if seq == 1:
                finishes.append((end, fields[b"f"].decode()))
            else:
                entries.append((struct.unpack_from("<I", fields[b"d"])[0], end))
        meta = redis.hgetall(f"bargein:{{{stream_id}}}:meta")
    return entries, finishes, meta


def lease_holder(redis_url: str, stream_id: str) -> bytes | None:
    with Redis.from_url(redis_url) as redis:
        holder: bytes | None = redis.get(f"bargein:{{{stream_id}}}:lease")
    return holder


async def events_until_quiet(reader: Reader) -> list[dict[str, Any]]:
    """What ``reader``'s connection gets until it closes or stays silent 5 s."""
    events: list[dict[str, Any]] = []
    while True:
        try:
            events.append(json.loads(await asyncio.wait_for(reader.ws.recv(), 5)))
        except (TimeoutError, ConnectionClosed):
            return events


async def test_a_node_paused_past_its_lease_never_writes_the_stream_taken_over(
    nodes: dict[str, Node], redis_server: str
) -> None:
    x, y = nodes["x"], nodes["y"]
    takeovers = y.debug()["cluster"]["takeovers"]
    on_x, created = await create(x.ws_url)
    sid = created["stream_id"]
    await on_x.until_end(20)
    x.proc.send_signal(signal.SIGSTOP)  # a long GC pause, a partition: x does not know
    try:
        await wait_until(lambda: lease_holder(redis_server, sid) is None, "x's lease expired", poll_s=0.1)
        on_y = await resume(y.ws_url, created, on_x.end)
        await wait_until(
            lambda: y.debug()["cluster"]["takeovers"] == takeovers + 1, "y took the stream over", poll_s=0.1
        )
        await on_y.ws.send(json.dumps({"type": "response.cancel", "response_id": created["response_id"]}))
        done = await on_y.until_done()
        assert done["finish_reason"] == "interrupted" and contiguous(on_y.deltas, on_x.end)
        # y released the lease of the ended stream: nobody holds it when x wakes.
        await wait_until(lambda: lease_holder(redis_server, sid) is None, "y released its lease", poll_s=0.1)
    finally:
        x.proc.send_signal(signal.SIGCONT)
    await wait_until(lambda: x.engine()["num_running"] == 0, "x stopped generating", poll_s=0.1)
    seen_on_x = await events_until_quiet(on_x)

    entries, finishes, meta = raw_log(redis_server, sid)
    assert finishes == [(done["end"], "interrupted")], "x wrote after the takeover"
    assert entries[-1][1] == done["end"] and [s for s, _ in entries] == [0] + [e for _, e in entries[:-1]], (
        "entries not contiguous"
    )
    assert meta[b"end"] == str(done["end"]).encode() and meta[b"owner_node"] == b"y"
    assert meta[b"finish_reason"] == b"interrupted"
    # x's client never hears an end the log contradicts; it is told to resume.
    assert all(e["type"] != "response.done" or e["end"] == done["end"] for e in seen_on_x)
    stats = x.engine()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "x kept the KV blocks"
    await on_x.ws.close()
    await on_y.ws.close()


async def test_a_restarted_node_accepts_the_tokens_it_gave_out(
    nodes: dict[str, Node], redis_server: str, log_dir: str
) -> None:
    x = nodes["x"]
    on_x, session = await open_session(x.ws_url)
    await on_x.ws.send(
        json.dumps(
            {
                "type": "response.create",
                "max_tokens": 8,
                "temperature": 0,
                "input": [{"role": "user", "content": "Say hi."}],
            }
        )
    )
    created = await on_x.next_event()
    assert created["type"] == "response.created", created
    await on_x.until_done()
    await on_x.ws.close()
    x.proc.terminate()
    x.proc.wait(timeout=60)
    nodes["x"] = x = start_node("x", redis_server, log_dir, secret=None)
    wait_ready(x)
    replay = await resume(x.ws_url, created, 0)  # forbidden under a new random key
    assert (await replay.until_done())["end"] == on_x.done["end"]  # type: ignore[index]
    assert replay.text == on_x.text
    await replay.ws.close()
    answer = await session_resume(x.ws_url, session)
    assert answer["type"] == "session.resumed", answer
