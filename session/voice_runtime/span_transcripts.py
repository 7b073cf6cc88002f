"""One transcription per span of a connection's input audio, whoever asks first.

A turn's audio up to a pause is transcribed for several readers: the
speculative answer or the partial transcript started at the pause (the voice
channel, in the voice threads), ``semantic_vad``'s end-of-turn score, which
reads the words once the audio says the turn may be over (the input-audio
threads), and the turn's final transcript when it ends at that pause. The
same span of audio gives the same text, and Whisper costs a few hundred
milliseconds of both cores: :class:`SpanTranscripts` runs it once per span
``(audio_start_ms, audio_end_ms)`` of the input timeline, and a second reader
of a span being transcribed waits for the first.

An entry is made when its transcription starts running, never when it is
queued: a queued job that is cancelled leaves nothing for a reader to wait on.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

Span = tuple[int, int]
"""(audio_start_ms, audio_end_ms) on a connection's input timeline."""

# Spans kept: a turn's last few pauses (its end reuses its last one).
MAX_SPANS = 8


class SpanTranscripts:
    """The transcripts of one connection's spans, computed at most once each.

    Thread-safe: called from the voice threads and the input-audio threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: OrderedDict[Span, Future[str]] = OrderedDict()

    def text(self, span: Span, transcribe: Callable[[], str], *, timeout_s: float | None = None) -> str:
        """The transcript of ``span``: computed here by ``transcribe()`` if no
        one has started it, else the one being computed or done.

        Args:
            span: the audio's (start, end) ms on the input timeline.
            transcribe: computes the text of the span's audio.
            timeout_s: how long to wait for another thread's transcription
                (None: as long as it takes).

        Raises:
            TimeoutError: another thread's transcription took over ``timeout_s``.
            Exception: whatever ``transcribe`` raised (here or in the thread
                that ran it); a failed span is forgotten, so a later reader
                tries again.
        """
        with self._lock:
            future = self._spans.get(span)
            mine = future is None
            if future is None:
                future = self._spans[span] = Future()
                future.set_running_or_notify_cancel()
                while len(self._spans) > MAX_SPANS:
                    self._spans.popitem(last=False)
        if not mine:
            return future.result(timeout=timeout_s)
        try:
            text = transcribe()
        except BaseException as exc:
            with self._lock:
                if self._spans.get(span) is future:
                    del self._spans[span]
            future.set_exception(exc)
            raise
        future.set_result(text)
        return text
