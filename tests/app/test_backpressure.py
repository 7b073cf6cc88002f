"""Backpressure: clients that do not read cost no memory and slow nobody down; stuck ones get 4008."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from typing import Any

import psutil
import pytest

from app.client import RealtimeClient
from app.outgoing import CLOSE_TIMEOUT_S, Outgoing
from protocol import CloseCode
from protocol import events as pe
from tests.app.conftest import LiveServer
from tests.app.rawws import masked_text, raw_upgrade

NUM_SILENT = 10
PROMPT = "Name three colours."


@pytest.mark.slow
async def test_clients_that_never_read_leave_memory_flat_and_others_unaffected(
        live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        baseline = await client.chat(PROMPT, max_tokens=24, temperature=0.0)
    await live_server.wait_idle()
    gc.collect()
    rss_before = psutil.Process().memory_info().rss
    create = json.dumps({"type": "response.create", "max_tokens": 64, "input": [
        {"role": "user", "content": "Tell me a long story."}]}).encode()
    silent = [raw_upgrade(live_server.port, rcvbuf=4096) for _ in range(NUM_SILENT)]
    try:
        for sock in silent:
            sock.sendall(masked_text(create))  # ... and never read a byte again
        async with RealtimeClient(live_server.ws_url) as client:
            started = time.perf_counter()
            during = await client.chat(PROMPT, max_tokens=24, temperature=0.0)
            other_s = time.perf_counter() - started
        stats = await live_server.wait_idle(timeout_s=180)
        gc.collect()
        rss_after = psutil.Process().memory_info().rss
    finally:
        for sock in silent:
            sock.close()
    assert during == baseline  # the other session got its full, identical answer
    assert other_s < 60
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
        self.unblock = asyncio.Event()

    async def send_text(self, data: str) -> None:
        self.sent.append(data)
        if len(self.sent) > 2:  # the transport takes two frames, then is full
            await self.unblock.wait()

    async def send_bytes(self, data: bytes) -> None:
        await self.send_text(data.decode())

    async def close(self, code: int = 1000) -> None:
        if self.unblock.is_set():
            self.closed_with = code
            return
        await self.unblock.wait()  # the close frame queues behind the stuck data


async def test_a_client_stuck_over_its_bound_is_flagged_after_the_timeout() -> None:
    ws = StuckSocket()
    out = Outgoing(ws, "json", max_bytes=4096, slow_timeout_s=0.3)  # type: ignore[arg-type]
    sender = asyncio.create_task(_send_forever(out))
    started = time.monotonic()
    await asyncio.wait_for(out.too_slow.wait(), timeout=5)
    flagged_s = time.monotonic() - started
    assert 0.3 <= flagged_s < 1.5
    assert out.over_bound()
    sender.cancel()
    # The close frame cannot get through a full buffer: close gives up in bounded time.
    closing = time.monotonic()
    await out.close(CloseCode.CLIENT_TOO_SLOW)
    assert time.monotonic() - closing < CLOSE_TIMEOUT_S + 1
    await out.send(pe.Pong())  # after close: returns at once, queues nothing
    assert out.queued_bytes == 0


async def test_a_slow_but_moving_client_is_not_flagged() -> None:
    ws = StuckSocket()
    out = Outgoing(ws, "json", max_bytes=4096, slow_timeout_s=0.3)  # type: ignore[arg-type]
    sender = asyncio.create_task(_send_forever(out))
    for _ in range(8):  # the client reads a little every 0.1 s
        await asyncio.sleep(0.1)
        ws.unblock.set()
        await asyncio.sleep(0)
        ws.unblock.clear()
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
