"""SpanTranscripts: one transcription per span of input audio, whoever asks first."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bargein.session.voice_runtime.span_transcripts import MAX_SPANS, SpanTranscripts
from tests.waiting import HANG_GUARD_S


def test_a_span_is_transcribed_once_and_a_second_reader_waits_for_the_first() -> None:
    spans = SpanTranscripts()
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        started.set()
        assert release.wait(HANG_GUARD_S)
        return "hello there"

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(spans.text, (0, 960), slow)
        assert started.wait(HANG_GUARD_S)
        second = pool.submit(spans.text, (0, 960), lambda: "never called")
        release.set()
        assert first.result(HANG_GUARD_S) == second.result(HANG_GUARD_S) == "hello there"
    assert calls == [1]
    assert spans.text((0, 960), lambda: "never called") == "hello there"
    assert spans.text((0, 1280), lambda: "longer") == "longer"  # another span: its own


def test_a_failed_transcription_fails_its_readers_and_is_tried_again_later() -> None:
    spans = SpanTranscripts()

    def fail() -> str:
        raise RuntimeError("whisper failed")

    with pytest.raises(RuntimeError, match="whisper failed"):
        spans.text((0, 960), fail)
    assert spans.text((0, 960), lambda: "second try") == "second try"


def test_a_reader_waits_at_most_its_timeout() -> None:
    spans = SpanTranscripts()
    started, release = threading.Event(), threading.Event()

    def stuck() -> str:
        started.set()
        assert release.wait(HANG_GUARD_S)
        return "late"

    with ThreadPoolExecutor(1) as pool:
        pool.submit(spans.text, (0, 960), stuck)
        assert started.wait(HANG_GUARD_S)
        with pytest.raises(TimeoutError):
            spans.text((0, 960), lambda: "never called", timeout_s=0.01)
        release.set()


def test_only_the_last_spans_are_kept() -> None:
    spans = SpanTranscripts()
    for end in range(MAX_SPANS + 1):
        spans.text((0, end), lambda end=end: f"text {end}")  # type: ignore[misc]
    assert spans.text((0, 0), lambda: "again") == "again"  # the oldest was forgotten
    assert spans.text((0, MAX_SPANS), lambda: "never called") == f"text {MAX_SPANS}"
