"""Backpressure: clients that do not read cost no memory and slow nobody down; stuck ones get 4008.

The silent clients of the end-to-end test fill their buffers for sure (a
4 KiB kernel send buffer, a 4 KiB receive window, one 96 KiB update answered
after the answer began): its asserts see every one of them held back, not
ten answers that fit in the kernel's buffers whether or not the server pushes back.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from bargein.app import outgoing
from bargein.app.embedded import EmbeddedServer
from bargein.app.outgoing import Outgoing
from bargein.app.settings import ServerConfig, Settings
from bargein.client.realtime_client import RealtimeClient
from bargein.protocol import CloseCode
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from tests.app.conftest import LiveServer, node_on_engine
from tests.app.rawws import masked_text, raw_upgrade
from tests.waiting import wait_until, wait_until_sync

NUM_SILENT = 10
PROMPT = "Name three colours."
# What waits in a silent client's writer: one delta of each of its senders, not
# its answer (about 10 KB of deltas are still to go when its buffers fill).
MAX_QUEUED_BYTES = 2048
# One session.update, sent after the response.create, is answered with these
# instructions echoed: more than the kernel's small buffers plus asyncio's
# 64 KiB high-water mark hold, so the answer's deltas find the socket full.
FILLER = "x" * (96 * 1024)


@pytest.fixture
def small_buffers(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """A node on live_server's engine with a small kernel send buffer (4 KiB):
    its buffers toward a silent client fill at a known size."""
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=32),
            server=ServerConfig(port=0, log_level="warning"),
        ),
        sndbuf=4096,
    ) as server:
        yield server


def _silent_client(server: EmbeddedServer) -> tuple[socket.socket, Outgoing]:
    """A client that asks for a long answer and one big update, then never
    reads a byte; with the server's writer of its connection."""
    before = set(server.state.writers)
    sock = raw_upgrade(server.port, rcvbuf=4096)
    create = json.dumps(
        {
            "type": "response.create",
            "max_tokens": 64,
            "input": [{"role": "user", "content": "Tell me a long story."}],
        }
    ).encode()
    update = json.dumps({"type": "session.update", "session": {"instructions": FILLER}})
    sock.sendall(masked_text(create) + masked_text(update.encode()))
    (writer,) = wait_until_sync(lambda: set(server.state.writers) - before, "the connection to open")
    return sock, writer


async def _read_an_answer(url: str) -> None:
    async with RealtimeClient(url) as client:
        await client.chat("Tell me a long story.", max_tokens=64)


@pytest.mark.slow
async def test_clients_that_never_read_leave_memory_flat_and_others_unaffected(
    live_server: LiveServer, small_buffers: EmbeddedServer
) -> None:
    server = small_buffers
    async with RealtimeClient(server.ws_url) as client:
        baseline = await client.chat(PROMPT, max_tokens=24, temperature=0.0)
    # The engine's first batch of this size grows its buffers: not the cost of
    # silent clients, so it happens before the baseline.
    await asyncio.gather(*(_read_an_answer(server.ws_url) for _ in range(NUM_SILENT + 1)))
    await live_server.wait_idle()
    gc.collect()
    rss_before = psutil.Process().memory_info().rss
    silent: list[tuple[socket.socket, Outgoing]] = []
    try:
        for _ in range(NUM_SILENT):
            silent.append(_silent_client(server))
        async with RealtimeClient(server.ws_url) as client:  # while ten clients read nothing
            during = await client.chat(PROMPT, max_tokens=24, temperature=0.0)
        stats = await live_server.wait_idle(timeout_s=180)
        # Every silent client's answer is generated: its delivery waits on a
        # full socket (over the bound), or its 4008 came (over it too long).
        blocked = [writer.too_slow.is_set() or writer.over_bound() for _, writer in silent]
        queued = [writer.queued_bytes for _, writer in silent]
        gc.collect()
        rss_after = psutil.Process().memory_info().rss
    finally:
        for sock, _ in silent:
            sock.close()
    assert all(blocked), blocked  # backpressure was in play for every one of them
    assert max(queued) <= MAX_QUEUED_BYTES, queued  # ... and held their answers back
    assert during == baseline  # the other session got its full, identical answer
    # Generation ran to the end for everyone, and every KV block is free again
    # although ten clients have read none of their answers.
    assert stats.num_free_blocks == stats.num_total_blocks
    growth_mib = (rss_after - rss_before) / 2**20
    assert growth_mib < 32, f"RSS grew by {growth_mib:.1f} MiB"


