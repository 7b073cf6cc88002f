"""The process's voice side: the loaded models and the threads they run in.

One :class:`VoiceRuntime` per process, shared by every connection's
:class:`~bargein.session.voice_runtime.channel.VoiceChannel`: speech to text
and synthesis run in one pool, input audio (resampling, the VAD) in another,
so a VAD run never queues behind seconds of Whisper.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from bargein.session.voice_runtime.config import VoiceConfig

T = TypeVar("T")


class VoiceRuntime:
    """The loaded voice models and the threads they run in.

    Args:
        models: a :class:`bargein.voice.models.VoiceModels` (VAD, transcriber,
            synthesizer).
        config: limits.
    """

    def __init__(self, models: Any, config: VoiceConfig) -> None:
        self.models = models
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="voice")
        # input audio (resampling, VAD) has threads of its own: a VAD run
        # queued behind seconds of Whisper would delay a barge-in
        self._input_pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="voice-input")
        self._jobs = 0  # queued or running in the voice pool (a job a cancel left running included)
        self._jobs_lock = threading.Lock()

    @property
    def idle_threads(self) -> int:
        """Voice threads with nothing to do now (no job queued for them)."""
        return max(0, self.config.workers - self._jobs)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the voice thread pool (the models release the GIL).
        Cancelling the caller takes a queued job out of the queue; a running
        one finishes, unread."""
        job = self._pool.submit(fn)
        with self._jobs_lock:
            self._jobs += 1
        job.add_done_callback(self._job_done)  # in the thread that ends it (now, if it did)
        return await asyncio.wrap_future(job)

    def _job_done(self, job: Future[Any]) -> None:
        with self._jobs_lock:
            self._jobs -= 1

    async def run_input(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the input-audio threads (resampling and the VAD)."""
        return await asyncio.get_running_loop().run_in_executor(self._input_pool, fn)

    def close(self) -> None:
        """Stop the threads (after the last connection closed)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._input_pool.shutdown(wait=False, cancel_futures=True)
