"""Fault injection into a real server's long-lived tasks (issue 24): the step
writer and a delivery's reader raise where no error was expected. The node
recovers or says it is not ready (``/readyz`` 503 naming the task); every
affected response ends explicitly (an ``error`` event, then ``response.done``
with ``finish_reason`` ``error`` when the log could take that end), and its
KV blocks return to the pool. Never a hang, never a silent stop.

The cluster's tick, the abort listener and the Redis tailer are injected the
same way on a real redis-server in tests/session/test_cluster.py and
tests/session/test_supervise.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import LiveServer
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = pytest.mark.slow

_ids = itertools.count()


async def answer(client: RealtimeClient, *, until_error: bool = False) -> list[dict[str, Any]]:
    """``response.create``; its events up to ``response.done`` (or the first
    ``error``), bounded by the hang guard."""
    response_id = f"fault{next(_ids)}"
    await client.send(
        {
            "type": "response.create",
            "response_id": response_id,
            "input": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 32,
            "temperature": 0.0,
        }
    )
    events = []
    async with asyncio.timeout(HANG_GUARD_S):
        while True:
            event = await client._recv()
            if event.get("response_id") != response_id:
                continue
            events.append(event)
            if event["type"] == "response.done" or (until_error and event["type"] == "error"):
                return events


async def readyz(live_server: LiveServer) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live_server.http_url) as http:
        return await http.get("/readyz")


async def wait_for_ready(live_server: LiveServer) -> None:
    async def ready() -> bool:
        return (await readyz(live_server)).status_code == 200

    await wait_until_async(ready, "the node to be ready again", poll_s=0.1)


def raise_once(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that its first call raises RuntimeError (sync or async alike)."""
    calls = itertools.count()

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == 0:
            raise RuntimeError("injected fault")
        return real(*args, **kwargs)

    return wrapped


def assert_failed_explicitly(events: list[dict[str, Any]]) -> None:
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-2:] == ["error", "response.done"], kinds
    assert events[-2]["code"] == "internal_error" and events[-2]["retryable"] is True
    assert events[-1]["finish_reason"] == "error"


async def assert_blocks_free(live_server: LiveServer) -> None:
    stats = await live_server.wait_idle(HANG_GUARD_S)
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("target", ["log.write_step", "outputs.continued"])
async def test_a_step_writer_fault_ends_the_response_and_the_next_goes_through(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    service = live_server.state.service
    assert service is not None
    owner, name = (service.log, "write_step") if target.startswith("log") else (service._outputs, "continued")
    monkeypatch.setattr(owner, name, raise_once(getattr(owner, name)))
    async with RealtimeClient(live_server.ws_url, max_reconnects=0) as client:
        assert_failed_explicitly(await answer(client))  # used to hang: the writer was dead
        await assert_blocks_free(live_server)
        events = await answer(client)  # the writer restarted: the node serves
        assert events[-1]["finish_reason"] in ("stop", "length"), events[-1]
        assert any(e["type"] == "response.delta" for e in events)
    await wait_for_ready(live_server)


async def test_a_log_that_refuses_every_write_makes_the_node_unready(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = live_server.state.service
    assert service is not None
    real = service.log.write_step

    async def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected: every write fails")

    monkeypatch.setattr(service.log, "write_step", broken)
    async with RealtimeClient(live_server.ws_url, max_reconnects=0) as client:
        events = await answer(client, until_error=True)  # not even its error end fits the log
        assert events[-1]["type"] == "error" and events[-1]["retryable"] is True
        await assert_blocks_free(live_server)
        response = await readyz(live_server)
        assert response.status_code == 503
        assert any(
            line.startswith("token-log-writer: crashed (RuntimeError")
            for line in response.json()["not_ready"]
        ), response.json()
        monkeypatch.setattr(service.log, "write_step", real)  # the log is fixed
        events = await answer(client)
        assert events[-1]["finish_reason"] in ("stop", "length"), events[-1]
    await wait_for_ready(live_server)


async def test_a_delivery_whose_reader_fails_ends_with_a_retryable_error(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = live_server.state.service
    assert service is not None
    monkeypatch.setattr(service.log, "read", raise_once(service.log.read))
    async with RealtimeClient(live_server.ws_url, max_reconnects=0) as client:
        events = await answer(client, until_error=True)  # used to wait forever
        assert events[-1]["type"] == "error" and events[-1]["code"] == "internal_error"
        assert events[-1]["retryable"] is True
        await assert_blocks_free(live_server)  # generation was never tied to the delivery
        stream_id = events[0]["stream_id"]  # its end reached the session: it is idle again
        await wait_until(lambda: not service.is_generating(stream_id), "the response's end")
        events = await answer(client)
        assert events[-1]["type"] == "response.done"
