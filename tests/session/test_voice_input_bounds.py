"""Input audio bounds of one connection (issue 36): the pace of its appends,
long appends off the event loop, and a server-VAD turn that reaches
``max_input_audio_ms`` (fake models, a real Connection and Service)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bargein.protocol import events as pe
from bargein.session.voice_runtime.audio_input import InputPace
from bargein.session.voice_runtime.config import VoiceConfig
from tests.session.voice_fakes import (
    Client,
    FakeModels,
    FakeSynth,
    FakeTranscriber,
    FakeVad,
    FakeVadStream,
    done,
    silence,
    speech,
    voice_service,
)


async def client(config: VoiceConfig, vad: FakeVad | None = None) -> Client:
    models = FakeModels(vad=vad or FakeVad(), transcriber=FakeTranscriber(), synthesizer=FakeSynth())
    service, engine, models = await voice_service(models, config=config)
    return Client(service, engine, models)


def test_the_pace_allows_a_burst_then_the_speed_and_says_when_to_retry() -> None:
    pace = InputPace(speed=4.0, burst_ms=2000)
    assert pace.retry_after_s(0.0) is None
    pace.take(2000, 0.0)  # the whole burst at once
    assert pace.retry_after_s(0.0) is None  # within the burst: the next append is taken whole
    pace.take(1000, 0.0)
    assert pace.retry_after_s(0.0) == 0.25  # 1 s of audio past the burst is due in 1 / 4 s
    assert pace.retry_after_s(0.25) is None
    # at 4x real time for a minute, never refused
    pace = InputPace(speed=4.0, burst_ms=0)
    for k in range(600):
        now = k * 0.1
        assert pace.retry_after_s(now) is None
        pace.take(400, now)
    assert InputPace(speed=0, burst_ms=0).retry_after_s(0.0) is None  # 0: no bound


async def test_audio_past_its_pace_is_refused_with_rate_limited_and_not_taken() -> None:
    c = await client(VoiceConfig(speculate=False, max_input_audio_speed=4.0, input_audio_burst_ms=2000))
    try:
        await c.voice_session(output=False)
        await c.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
        await c.conn.handle(pe.InputAudioAppend(audio=speech(2000)), received_at=100.0)
        await c.conn.handle(pe.InputAudioAppend(audio=speech(200)), received_at=100.0)
        await c.conn.handle(pe.InputAudioAppend(audio=speech(200), event_id="fast"), received_at=100.01)
        (error,) = c.of(pe.ErrorEvent)
        assert error.code is pe.ErrorCode.RATE_LIMITED and error.retryable and error.event_id == "fast"
        assert error.retry_after_ms == 40  # 2.2 s of audio is due at 100.55, less a burst of 0.5 s
        assert "4x real time" in error.message
        await c.send(type="ping")
        await c.wait_for(pe.Pong)  # the connection goes on
        await c.conn.handle(pe.InputAudioAppend(audio=speech(200)), received_at=100.051)
        await c.send(type="input_audio.commit")
        (committed,) = await c.wait_for(pe.InputAudioCommitted)
        assert (committed.audio_start_ms, committed.audio_end_ms) == (0, 2400)  # the refused 200 ms left out
        assert len(c.of(pe.ErrorEvent)) == 1
    finally:
        await done(c)


class ThreadRecordingVad(FakeVad):
    """A FakeVad that notes the thread each frame ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def stream(self) -> FakeVadStream:
        vad = self

        class Stream(FakeVadStream):
            def probability(self, frame: np.ndarray) -> float:
                vad.threads.add(threading.current_thread().name)
                return super().probability(frame)

        return Stream(self)


async def test_a_long_append_runs_the_vad_off_the_event_loop_in_order() -> None:
    vad = ThreadRecordingVad()
    c = await client(VoiceConfig(speculate=False), vad)
    try:
        await c.voice_session(output=False)
        await c.audio(silence(100), chunk_ms=100)  # short: on the loop
        assert vad.threads == {threading.current_thread().name}
        vad.threads.clear()
        # one turn sent in two long appends: the thread's events keep their order
        await c.audio(silence(600) + speech(1000) + silence(1400), chunk_ms=1500)
        assert vad.threads and all(name.startswith("voice-input") for name in vad.threads)
        started, stopped, committed = (
            c.of(pe.InputAudioSpeechStarted)[0],
            c.of(pe.InputAudioSpeechStopped)[0],
            (await c.wait_for(pe.InputAudioCommitted))[0],
        )
        assert (started.audio_start_ms, stopped.audio_end_ms) == (404, 1696)
        assert (committed.audio_start_ms, committed.audio_end_ms) == (404, 1696)
    finally:
        await done(c)


async def test_a_turn_that_reaches_the_input_bound_ends_there_and_the_next_audio_is_a_new_turn() -> None:
    c = await client(VoiceConfig(speculate=False, max_input_audio_ms=1000))
    try:
        await c.voice_session(output=False, create_response=False)
        await c.audio(speech(2300) + silence(1000), chunk_ms=100)
        assert not c.of(pe.ErrorEvent), c.of(pe.ErrorEvent)
        committed = await c.wait_for(pe.InputAudioCommitted, 3)
        stopped = c.of(pe.InputAudioSpeechStopped)
        # cut at the bound twice, then the silence ends the last part
        assert [(e.audio_start_ms, e.audio_end_ms) for e in committed] == [
            (0, 1000),
            (1000, 2000),
            (2000, 2320),
        ]
        assert [e.audio_end_ms for e in stopped] == [1000, 2000, 2320]
        assert len(c.of(pe.InputAudioSpeechStarted)) == 3
        # every sample of the turn was transcribed: 16 kHz, 1 s, 1 s, then the rest
        assert c.models.transcriber.heard == [16000, 16000, 5120]
    finally:
        await done(c)


def test_a_refused_append_leaves_the_connection_unread_for_its_own_audio_at_the_pace() -> None:
    """The reader's pause after a refusal (issue 36, p04): until an append is
    due again, and at least the refused audio's own time at the pace, so a
    client alternating small appends the pace takes with big refused ones
    has no more audio read than the pace takes."""
    pace = InputPace(speed=4.0, burst_ms=0)
    pace.take(100, 0.0)
    wait = pace.retry_after_s(0.0)
    assert wait == pytest.approx(0.025)
    assert pace.unread_s(20_000, wait) == 5.0  # a refused 20 s append
    assert pace.unread_s(40, wait) == pytest.approx(0.025)
    assert InputPace(speed=0, burst_ms=0).unread_s(20_000, 0.0) == 0.0
