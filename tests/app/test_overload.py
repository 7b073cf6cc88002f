"""Overload end to end: the step budget's refusals reach the client at once, with retry_after_ms.

A server of its own (the bundled model, text only) with an inter-token
target of 1 ms: no step of two decoding streams fits it, so while one
answer decodes, every other request must be refused for the running
stream's sake. The engine is held in the hand-off of the first answer's
first token, so that answer is decoding when the others arrive by
construction, not because the machine is slow.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.client.realtime_client import RealtimeClient, ServerError
from bargein.engine.config import EngineConfig, SchedulerConfig
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.voice_runtime.config import VoiceConfig
from tests.waiting import HANG_GUARD_S, wait_until

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def tight() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(
        Settings(
            # slow_headroom 1: no step meets a 1 ms target, so only the decoding stream runs
            engine=EngineConfig(
                scheduler=SchedulerConfig(max_model_len=512, target_itl_s=0.001, slow_headroom=1.0)
            ),
            session=SessionConfig(max_tokens=64, default_max_tokens=16),
            server=ServerConfig(port=0, debug_endpoints=True, log_level="warning"),
            # Any wait is past the TTFT target: a request that finds the batch full is
            # refused rather than queued behind the running stream (admission.py, 5.).
            admission=AdmissionConfig(target_ttft_s=0.001),
            voice=VoiceConfig(mode="off"),
        )
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _overloaded_count(server: EmbeddedServer) -> float:
    for line in httpx.get(server.http_url + "/metrics").text.splitlines():
        if line.startswith('bargein_admission_rejections_total{reason="overloaded"}'):
            return float(line.rpartition(" ")[2])
    return 0.0


async def test_a_decoding_stream_is_protected_and_refusals_say_when_to_retry(tight: EmbeddedServer) -> None:
    service = tight.state.service
    assert service is not None
    runner = service.runner
    held, release = threading.Event(), threading.Event()
    steps_ended: list[int] = []  # steps whose listener returned

    def hold(_outputs: object) -> None:
        held.set()
        release.wait(HANG_GUARD_S)  # never hold the engine for good
        steps_ended.append(1)

    before = _overloaded_count(tight)
    first, second = RealtimeClient(tight.ws_url), RealtimeClient(tight.ws_url)
    await first.connect()
    await second.connect()
    try:
        runner.add_step_listener(hold)
        try:
            await first.send(
                {
                    "type": "response.create",
                    "max_tokens": 8,
                    **GREEDY,
                    "input": [{"role": "user", "content": "Hi"}],
                }
            )
            await first._expect("response.created")
            assert await asyncio.to_thread(held.wait, HANG_GUARD_S)  # its first token: it decodes now
            assert runner.stats().num_decoding == 1
            assert runner.stats().step_budget is not None
            with pytest.raises(ServerError) as refused:
                await second.chat("Hello there", max_tokens=4)
            async with httpx.AsyncClient(base_url=tight.http_url) as http:
                answer = await http.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                )
            # the engine is still held in its first step: neither refusal waited for a step
            assert not steps_ended
        finally:
            release.set()
            runner.remove_step_listener(hold)
        assert refused.value.code == "overloaded"
        assert "inter-token" in refused.value.event["message"]
        # the running stream's at most 7 tokens to go, at the predicted step of one stream
        assert 100 <= refused.value.event["retry_after_ms"] <= 7 * 1000
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "overloaded"
        assert _overloaded_count(tight) == before + 2
        await asyncio.wait_for(
            first._expect("response.done"), HANG_GUARD_S
        )  # the protected stream ends normally
    finally:
        await first.close()
        await second.close()
    # nothing decodes any more: a request is admitted and served
    await wait_until(lambda: not runner.stats().num_running, "the engine to go idle")
    async with RealtimeClient(tight.ws_url) as again:
        await again.chat("Hi", max_tokens=2, **GREEDY)
        assert again.current is not None and again.current.done is not None


def test_the_step_model_is_learned_and_exported(tight: EmbeddedServer) -> None:
    body = httpx.get(tight.http_url + "/metrics").text
    values: dict[str, Any] = {}
    for line in body.splitlines():
        if line.startswith(("bargein_step_cost_samples ", "bargein_step_target_seconds ")):
            name, _, value = line.partition(" ")
            values[name] = float(value)
    assert values["bargein_step_target_seconds"] == 0.001
    assert values["bargein_step_cost_samples"] > 0  # the steps of the test above
