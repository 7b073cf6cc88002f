"""Prometheus metrics: every ``bargein_*`` series, fed by the engine and the sessions.

One :class:`Metrics` per app holds the metric objects. Engine numbers come
from the engine loop's listeners (:meth:`Metrics.attach_runner`, on the engine
thread, one call per step): step times, queue time, TTFT, inter-token and
end-to-end latency, preemptions, tokens, gauges of the scheduler and the KV
pool. Session numbers come through :class:`bargein.app.observer.Observer`. Names and
meanings are listed in ``docs/operating.md``.

Several worker processes: start every worker with ``PROMETHEUS_MULTIPROC_DIR``
set to one empty folder (prometheus-client then keeps values in files there)
and each worker's ``/metrics`` serves the sum over all of them; gauges say
how they combine (``livesum``: sum over live workers, ``livemax``: the
largest). This is prometheus-client's multi-process mode; see
https://prometheus.github.io/client_python/multiprocess/.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from bargein.engine.step_budget import TERMS as STEP_COST_TERMS  # pure Python, no torch
from bargein.session.cancel import cancel_and_wait

if TYPE_CHECKING:
    from bargein.engine.engine import EngineStats, StepStats
    from bargein.engine.request import RequestOutput

FINISH_REASONS = ("stop", "length", "interrupted", "cancelled", "error")
REJECTION_REASONS = (
    "invalid_parameter",
    "prompt_too_long",
    "conflict",
    "overloaded",
    "rate_limited",
    "engine_stopped",
)

# Seconds: from a fast GPU step (1 ms) to a loaded CPU box (tens of seconds).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LOG_WRITE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LAG_BUCKETS_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# measured / predicted step time: 1 is a perfect model
ERROR_RATIO_BUCKETS = (0.25, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


class Metrics:
    """Every bargein metric object.

    Args:
        registry: where they are registered. ``None`` registers nowhere,
            which is what multi-process mode wants (values live in the
            ``PROMETHEUS_MULTIPROC_DIR`` files and are collected from there).
        multiproc_dir: that folder when several workers share it; then
            :meth:`render` merges every worker's files.
    """

    def __init__(self, registry: CollectorRegistry | None, *, multiproc_dir: str | None = None) -> None:
        self.registry = registry
        self.multiproc_dir = multiproc_dir
        self._define_latencies(registry)
        self._define_gauges(registry)
        self._define_counters(registry)
        for reason in FINISH_REASONS:  # zero series exist before the first request
            self.requests_finished.labels(finish_reason=reason)
        for reason in REJECTION_REASONS:
            self.admission_rejections.labels(reason=reason)
        for phase in ("prefill", "decode"):
            self.step_duration.labels(phase=phase)
        for outcome in ("adopted", "dropped"):
            self.voice_speculations.labels(outcome=outcome)
        for outcome in ("real", "false"):
            self.voice_barge_ins.labels(outcome=outcome)
        self.voice_interruptions.labels(decision="cut", reason="words")
        for reason in ("backchannel", "no_words", "echo"):
            self.voice_interruptions.labels(decision="resumed", reason=reason)
        for term in STEP_COST_TERMS:
            self.step_cost.labels(term=term)

    def _define_latencies(self, r: CollectorRegistry | None) -> None:
        self.ttft = Histogram(
            "bargein_time_to_first_token_seconds",
            "Request arrival to its first token sampled.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token = Histogram(
            "bargein_inter_token_latency_seconds",
            "Time between two consecutive tokens of one request.",
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "bargein_e2e_request_latency_seconds",
            "Request arrival to the end of its generation (any finish reason).",
            buckets=E2E_BUCKETS_S,
            registry=r,
        )
        self.queue_time = Histogram(
            "bargein_request_queue_time_seconds",
            "Request arrival to its first scheduled engine step.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.step_duration = Histogram(
            "bargein_engine_step_duration_seconds",
            "Wall time of one engine step; phase=prefill if it computed any prompt token, else decode.",
            ["phase"],
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.interrupt_to_free = Histogram(
            "bargein_interrupt_to_free_seconds",
            "Cancel (or disconnect-cancel) frame received to the engine freeing the request's KV blocks.",
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.delivery_lag = Histogram(
            "bargein_delivery_lag_tokens",
            "Tokens generated but not yet sent to the client when a delta is sent "
            "(the tokens that delta coalesces).",
            buckets=LAG_BUCKETS_TOKENS,
            registry=r,
        )
        self.log_write = Histogram(
            "bargein_token_log_write_seconds",
            "One token-log write of one engine step's outputs.",
            buckets=LOG_WRITE_BUCKETS_S,
            registry=r,
        )
        self.voice_to_voice = Histogram(
            "bargein_voice_to_voice_seconds",
            "Arrival of a voice turn's last voiced audio to the first audio of its answer sent "
            "(includes the VAD silence window).",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.barge_in = Histogram(
            "bargein_barge_in_seconds",
            "Arrival of the audio in which speech was detected over the assistant to its audio "
            "stopped (paused, in confirm mode) and, in immediate mode, its request aborted.",
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.interruption_decision = Histogram(
            "bargein_voice_interruption_decision_seconds",
            "Confirm mode: the end of the speech over an answer (or of its pause window) to the "
            "decision to cut or resume it (mostly its transcription).",
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.transcription = Histogram(
            "bargein_transcription_seconds",
            "Speech-to-text time of one voice turn.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.step_cost_error = Histogram(
            "bargein_step_cost_error_ratio",
            "Measured over predicted wall time of an engine step planned against the "
            "--target-itl-ms budget (how far the learned step-time model is off).",
            buckets=ERROR_RATIO_BUCKETS,
            registry=r,
        )
        self.admission_ttft_error = Histogram(
            "bargein_admission_ttft_error_ratio",
            "Measured over predicted time to the first token of an admitted request "
            "(the admission's step-time model against what then happened; above 1: optimistic).",
            buckets=ERROR_RATIO_BUCKETS,
            registry=r,
        )
        self.synthesis_rtf = Histogram(
            "bargein_synthesis_real_time_factor",
            "Synthesis time over the duration of the audio it made, per segment (below 1: faster than real time).",
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r,
        )

    def _define_gauges(self, r: CollectorRegistry | None) -> None:
        def gauge(name: str, doc: str, mode: Any = "livesum") -> Gauge:
            return Gauge(name, doc, registry=r, multiprocess_mode=mode)

        self.running = gauge("bargein_sequences_running", "Sequences in the running batch.")
        self.waiting = gauge("bargein_sequences_waiting", "Sequences waiting for admission.")
        self.kv_blocks_used = gauge("bargein_kv_blocks_used", "KV cache blocks in use.")
        self.kv_blocks_total = gauge("bargein_kv_blocks_total", "KV cache blocks in the pool.")
        self.kv_blocks_cached_free = gauge(
            "bargein_kv_blocks_cached_free",
            "KV blocks no sequence holds that keep a cached prefix (reusable; evicted LRU when needed).",
        )
        self.sessions_connected = gauge("bargein_sessions_connected", "Open /v1/realtime connections.")
        self.streams_delivering = gauge(
            "bargein_streams_delivering", "Streams being sent to a client right now."
        )
        self.step_cost = Gauge(
            "bargein_step_cost_seconds",
            "The learned step-time model: seconds a step costs per unit of each term "
            "(base: per step; per_decode_seq; per_prefill_token; per_context_token: per KV "
            "token a decode attends to).",
            ["term"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.step_cost_samples = gauge(
            "bargein_step_cost_samples",
            "Forgotten weight of the steps the step-time model learned from (0: its prior).",
            mode="livemax",
        )
        self.step_target = gauge(
            "bargein_step_target_seconds",
            "The inter-token latency target each step is filled to (--target-itl-ms; 0: off).",
            mode="livemax",
        )
        self.log_pending_steps = gauge(
            "bargein_token_log_pending_steps",
            "Engine steps waiting to be written to the token log, at the last write "
            "(at most the writer's bound; there, the engine waits).",
        )
        self.event_loop_lag = gauge(
            "bargein_event_loop_lag_seconds",
            "How late the event loop ran a timer, last sample.",
            mode="livemax",
        )

    def _define_counters(self, r: CollectorRegistry | None) -> None:
        self.requests_finished = Counter(
            "bargein_requests_finished",
            "Engine requests ended, by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        self.disconnects = Counter(
            "bargein_disconnects",
            "Realtime clients that closed or dropped the "
            "connection; active_response: a response was still generating.",
            ["active_response"],
            registry=r,
        )
        self.resumes = Counter("bargein_stream_resumes", "stream.resume requests accepted.", registry=r)
        self.replayed_tokens = Counter(
            "bargein_replayed_tokens",
            "Tokens sent to resuming clients out of the log (already generated when the resume arrived).",
            registry=r,
        )
        self.admission_rejections = Counter(
            "bargein_admission_rejections",
            "Requests refused before reaching the engine, or dropped from its queue at "
            "their deadline (overloaded), by reason (the error code).",
            ["reason"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "bargein_protocol_errors",
            "Client frames refused by the decoder (malformed, unknown type, a field out "
            "of range), by error code.",
            ["code"],
            registry=r,
        )
        self.http_errors = Counter(
            "bargein_http_errors",
            "HTTP API requests answered with an OpenAI error body, by status and error "
            "code (validation, not found, overload...).",
            ["status", "code"],
            registry=r,
        )
        self.auth_refusals = Counter(
            "bargein_auth_refusals",
            "HTTP requests and WebSocket upgrades refused by the Host, Origin or API key check, by reason.",
            ["reason"],
            registry=r,
        )
        self.engine_log_wait = Counter(
            "bargein_engine_log_wait_seconds",
            "Seconds the engine thread waited for room in the token log writer's queue "
            "(backpressure: the log is slower than the engine).",
            registry=r,
        )
        self.preemptions = Counter(
            "bargein_preemptions", "Sequences preempted to free KV blocks (recomputed later).", registry=r
        )
        self.prompt_tokens = Counter(
            "bargein_prompt_tokens", "Prompt tokens of requests whose prefill finished.", registry=r
        )
        self.generated_tokens = Counter("bargein_generated_tokens", "Tokens sampled.", registry=r)
        # vLLM's prefix_cache_queries / prefix_cache_hits: hits / queries is the hit rate.
        self.voice_barge_ins = Counter(
            "bargein_voice_barge_ins",
            "Barge-ins by voice, judged once the interrupting turn is transcribed: real (it held "
            "words) or false (none: a cough, noise, the assistant's echo).",
            ["outcome"],
            registry=r,
        )
        self.voice_interruptions = Counter(
            "bargein_voice_interruptions",
            "Speech over a spoken answer in confirm mode, judged by its words: cut (a real "
            "interruption) or resumed (reason: backchannel, no_words, echo).",
            ["decision", "reason"],
            registry=r,
        )
        self.voice_speculations = Counter(
            "bargein_voice_speculations",
            "Voice turns answered at a short pause: adopted (the turn ended there) or dropped "
            "(the user went on speaking; the answer was aborted unseen).",
            ["outcome"],
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            "bargein_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache at admission.",
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "bargein_prefix_cache_hits",
            "Prompt tokens whose KV was reused from the prefix cache.",
            registry=r,
        )
        # hits / prefilled is the share of speculative prefill that was used
        self.speculative_prefill_tokens = Counter(
            "bargein_speculative_prefill_tokens",
            "Tokens prefilled into the prefix cache by prefill-only requests (a voice turn's "
            "conversation and partial transcript, at a pause), at the lowest priority.",
            registry=r,
        )
        self.speculative_prefill_hits = Counter(
            "bargein_speculative_prefill_hits",
            "Of the speculatively prefilled tokens, those a later real request reused from the "
            "prefix cache (each block counted once).",
            registry=r,
        )

    # ---- feeding ---------------------------------------------------------------

    def attach_runner(self, runner: Any) -> None:
        """Feed the engine metrics from ``runner`` (an ``EngineLoop``)."""
        self._set_engine_gauges(runner.stats())  # the pool's size before any step
        runner.add_step_stats_listener(self.on_step)
        runner.add_step_listener(self.on_outputs)

    def on_step(self, step: StepStats) -> None:
        """One engine step (engine thread): latencies, step time, tokens, gauges."""
        if step.num_prefill_tokens or step.num_decode_tokens:
            phase = "prefill" if step.num_prefill_tokens else "decode"
            self.step_duration.labels(phase=phase).observe(step.duration_s)
        _observe_all(self.queue_time, step.queue_times_s)
        _observe_all(self.ttft, step.ttfts_s)
        _observe_all(self.inter_token, step.inter_token_s)
        _observe_all(self.e2e, step.e2e_s)
        _inc(self.preemptions, step.num_preempted)
        _inc(self.prompt_tokens, step.num_prompt_tokens)
        _inc(self.generated_tokens, step.num_generated_tokens)
        _inc(self.prefix_cache_queries, step.num_prefix_cache_queries)
        _inc(self.prefix_cache_hits, step.num_prefix_cache_hits)
        _inc(self.speculative_prefill_tokens, step.num_speculative_prefill_tokens)
        _inc(self.speculative_prefill_hits, step.num_speculative_prefill_hits)
        if step.predicted_s:
            self.step_cost_error.observe(step.duration_s / step.predicted_s)
        self._set_engine_gauges(step.engine)

    def _set_engine_gauges(self, engine: EngineStats) -> None:
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting)
        self.kv_blocks_used.set(engine.num_total_blocks - engine.num_free_blocks)
        self.kv_blocks_total.set(engine.num_total_blocks)
        self.kv_blocks_cached_free.set(engine.num_cached_free_blocks)
        if engine.step_cost is not None:
            for term, value in zip(STEP_COST_TERMS, engine.step_cost.as_tuple(), strict=True):
                self.step_cost.labels(term=term).set(value)
        self.step_cost_samples.set(engine.step_cost_samples)
        self.step_target.set(engine.step_budget.target_s if engine.step_budget is not None else 0.0)

    def on_outputs(self, outputs: Sequence[RequestOutput]) -> None:
        """One step's outputs (engine thread): count the requests that ended.

        Every request the engine accepted ends here exactly once, including
        those ended by a shutdown or an engine crash.
        """
        for out in outputs:
            if out.finished and out.finish_reason is not None and not out.prefill_only:
                self.requests_finished.labels(finish_reason=out.finish_reason.value).inc()

    # ---- exposition ------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        if self.multiproc_dir is not None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiproc_dir)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        assert self.registry is not None
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        """The process stops serving: drop its live gauges (multi-process mode)."""
        if self.multiproc_dir is not None:
            multiprocess.mark_process_dead(os.getpid(), self.multiproc_dir)

    @contextlib.asynccontextmanager
    async def watching_event_loop(
        self, interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic
    ) -> AsyncIterator[None]:
        """While inside, sample the event loop's lag every ``interval_s`` seconds."""
        task = asyncio.create_task(self._watch_loop(interval_s, clock), name="loop-lag")
        try:
            yield
        finally:
            await cancel_and_wait([task])

    async def _watch_loop(self, interval_s: float, clock: Callable[[], float]) -> None:
        while True:
            start = clock()
            await asyncio.sleep(interval_s)
            self.event_loop_lag.set(max(0.0, clock() - start - interval_s))


def create_metrics(multiproc_dir: str | None) -> Metrics:
    """The metrics of one app: its own registry in one process; shared files
    in ``multiproc_dir`` when several workers serve (see the module doc)."""
    if multiproc_dir is not None:
        return Metrics(None, multiproc_dir=multiproc_dir)
    return Metrics(CollectorRegistry())


def _observe_all(histogram: Histogram, values: Sequence[float]) -> None:
    for value in values:
        histogram.observe(value)


def _inc(counter: Counter, amount: int) -> None:
    if amount:  # inc(0) is legal but costs a lock (and a file write with several workers)
        counter.inc(amount)
