"""``/metrics`` scraped from the live server before and after real traffic.

Each test waits until the shared server is idle, scrapes, sends traffic,
scrapes again and checks that the right series moved by the right amount.
Admission rejections, in bargein, are well-formed requests refused before
they reach the engine: a ``response.create`` the session refuses
(``invalid_parameter`` such as ``max_tokens`` above the limit, ``conflict``)
or one the service refuses (``prompt_too_long``). A frame the decoder
refuses (``temperature: -1``) is a protocol error, counted apart.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bargein.app.metrics import Metrics
from bargein.client.realtime_client import RealtimeClient
from bargein.engine.engine import EngineStats, StepStats
from bargein.engine.request import FinishReason, RequestOutput
from tests.app.conftest import LiveServer
from tests.waiting import wait_until_async

REPO = Path(__file__).resolve().parents[2]
GREEDY = {"temperature": 0.0}
FINISH_REASONS = ("stop", "length", "interrupted", "cancelled", "error")
EXPECTED_FAMILIES = {
    "bargein_time_to_first_token_seconds",
    "bargein_inter_token_latency_seconds",
    "bargein_e2e_request_latency_seconds",
    "bargein_request_queue_time_seconds",
    "bargein_engine_step_duration_seconds",
    "bargein_interrupt_to_free_seconds",
    "bargein_delivery_lag_tokens",
    "bargein_token_log_write_seconds",
    "bargein_sequences_running",
    "bargein_sequences_waiting",
    "bargein_kv_blocks_used",
    "bargein_kv_blocks_total",
    "bargein_sessions_connected",
    "bargein_streams_delivering",
    "bargein_event_loop_lag_seconds",
    "bargein_requests_finished",
    "bargein_disconnects",
    "bargein_stream_resumes",
    "bargein_replayed_tokens",
    "bargein_admission_rejections",
    "bargein_protocol_errors",
    "bargein_http_errors",
    "bargein_auth_refusals",
    "bargein_preemptions",
    "bargein_prompt_tokens",
    "bargein_generated_tokens",
    "bargein_kv_blocks_cached_free",
    "bargein_prefix_cache_queries",
    "bargein_prefix_cache_hits",
    "bargein_step_cost_seconds",
    "bargein_step_cost_samples",
    "bargein_step_target_seconds",
    "bargein_step_cost_error_ratio",
    "bargein_admission_ttft_error_ratio",
}


class Samples:
    """One scrape: sample values by name and labels (absent series read 0)."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self._values = {
            (s.name, frozenset(s.labels.items())): s.value for f in self.families.values() for s in f.samples
        }

    def get(self, name: str, **labels: str) -> float:
        return self._values.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self._values

    def moved(self, before: Samples, name: str, **labels: str) -> float:
        """How much this series grew since ``before``."""
        return self.get(name, **labels) - before.get(name, **labels)


async def scrape(live: LiveServer) -> Samples:
    async with httpx.AsyncClient(base_url=live.http_url) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return Samples(response.text)