class StuckSocket:
    """A WebSocket whose client stopped reading: sends never complete."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.closed_with: int | None = None
        self.close_tried: int | None = None
        self.unblock = asyncio.Event()

    async def send_text(self, data: str) -> None:
        self.sent.append(data)
        if len(self.sent) > 2:  # the transport takes two frames, then is full
            await self.unblock.wait()

    async def send_bytes(self, data: bytes) -> None:
        await self.send_text(data.decode())

    async def close(self, code: int = 1000) -> None:
        self.close_tried = code
        if self.unblock.is_set():
            self.closed_with = code
            return
        await self.unblock.wait()  # the close frame queues behind the stuck data


class WatchedClock:
    """The writer's clock, moved by hand. It counts the watchdog's reads, so a
    test can wait until the watchdog has looked at the time it set (its pacing
    sleeps stay real; its decisions use this clock only). The writer task reads
    it too, at each frame: those reads are not looks."""

    def __init__(self) -> None:
        self.now = 0.0
        self.looks = 0

    def __call__(self) -> float:
        task = asyncio.current_task()
        if task is not None and task.get_name() == "ws-slow-watchdog":  # see Outgoing
            self.looks += 1
        return self.now

    async def next_look(self) -> None:
        """Wait until the watchdog read the clock once more."""
        seen = self.looks
        await wait_until(lambda: self.looks > seen, "the watchdog to look again", poll_s=0.005)


SLOW_S = 0.3  # the writer's slow_timeout_s: its watchdog ticks every SLOW_S / 8


async def test_a_client_stuck_over_its_bound_is_flagged_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws, clock = StuckSocket(), WatchedClock()
    out = Outgoing(
        ws,
        "json",
        max_bytes=4096,
        slow_timeout_s=SLOW_S,  # type: ignore[arg-type]
        clock=clock,
    )
    sender = asyncio.create_task(_send_forever(out))
    await wait_until(
        out.over_bound, "the writer over its bound", poll_s=0.005
    )  # the third frame's write never returns
    clock.now += 0.05  # past a tick: the write is stalled, over the bound from here
    await clock.next_look()
    clock.now += SLOW_S - 0.01  # just short of the timeout, on the writer's clock
    for _ in range(3):  # looked at it, more than once: still not flagged
        await clock.next_look()
    assert not out.too_slow.is_set()
    clock.now += 0.02  # now over the bound for longer than the timeout
    await asyncio.wait_for(out.too_slow.wait(), timeout=30)  # a hang guard
    assert out.over_bound()
    sender.cancel()
    # The close frame cannot get through a full buffer: close gives up after
    # CLOSE_TIMEOUT_S (shortened here) instead of waiting for the client.
    monkeypatch.setattr(outgoing, "CLOSE_TIMEOUT_S", 0.2)
    await asyncio.wait_for(out.close(CloseCode.CLIENT_TOO_SLOW), timeout=30)
    assert ws.close_tried == CloseCode.CLIENT_TOO_SLOW and ws.closed_with is None
    await out.send(pe.Pong())  # after close: returns at once, queues nothing
    assert out.queued_bytes == 0


async def test_a_slow_but_moving_client_is_not_flagged() -> None:
    ws, clock = StuckSocket(), WatchedClock()
    out = Outgoing(
        ws,
        "json",
        max_bytes=4096,
        slow_timeout_s=SLOW_S,  # type: ignore[arg-type]
        clock=clock,
    )
    sender = asyncio.create_task(_send_forever(out))
    for _ in range(8):  # the client takes a frame every 0.1 s of the writer's clock
        await wait_until(out.over_bound, "the writer over its bound", poll_s=0.005)
        sent = len(ws.sent)
        clock.now += 0.1  # stalled for a while (over a tick): over the bound
        await clock.next_look()
        ws.unblock.set()
        # the next frame's write began
        await wait_until(lambda sent=sent: len(ws.sent) > sent, "the next frame's write", poll_s=0.005)
        ws.unblock.clear()
        await clock.next_look()  # it saw the client move
    # 0.8 s over the bound in all, but never SLOW_S in one stretch
    assert not out.too_slow.is_set()
    ws.unblock.set()
    sender.cancel()
    await out.close(CloseCode.NORMAL)
    assert ws.closed_with == CloseCode.NORMAL


async def _send_forever(out: Outgoing) -> None:
    """A sender that keeps the writer busy (yielding: once closed, send returns at once)."""
    while True:
        await out.send(pe.Pong())
        await asyncio.sleep(0)
