"""The engine loop in its own thread, with thread-safe submit and abort.

Callers on any thread (the asyncio event loop above all) ``submit`` and
``abort``; the engine thread drains both queues at the start of every step,
runs the step, and hands the whole step's outputs to each step listener at
once (one hand-off per step) and to per-request async iterators. The ends of
the aborted requests go out in a hand-off of their own, before the step's
forward pass, so a ``response.done`` does not wait for it. When idle
the thread sleeps on a condition variable (no polling). Every submitted
request ends with exactly one finished output: on shutdown the live ones end
``CANCELLED``; if the engine thread crashes they end ``ERROR`` and later
submits raise :class:`EngineStoppedError`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from bargein.engine.engine import EngineStats, LLMEngine, StepStats
from bargein.engine.errors import DuplicateRequestError, EngineStoppedError
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput

logger = logging.getLogger(__name__)

StepListener = Callable[[list[RequestOutput]], None]
StepStatsListener = Callable[[StepStats], None]


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(slots=True)
class _Live:
    """What the loop knows of a live request, enough to end it on a crash."""

    request: EngineRequest
    num_output_tokens: int = 0


class EngineLoop:
    """Drives an :class:`LLMEngine` on a dedicated thread.

    Args:
        engine: the engine; after ``start()`` only the engine thread touches it.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._state = _State.NEW
        self._submits: list[EngineRequest] = []
        # (id, reason, only if waiting, tokens whose blocks stay cached)
        self._aborts: list[tuple[str, FinishReason, bool, int | None]] = []
        self._live: dict[str, _Live] = {}
        self._sinks: dict[str, Callable[[RequestOutput], None]] = {}
        self._listeners: list[StepListener] = []
        self._stats_listeners: list[StepStatsListener] = []
        self._thread: threading.Thread | None = None
        self._stats = engine.stats()
        self.error: BaseException | None = None

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        return self.engine.max_model_len

    @property
    def model_name(self) -> str:
        """A display name of the served model."""
        return str(getattr(self.engine.runner, "model_name", "bargein"))

    # ---- lifecycle ----------------------------------------------------------

    @classmethod
    def build_and_start(cls, build: Callable[[], LLMEngine]) -> EngineLoop:
        """Build the engine on a new engine thread, start the loop there, return once it runs.

        The thread that steps the engine must be the one that loaded it.
        libgomp (torch's OpenMP, and numba's) keeps a team of worker threads
        for every thread that ran a parallel region, for that thread's life;
        once its teams hold more threads than there are CPUs, it cuts every
        wait's spin to at most 1,000 iterations, and each of the ~250
        parallel regions of a decode step then pays a futex wake-up. A
        model loaded on one thread and stepped on another does exactly that:
        measured on 2 cores, one sequence, a decode step took 24.1 ms
        instead of 15.0 ms (docs/perf/wait-policy.md).

        Raises:
            whatever ``build`` raises (missing weights, a bad config),
            re-raised on the calling thread; no thread is left behind.
        """
        built: Future[EngineLoop] = Future()

        def main() -> None:
            try:
                engine_loop = cls(build())
            except BaseException as exc:
                built.set_exception(exc)
                return
            with engine_loop._cond:
                engine_loop._state = _State.RUNNING
                engine_loop._thread = threading.current_thread()
            built.set_result(engine_loop)
            engine_loop._run()

        threading.Thread(target=main, name="bargein-engine", daemon=True).start()
        return built.result()

    def start(self) -> None:
        """Start the engine thread (once), for an engine built on this thread.

        A server should rather :meth:`build_and_start`, which builds the
        engine on the thread that steps it.
        """
        with self._cond:
            assert self._state is _State.NEW, self._state
            self._state = _State.RUNNING
            self._thread = threading.Thread(target=self._run, name="bargein-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10) -> None:
        """Stop the loop after its current step; live requests end CANCELLED.

        Idempotent. Waits up to ``timeout`` seconds for the thread.
        """
        outputs: list[RequestOutput] = []
        with self._cond:
            if self._state in (_State.STOPPING, _State.STOPPED):
                thread = self._thread
            else:
                never_started = self._state is _State.NEW
                self._state = _State.STOPPING
                self._cond.notify_all()
                thread = self._thread
                outputs = self._stop_before_start() if never_started else []
        self._dispatch(outputs)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _stop_before_start(self) -> list[RequestOutput]:
        """Shutdown before start: the queued requests' final outputs (lock held)."""
        self._state = _State.STOPPED
        self._submits.clear()
        self._aborts.clear()
        return [_final(live, FinishReason.CANCELLED) for live in self._live.values()]

    # ---- thread-safe API ------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Queue a request for the next step.

        Raises:
            PromptTooLongError: ``len(prompt) >= max_model_len``.
            ValueError: empty prompt.
            DuplicateRequestError: the id is live.
            EngineStoppedError: shut down, or the engine thread died.
        """
        self.engine.validate(request)
        with self._cond:
            if self._state not in (_State.NEW, _State.RUNNING):
                raise EngineStoppedError(f"engine is {self._state.value}") from self.error
            if request.request_id in self._live:
                raise DuplicateRequestError(request.request_id)
            self._live[request.request_id] = _Live(request)
            self._submits.append(request)
            self._cond.notify_all()

    def abort(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.INTERRUPTED,
        *,
        only_if_waiting: bool = False,
        keep_tokens: int | None = None,
    ) -> None:
        """End a request at the start of the next step; no-op if not live.

        ``only_if_waiting``: only if the engine has not scheduled it yet;
        ``keep_tokens``: only the first that many tokens (prompt, then
        output) may stay in the prefix cache (:meth:`LLMEngine.abort_request`).

        Raises:
            ValueError: ``keep_tokens < 0``.
        """
        if keep_tokens is not None and keep_tokens < 0:
            raise ValueError(f"{keep_tokens=} must be >= 0")
        with self._cond:
            if request_id in self._live and self._state in (_State.NEW, _State.RUNNING):
                self._aborts.append((request_id, reason, only_if_waiting, keep_tokens))
                self._cond.notify_all()

    def add_step_listener(self, fn: StepListener) -> None:
        """Call ``fn(outputs)`` on the engine thread once per step with outputs.

        ``fn`` must be quick (for example ``loop.call_soon_threadsafe``), or
        block on purpose to push back (the service's listener waits while its
        log writer is too far behind: the engine then steps no faster than the
        log takes the steps); an exception in it is logged and does not stop
        the engine.
        """
        with self._cond:
            self._listeners.append(fn)

    def remove_step_listener(self, fn: StepListener) -> None:
        """Stop calling ``fn`` (added by :meth:`add_step_listener`); no-op if absent."""
        with self._cond:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def add_step_stats_listener(self, fn: StepStatsListener) -> None:
        """Call ``fn(step_stats)`` on the engine thread after every step.

        Called before that step's outputs reach the step listeners, so
        metrics fed from it are up to date when a client sees the tokens.
        Same rules as :meth:`add_step_listener`.
        """
        with self._cond:
            self._stats_listeners.append(fn)

    def stats(self) -> EngineStats:
        """The counters as of the end of the last step."""
        return self._stats

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Submit ``request`` and yield its outputs until the finished one.

        Leaving the iteration early (``break``, cancellation) aborts the
        request with ``CANCELLED``.

        Raises:
            the errors of :meth:`submit`.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        request_id = request.request_id

        def sink(output: RequestOutput) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, output)

        with self._cond:
            if request_id in self._sinks:
                raise DuplicateRequestError(request_id)
            self._sinks[request_id] = sink
        submitted = finished = False
        try:
            self.submit(request)
            submitted = True
            while not finished:
                output = await queue.get()
                finished = output.finished
                yield output
        finally:
            with self._cond:
                self._sinks.pop(request_id, None)
            if submitted and not finished:
                self.abort(request_id, FinishReason.CANCELLED)

    # ---- the engine thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._next_step():
                pass
            outputs = self._finish_on_stop()
        except Exception as exc:  # the engine is broken: fail every live request
            logger.exception("engine thread crashed")
            self._crash(exc)
            return
        with self._cond:
            self._state = _State.STOPPED
        self._dispatch(outputs)

    def _next_step(self) -> bool:
        """Wait for work, then run one step; ``False`` once stopping."""
        with self._cond:
            while self._state is _State.RUNNING and not (
                self._submits or self._aborts or self.engine.has_unfinished_requests()
            ):
                self._cond.wait()
            if self._state is not _State.RUNNING:
                return False
            submits, self._submits = self._submits, []
            aborts, self._aborts = self._aborts, []
        for request in submits:
            self.engine.add_request(request)
        for request_id, reason, only_if_waiting, keep_tokens in aborts:
            self.engine.abort_request(
                request_id, reason, only_if_waiting=only_if_waiting, keep_tokens=keep_tokens
            )
        if aborts:  # their ends go out before the forward pass: response.done a step sooner
            ended = self.engine.drain_aborts()
            self._stats = self.engine.stats()  # the freed blocks, seen with the ends
            self._dispatch(ended)
        outputs = self.engine.step()
        last = self.engine.last_step
        self._stats = last.engine if last is not None else self.engine.stats()
        with self._cond:
            stats_listeners = list(self._stats_listeners)
        for fn in stats_listeners:
            _call_safely(fn, self.engine.last_step)
        self._dispatch(outputs)
        return True

    def _finish_on_stop(self) -> list[RequestOutput]:
        """End every live request: queued aborts keep their reason, the rest CANCELLED."""
        with self._cond:
            submits, self._submits = self._submits, []
            aborts, self._aborts = self._aborts, []
        for request in submits:
            self.engine.add_request(request)
        for request_id, reason, only_if_waiting, keep_tokens in aborts:
            self.engine.abort_request(
                request_id, reason, only_if_waiting=only_if_waiting, keep_tokens=keep_tokens
            )
        outputs = self.engine.finish_all(FinishReason.CANCELLED)
        self._stats = self.engine.stats()
        return outputs

    def _crash(self, exc: BaseException) -> None:
        with self._cond:
            self.error = exc
            self._state = _State.STOPPED
            self._submits.clear()
            self._aborts.clear()
            outputs = [_final(live, FinishReason.ERROR) for live in self._live.values()]
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Hand one step's outputs to listeners and iterators.

        Bookkeeping happens under the lock; the callbacks run outside it, so a
        listener may call ``submit`` or ``abort``.
        """
        if not outputs:
            return
        with self._cond:
            for output in outputs:
                live = self._live.get(output.request_id)
                if live is None:
                    continue
                live.num_output_tokens = output.num_output_tokens
                if output.finished:
                    del self._live[output.request_id]
            listeners = list(self._listeners)
            sinks = [(self._sinks.get(o.request_id), o) for o in outputs]
        for fn in listeners:
            _call_safely(fn, outputs)
        for sink, output in sinks:
            if sink is not None:
                _call_safely(sink, output)


def _final(live: _Live, reason: FinishReason) -> RequestOutput:
    """The last output of a request the engine can no longer speak for."""
    return RequestOutput(
        request_id=live.request.request_id,
        new_token_ids=(),
        text="",
        num_prompt_tokens=len(live.request.prompt_token_ids),
        num_output_tokens=live.num_output_tokens,
        finished=True,
        finish_reason=reason,
        prefill_only=live.request.prefill_only,
    )


def _call_safely(fn: Callable[[Any], None], arg: Any) -> None:
    """Run a listener; log its exception (a closed event loop, a bug) and go on."""
    try:
        fn(arg)
    except Exception:
        logger.exception("step listener %r failed", fn)