async def scrape_when(live: LiveServer, ready: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``ready`` holds (what a connection's end updates lands a
    moment after the client saw it), then once more a little later, so a
    series that moves too far is caught too (that pause can only catch more:
    a correct server passes however late the look)."""

    async def moved() -> bool:
        return ready(await scrape(live))

    await wait_until_async(moved, "the metrics to move", poll_s=0.05)
    await asyncio.sleep(0.1)
    return await scrape(live)


def num_finished(samples: Samples, before: Samples) -> dict[str, float]:
    return {
        reason: samples.moved(before, "bargein_requests_finished_total", finish_reason=reason)
        for reason in FINISH_REASONS
    }


@pytest.mark.slow
async def test_every_series_is_exposed_with_the_pool_size(live_server: LiveServer) -> None:
    samples = await scrape(live_server)
    assert EXPECTED_FAMILIES <= set(samples.families)
    stats = live_server.stats()
    assert samples.get("bargein_kv_blocks_total") == stats.num_total_blocks > 0
    for reason in FINISH_REASONS:  # every reason is a series from the start
        assert samples.has("bargein_requests_finished_total", finish_reason=reason)


@pytest.mark.slow
async def test_ready_and_alive_say_what_is_ready(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_server.http_url) as http:
        alive = await http.get("/healthz")
        ready = await http.get("/readyz")
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})
    assert ready.status_code == 200
    assert ready.json() == {
        "ready": True,
        "model_loaded": True,
        "token_log": True,
        "error": None,
        "not_ready": [],
    }


@pytest.mark.slow
async def test_responses_move_latency_and_token_series(live_server: LiveServer) -> None:
    await live_server.wait_idle()
    before = await scrape(live_server)

    async def ask(question: str) -> dict:
        async with RealtimeClient(live_server.ws_url) as client:
            await client.chat(question, max_tokens=6, **GREEDY)
            assert client.current is not None and client.current.done is not None
            return client.current.done

    dones = await asyncio.gather(*(ask(f"What is {n} plus {n}?") for n in (1, 2, 3)))
    await live_server.wait_idle()
    after = await scrape_when(
        live_server, lambda s: s.moved(before, "bargein_disconnects_total", active_response="false") >= 3
    )
    ends = [done["end"] for done in dones]
    assert after.moved(before, "bargein_time_to_first_token_seconds_count") == 3
    assert after.moved(before, "bargein_request_queue_time_seconds_count") == 3
    assert after.moved(before, "bargein_e2e_request_latency_seconds_count") == 3
    # Every token but each response's first comes some time after the one before.
    assert after.moved(before, "bargein_inter_token_latency_seconds_count") == sum(ends) - 3
    assert after.moved(before, "bargein_generated_tokens_total") == sum(ends)
    assert after.moved(before, "bargein_prompt_tokens_total") == sum(
        done["usage"]["prompt_tokens"] for done in dones
    )
    finished = num_finished(after, before)
    assert finished["stop"] + finished["length"] == 3
    assert finished["interrupted"] == finished["cancelled"] == finished["error"] == 0
    # Every token went out once, in some delta: the lag histogram sums them.
    assert after.moved(before, "bargein_delivery_lag_tokens_sum") == sum(ends)
    assert after.moved(before, "bargein_engine_step_duration_seconds_count", phase="prefill") >= 1
    assert after.moved(before, "bargein_engine_step_duration_seconds_count", phase="decode") >= 1
    assert after.moved(before, "bargein_token_log_write_seconds_count") >= 1
    assert after.get("bargein_sessions_connected") == before.get("bargein_sessions_connected")
    assert after.get("bargein_streams_delivering") == 0
    assert after.get("bargein_sequences_running") == after.get("bargein_sequences_waiting") == 0
    assert after.get("bargein_kv_blocks_used") == 0


@pytest.mark.slow
async def test_an_interrupted_response_counts_once(live_server: LiveServer) -> None:
    await live_server.wait_idle()
    before = await scrape(live_server)
    async with RealtimeClient(live_server.ws_url) as client:
        during = await scrape(live_server)
        assert during.moved(before, "bargein_sessions_connected") == 1
        received: list[str] = []
        async for delta in client.respond("Write a long story about a dragon.", max_tokens=64, **GREEDY):
            received.append(delta)
            if len(received) == 3:
                break
        done = await client.cancel(heard_chars=len("".join(received)))
    assert done["finish_reason"] == "interrupted"
    await live_server.wait_idle()
    after = await scrape_when(
        live_server, lambda s: s.moved(before, "bargein_disconnects_total", active_response="false") >= 1
    )
    assert num_finished(after, before) == {
        "stop": 0,
        "length": 0,
        "interrupted": 1,
        "cancelled": 0,
        "error": 0,
    }
    assert after.moved(before, "bargein_interrupt_to_free_seconds_count") == 1
    # in seconds: the very latency the service measured for this interrupt
    latency_s = live_server.state.service.interrupt_latencies_s[-1]  # type: ignore[union-attr]
    assert 0 < after.moved(before, "bargein_interrupt_to_free_seconds_sum") == pytest.approx(latency_s)
    assert after.moved(before, "bargein_time_to_first_token_seconds_count") == 1
    # Tokens sampled: the stream's, plus any the engine sampled after the cancel
    # was accepted (not logged: the stream ends where the client's deltas did).
    assert after.moved(before, "bargein_generated_tokens_total") >= done["end"]
    assert after.get("bargein_sessions_connected") == before.get("bargein_sessions_connected")
    assert after.get("bargein_kv_blocks_used") == 0


@pytest.mark.slow
async def test_a_resume_adds_the_tokens_it_replays(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        await client.chat("Count from one to twenty.", max_tokens=24, **GREEDY)
        response = client.current
        assert response is not None and response.done is not None
    end = response.done["end"]
    assert end >= 4
    from_offset = end // 2
    await live_server.wait_idle()
    before = await scrape(live_server)
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {
                "type": "stream.resume",
                "stream_id": response.stream_id,
                "resume_token": response.resume_token,
                "from": from_offset,
            }
        )
        replayed = 0
        while (event := await client._recv())["type"] != "response.done":
            if event["type"] == "response.delta":
                replayed += event["end"] - event["start"]
    assert replayed == end - from_offset
    after = await scrape_when(
        live_server, lambda s: s.moved(before, "bargein_disconnects_total", active_response="false") >= 1
    )
    assert after.moved(before, "bargein_stream_resumes_total") == 1
    assert after.moved(before, "bargein_replayed_tokens_total") == end - from_offset
    assert after.moved(before, "bargein_delivery_lag_tokens_sum") == end - from_offset
    # Served from the log: nothing was generated again.
    assert after.moved(before, "bargein_generated_tokens_total") == 0
    assert sum(num_finished(after, before).values()) == 0


@pytest.mark.slow
async def test_refused_requests_count_as_rejections_by_reason(live_server: LiveServer) -> None:
    await live_server.wait_idle()
    before = await scrape(live_server)
    hi = [{"role": "user", "content": "Hi."}]
    long_prompt = "lorem ipsum dolor sit amet " * 200  # > 512 tokens of context
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send({"type": "response.create", "max_tokens": 1000, "input": hi})
        assert (await client._recv())["code"] == "invalid_parameter"
        await client.send({"type": "response.create", "input": [{"role": "user", "content": long_prompt}]})
        assert (await client._recv())["code"] == "prompt_too_long"
        await client.send({"type": "response.create", "temperature": -1, "input": hi})
        assert (await client._recv())["code"] == "invalid_parameter"
        await client.send(
            {"type": "response.create", "response_id": "a", "input": hi, "max_tokens": 64, **GREEDY}
        )
        await client.send({"type": "response.create", "input": hi})
        await client.send({"type": "response.cancel", "response_id": "a"})
        codes = []
        while (event := await client._recv())["type"] != "response.done":
            codes += [event["code"]] if event["type"] == "error" else []
        assert codes == ["conflict"]
    await live_server.wait_idle()
    after = await scrape(live_server)
    rejections = "bargein_admission_rejections_total"
    assert after.moved(before, rejections, reason="invalid_parameter") == 1
    assert after.moved(before, rejections, reason="prompt_too_long") == 1
    assert after.moved(before, rejections, reason="conflict") == 1
    assert after.moved(before, "bargein_protocol_errors_total", code="invalid_parameter") == 1
    assert num_finished(after, before) == {
        "stop": 0,
        "length": 0,
        "interrupted": 1,
        "cancelled": 0,
        "error": 0,
    }


async def test_http_errors_and_sse_streams_are_counted(live_server: LiveServer) -> None:
    await live_server.wait_idle()
    before = await scrape(live_server)
    hi = [{"role": "user", "content": "Hi."}]
    async with httpx.AsyncClient(base_url=live_server.http_url, timeout=60) as http:
        bad = await http.post("/v1/chat/completions", json={"model": "m", "messages": hi, "temperature": 9})
        missing = await http.get("/v1/streams/no-such-stream/events")
        async with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "m", "messages": hi, "max_tokens": 16, "stream": True, **GREEDY},
        ) as streamed:
            lines = streamed.aiter_lines()
            assert (await anext(lines)).startswith("id:")  # the role chunk
            during = await scrape(live_server)
            rest = [line async for line in lines]
    assert (bad.status_code, missing.status_code, streamed.status_code) == (400, 404, 200)
    assert "data: [DONE]" in rest
    delivering = "bargein_streams_delivering"
    assert during.get(delivering) == before.get(delivering) + 1
    after = await scrape_when(live_server, lambda s: s.get(delivering) == before.get(delivering))
    errors = "bargein_http_errors_total"
    assert after.moved(before, errors, status="400", code=bad.json()["error"]["code"]) == 1
    assert after.moved(before, errors, status="404", code=missing.json()["error"]["code"]) == 1


WORKER = """
import sys
from bargein.app.metrics import create_metrics
metrics = create_metrics(sys.argv[1])
metrics.requests_finished.labels(finish_reason="stop").inc(2)
metrics.ttft.observe(0.2)
metrics.sessions_connected.set(int(sys.argv[2]))
if sys.argv[3] == "stops":
    metrics.close()
"""


def test_several_workers_add_up_in_one_scrape(tmp_path: Path) -> None:
    """prometheus-client's multi-process mode: each worker writes its own
    files, any worker's /metrics merges them; a worker that stopped drops
    out of the live gauges but its counts stay."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for connected, fate in ((3, "runs"), (5, "stops")):
        subprocess.run(
            [sys.executable, "-c", WORKER, str(tmp_path), str(connected), fate],
            cwd=REPO,
            env=env,
            check=True,
            timeout=60,
        )
    body, content_type = Metrics(None, multiproc_dir=str(tmp_path)).render()
    assert content_type.startswith("text/plain")
    samples = Samples(body.decode())
    assert samples.get("bargein_requests_finished_total", finish_reason="stop") == 4
    assert samples.get("bargein_time_to_first_token_seconds_count") == 2
    assert samples.get("bargein_sessions_connected") == 3


def test_engine_steps_feed_histograms_counters_and_gauges() -> None:
    metrics = Metrics(CollectorRegistry())
    engine = EngineStats(
        num_free_blocks=90,
        num_total_blocks=100,
        num_running=3,
        num_waiting=2,
        num_generated_tokens=0,
        num_prompt_tokens=0,
        num_preemptions=1,
        num_steps=2,
        last_step_s=0.02,
        num_finished_by_reason={},
    )
    prefill = StepStats(
        duration_s=0.05,
        num_prefill_tokens=40,
        num_decode_tokens=2,
        num_preempted=1,
        num_prompt_tokens=40,
        num_generated_tokens=3,
        queue_times_s=(0.5,),
        ttfts_s=(0.7,),
        inter_token_s=(0.02, 0.03),
        e2e_s=(),
        engine=engine,
    )
    decode = StepStats(
        duration_s=0.01,
        num_prefill_tokens=0,
        num_decode_tokens=3,
        num_preempted=0,
        num_prompt_tokens=0,
        num_generated_tokens=3,
        queue_times_s=(),
        ttfts_s=(),
        inter_token_s=(0.01,) * 3,
        e2e_s=(1.5,),
        engine=engine,
    )
    metrics.on_step(prefill)
    metrics.on_step(decode)
    metrics.on_outputs(
        [
            RequestOutput(
                request_id="a",
                new_token_ids=(7,),
                text="x",
                num_prompt_tokens=40,
                num_output_tokens=9,
                finished=True,
                finish_reason=FinishReason.LENGTH,
            ),
            RequestOutput(
                request_id="b", new_token_ids=(8,), text="y", num_prompt_tokens=4, num_output_tokens=2
            ),
        ]
    )
    samples = Samples(metrics.render()[0].decode())
    steps = "bargein_engine_step_duration_seconds"
    assert samples.get(f"{steps}_count", phase="prefill") == 1
    assert samples.get(f"{steps}_sum", phase="prefill") == pytest.approx(0.05)
    assert samples.get(f"{steps}_count", phase="decode") == 1
    assert samples.get("bargein_inter_token_latency_seconds_count") == 5
    assert samples.get("bargein_time_to_first_token_seconds_sum") == pytest.approx(0.7)
    assert samples.get("bargein_request_queue_time_seconds_count") == 1
    assert samples.get("bargein_e2e_request_latency_seconds_sum") == pytest.approx(1.5)
    assert samples.get("bargein_preemptions_total") == 1
    assert samples.get("bargein_prompt_tokens_total") == 40
    assert samples.get("bargein_generated_tokens_total") == 6
    assert samples.get("bargein_requests_finished_total", finish_reason="length") == 1
    assert (
        sum(samples.get("bargein_requests_finished_total", finish_reason=reason) for reason in FINISH_REASONS)
        == 1
    )
    assert (
        samples.get("bargein_kv_blocks_used"),
        samples.get("bargein_kv_blocks_total"),
        samples.get("bargein_sequences_running"),
        samples.get("bargein_sequences_waiting"),
    ) == (10, 100, 3, 2)


@pytest.mark.slow
async def test_prefix_cache_counters_count_the_reused_prompt_tokens(live_server: LiveServer) -> None:
    await live_server.wait_idle()
    before = await scrape(live_server)
    usages = []
    async with RealtimeClient(live_server.ws_url) as client:
        await client.update(instructions="Metrics test of the prefix cache: answer in one word.")
        for _ in range(2):
            await client.chat("Hello there.", max_tokens=4, temperature=0)
            usages.append(client.current.done["usage"])  # type: ignore[union-attr]
    await live_server.wait_idle()
    after = await scrape(live_server)
    assert usages[-1]["cached_tokens"] > 0  # the second turn reuses the first
    assert after.moved(before, "bargein_prefix_cache_hits_total") == sum(u["cached_tokens"] for u in usages)
    assert after.moved(before, "bargein_prefix_cache_queries_total") >= sum(
        u["prompt_tokens"] for u in usages
    )
