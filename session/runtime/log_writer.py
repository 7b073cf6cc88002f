"""The step writer: each engine step into the token log in one write, in step order.

One task per node takes the steps of the :class:`~bargein.session.runtime.step_queue.StepQueue`
in order, turns each into one ``StreamWrite`` per stream
(:class:`~bargein.session.runtime.step_outputs.StepOutputs`), keeps those the
peers still allow (``fence``), and calls ``TokenLog.write_step`` once: one
Redis round trip per step for all streams, never one per token. Then the
streams that ended are settled.

The writer runs supervised (session/supervise.py): a bug that crashes it
fails the streams of the step it was writing (an error end in the log, the
engine request aborted, the admission slot returned) and the writer
restarts; a log write that raises something unexpected fails only the
streams whose own write fails. While it fails, the service's ``health`` makes
``/readyz`` answer 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from bargein.engine.request import FinishReason, RequestOutput
from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.errors import StreamFenced, TokenLogUnavailable
from bargein.session.runtime.engine_handle import EngineHandle
from bargein.session.runtime.live import LiveStream, LiveStreams
from bargein.session.runtime.observer import SessionObserver
from bargein.session.runtime.step_outputs import StepOutputs
from bargein.session.runtime.step_queue import StepQueue
from bargein.session.streams.log import EndError, StreamEnd, StreamWrite, TokenLog
from bargein.session.streams.peers import Peers
from bargein.session.supervise import TaskHealth, supervised

logger = logging.getLogger(__name__)

WRITER = "token-log-writer"  # the step writer's task name (the log, /readyz)
FAILED_MESSAGE = "the server failed while writing this response (a bug, in its log); it ended here"
RETRY_AFTER_FAILURE_MS = 1000  # a new request may well succeed: the step writer restarted


class LogWriter:
    """Writes the engine's steps to the token log (see the module doc).

    Args:
        steps: the engine's steps, handed over from its thread.
        outputs: what each output writes, and the ends of streams.
        streams: this node's live streams (those a failure ends).
        log: the token log.
        peers: the other nodes (which writes are still ours; a stream they took).
        runner: the engine runner (``abort``: a stream that cannot go on).
        observer: told of each write and of the queue's backlog.
        health: where the writer reports its crashes (``/readyz``).
    """

    def __init__(
        self,
        steps: StepQueue,
        outputs: StepOutputs,
        streams: LiveStreams,
        log: TokenLog,
        peers: Peers,
        runner: EngineHandle,
        observer: SessionObserver,
        health: TaskHealth,
    ) -> None:
        self._steps = steps
        self._outputs = outputs
        self._streams = streams
        self._log = log
        self._peers = peers
        self._runner = runner
        self._observer = observer
        self._health = health
        self._in_flight: list[RequestOutput] = []  # the step being written
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the writer task (on the running event loop)."""
        self._task = supervised(self._write_steps, name=WRITER, on_crash=self._crashed, health=self._health)

    async def stop(self) -> None:
        """Stop the writer task; steps not written yet are dropped."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _write_steps(self) -> None:
        """Write each step to the log in one ``write_step``, in step order
        (supervised: see :meth:`_crashed`); each step's slot is given
        back once it is written (or failed)."""
        while True:
            step = await self._steps.get()
            try:
                self._observer.log_backlog(
                    num_steps=self._steps.num_pending() + 1, engine_wait_s=step.engine_wait_s
                )
                self._in_flight = step.outputs
                if await self._write_step(step.started_at, step.outputs):
                    self._health.working(WRITER)
                self._in_flight = []
            finally:
                self._steps.done(step)

    async def _write_step(self, step_start: float, outputs: list[RequestOutput]) -> bool:
        """Log one step's outputs, settle the streams that ended; whether the
        log took writes of the step (a step with none says nothing of it)."""
        outputs = [self._outputs.continued(out) for out in outputs]
        writes = [w for w in map(self._outputs.to_write, outputs) if w is not None]
        if not writes:
            return False
        writes = await self._peers.fence(writes)  # only streams still ours
        written = True
        try:
            await self._write(writes)
        except Exception as exc:  # a bug, or one broken stream: it must not stop the others
            logger.error(
                "token log write of %d streams failed (a bug in bargein): %r; "
                "failing the streams whose own write fails",
                len(writes),
                exc,
                exc_info=exc,
            )
            self._health.crashed(WRITER, exc)
            await self._write_one_by_one(writes)
            written = False
        self._outputs.finished(outputs, step_start)
        return written

    async def _write(self, writes: list[StreamWrite]) -> None:
        """One ``write_step``; streams the log refuses as expected are stopped.

        Raises what else the log raises (a bug, or a stream the log no longer
        takes: expired, already ended, a bad offset).
        """
        started = time.perf_counter()
        try:
            await self._log.write_step(writes)
        except StreamFenced as exc:  # another node continues them: stop, free the KV
            for stream_id in exc.stream_ids:
                self._peers.lost(stream_id)
            return
        except TokenLogUnavailable as exc:
            logger.error("token log write failed for %s", exc.stream_ids)
            for stream_id in exc.stream_ids:
                self._runner.abort(stream_id, FinishReason.ERROR)
            return
        self._observer.log_written(time.perf_counter() - started, len(writes))

    async def _write_one_by_one(self, writes: list[StreamWrite]) -> None:
        """After a step write failed: write each stream alone and fail those
        whose own write fails (their readers get an error end)."""
        if len(writes) == 1:  # nothing to tell apart: it is this stream's write
            await self.fail_streams([writes[0].stream_id])
            return
        failed = []
        for write in writes:
            try:
                await self._write([write])
            except Exception:
                logger.exception("stream %s: its log write failed: ending it with an error", write.stream_id)
                failed.append(write.stream_id)
        await self.fail_streams(failed)

    async def _crashed(self, exc: Exception) -> None:
        """The writer crashed (a bug) in the middle of a step: that step's
        tokens were not all logged, so its streams end here, with an error."""
        outputs, self._in_flight = self._in_flight, []
        await self.fail_streams(list(dict.fromkeys(out.request_id for out in outputs)))

    async def fail_streams(self, stream_ids: Sequence[str]) -> None:
        """End streams generated here that cannot go on (a bug broke their log):
        the engine frees their KV blocks, admission gets their slots back,
        their owners are told, and their readers get an error end (or, when
        even that cannot be written, a retryable read error)."""
        failed = [(sid, live) for sid in stream_ids if (live := self._streams.pop(sid)) is not None]
        for sid, live in failed:
            self._runner.abort(sid, FinishReason.ERROR)  # its later outputs are ignored
            self._outputs.failed(sid, live)
        for sid, live in failed:
            await self._end_with_error(sid, live)

    async def _end_with_error(self, stream_id: str, live: LiveStream) -> None:
        """Write an error end at what the log holds of the stream; if the log
        refuses that too, stop its readers here (``abandon_stream``)."""
        try:
            info = await self._log.info(stream_id)
            if info is None or info.finish is not None:
                return  # gone (its readers were told) or ended already
            end = StreamEnd(
                end=info.end,
                finish_reason=FinishReason.ERROR.value,
                prompt_tokens=live.num_prompt_tokens,
                completion_tokens=info.end,
                cached_tokens=0,
                error=EndError(
                    code=pe.ErrorCode.INTERNAL_ERROR.value,
                    message=FAILED_MESSAGE,
                    retry_after_ms=RETRY_AFTER_FAILURE_MS,
                ),
            )
            await self._log.write_step([StreamWrite(stream_id=stream_id, entry=None, finish=end)])
        except Exception:
            logger.exception(
                "stream %s: its error end could not be logged either; stopping its readers", stream_id
            )
            abandon = getattr(self._log, "abandon_stream", None)
            if abandon is not None:
                abandon(stream_id)
