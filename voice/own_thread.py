"""Run a call on a thread that ends with it, so that no OpenMP team outlives it.

libgomp keeps an OpenMP team for each thread that ran a parallel region, for
as long as that thread lives, and once its teams hold more threads than there
are CPUs it cuts the spin of every team, the engine's included, which makes
each decode step pay futex wake-ups (``EngineLoop.build_and_start``).
transformers computes Whisper's log-mel features with torch's STFT (torch's
libgomp) whenever torch is installed, so the voice models that use them
(speech to text, the end-of-turn model) compute them here, never on a
long-lived pool thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def on_own_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread that ends when it returns, its OpenMP team with it.

    Raises:
        whatever ``fn`` raises.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="voice-features") as pool:
        return pool.submit(fn).result()
