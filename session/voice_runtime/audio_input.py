"""One connection's input audio: resampled, bounded, paced, and cut into turns.

:class:`VoiceInput` resamples the appended PCM16 to 16 kHz, removes the
echo of the audio the connection was sent (``voice/echo.py``: the voice
channel reports each chunk it sends with :meth:`VoiceInput.played`, and the
playback's pauses, resumes and cuts), keeps the
uncommitted audio (bounded), runs the VAD frame by frame and the turn
detector on its probabilities (``server_vad``'s, or ``semantic_vad``'s, which
scores each pause with the end-of-turn model on the audio held, in the
input-audio threads), and returns what the detector saw; the voice
channel (``channel.py``) turns that into protocol events, barge-ins and
turns. Nothing here sends.

Two bounds keep one client's audio from costing the others (issue 36):
:class:`InputPace` refuses audio sent faster than a multiple of real time
(beyond a burst), after which the connection's frames are left unread for
a while (:attr:`VoiceInput.unread_until`: TCP paces the client), and a long
append is resampled and run through the VAD in :meth:`VoiceRuntime.run_input`'s
threads, not on the event loop. With server VAD a turn that reaches
``max_input_audio_ms`` ends there, as a silence would end it, so the audio
after it is a new turn, never a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bargein.session.voice_runtime.end_of_turn import EndOfTurnScorer
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.session.voice_runtime.settings import Detection, SessionAudio
from bargein.session.voice_runtime.span_transcripts import SpanTranscripts
from bargein.voice.audio import Resampler, pcm16_to_float
from bargein.voice.echo import EchoPath
from bargein.voice.errors import InputAudioFull
from bargein.voice.input_buffer import InputAudioBuffer
from bargein.voice.semantic_turns import SemanticTurnDetection, SemanticTurnDetector
from bargein.voice.turns import SpeechPaused, SpeechStopped, TurnDetector, TurnEvent
from bargein.voice.vad import FRAME_SAMPLES, SAMPLE_RATE

# An append at least this long is resampled and run through the VAD off the
# event loop (about 2 ms of CPU per 100 ms of audio); shorter ones, what a
# live client sends every 20-100 ms, stay on it and skip the thread hand-off.
OFF_LOOP_MS = 500


class InputPace:
    """How far one connection's input audio runs ahead of real time (a GCRA
    token bucket in audio milliseconds).

    Audio may arrive up to ``speed`` times faster than real time, plus a
    burst of ``burst_ms`` of audio ahead of that pace (a client that held a
    second or two of speech through a network stall sends it at once). An
    append is taken whole while the audio taken so far is within the burst,
    so one append of any size the frame limit allows can pass.

    Args:
        speed: the multiple of real time allowed; 0: no bound.
        burst_ms: audio that may run ahead of ``speed``, milliseconds.
    """

    def __init__(self, *, speed: float, burst_ms: int) -> None:
        self._speed = speed
        self._burst_s = 0.0 if speed <= 0 else burst_ms / 1000 / speed
        self._due_s = float("-inf")  # when the audio taken so far is due at ``speed`` (monotonic s)

    def retry_after_s(self, now: float) -> float | None:
        """Seconds until an append is taken again, or None: take it now.

        Args:
            now: when the append arrived, monotonic seconds.
        """
        if self._speed <= 0:
            return None
        wait = self._due_s - now - self._burst_s
        return wait if wait >= 0.001 else None  # under a millisecond: rounding, not a client ahead

    def take(self, audio_ms: float, now: float) -> None:
        """Count ``audio_ms`` of audio taken at ``now`` (monotonic seconds)."""
        if self._speed > 0:
            self._due_s = max(self._due_s, now) + audio_ms / 1000 / self._speed

    def unread_s(self, audio_ms: float, retry_after_s: float) -> float:
        """Seconds to leave the connection's frames unread after refusing an
        append of ``audio_ms``: until an append is taken again, and at least
        the refused audio's own time at ``speed``, so refused audio is read
        no faster than taken audio (a client alternating small appends the
        pace takes with big ones it refuses gains nothing)."""
        return max(retry_after_s, audio_ms / 1000 / self._speed) if self._speed > 0 else 0.0


class VoiceInput:
    """One connection's input audio, its VAD and its turns.

    Args:
        runtime: the process's voice models.
        settings: the audio settings in force (see :meth:`apply`).
    """

    def __init__(self, runtime: VoiceRuntime, settings: SessionAudio) -> None:
        self._runtime = runtime
        self._vad = runtime.models.vad.stream()
        self.settings = settings
        self.buffer = InputAudioBuffer(sample_rate=SAMPLE_RATE, max_ms=runtime.config.max_input_audio_ms)
        # each span of this input transcribed once, for the channel and the end-of-turn score
        self.transcripts = SpanTranscripts()
        self._frame_ms = FRAME_SAMPLES * 1000 // SAMPLE_RATE
        self._resampler = Resampler(settings.input_rate, SAMPLE_RATE)
        self._pending = np.zeros(0, dtype=np.float32)  # samples short of a VAD frame
        # the echo of the audio this connection was sent, removed from its
        # input before the VAD and the buffer see it (a client without echo
        # cancellation would otherwise barge in on the answer with it)
        self._echo = EchoPath() if runtime.config.echo_cancellation else None
        # semantic_vad reading the words waits for a transcription at a pause:
        # on a thread of this connection's own, never holding a shared input thread
        # (another connection's barge-in waits for none)
        self._own_thread: ThreadPoolExecutor | None = None
        self._detector = self._new_detector()
        config = runtime.config
        self._pace = InputPace(speed=config.max_input_audio_speed, burst_ms=config.input_audio_burst_ms)
        # Until when the connection's reader leaves its frames unread
        # (monotonic s), after an append refused for its pace: what the client
        # sends meanwhile waits in its socket (TCP backpressure), instead of
        # costing the event loop a decode and a refusal per frame.
        self.unread_until = float("-inf")
        # (input-timeline ms after an append, monotonic time it arrived): when
        # the frame of a given ms arrived, for the voice-to-voice latency
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=512)

    def apply(self, settings: SessionAudio) -> None:
        """New settings: a new input rate restarts the resampler; new turn
        detection parameters restart the detector (the buffer is kept)."""
        old, self.settings = self.settings, settings
        if settings.input_rate != old.input_rate:
            self._flush_resampler()
            self._resampler = Resampler(settings.input_rate, SAMPLE_RATE)
        if settings.turn_detection != old.turn_detection:
            self._pending = np.zeros(0, dtype=np.float32)
            self._detector = self._new_detector()

    def _new_detector(self) -> TurnDetector | SemanticTurnDetector | None:
        params = self.settings.turn_detection
        if params is None:
            return None
        if isinstance(params, SemanticTurnDetection):
            models = self._runtime.models
            text = models.text_end_of_turn
            if text is not None and self._own_thread is None:
                self._own_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voice-input-turn")
            score = EndOfTurnScorer(
                models.end_of_turn,
                self.buffer,
                words=None if text is None else (text, self.transcripts, models.transcriber.transcribe),
                completion_threshold=params.completion_threshold,
            )
            return SemanticTurnDetector(params, score, frame_ms=self._frame_ms, start_ms=self.buffer.total_ms)
        return TurnDetector(params, frame_ms=self._frame_ms, start_ms=self.buffer.total_ms)

    @property
    def turn_detection(self) -> Detection | None:
        """The detector's parameters, or None without turn detection."""
        return self.settings.turn_detection

    @property
    def in_speech(self) -> bool:
        """Whether the detector is inside a turn now."""
        return self._detector is not None and self._detector.in_speech

    def too_fast(self, pcm: bytes, received_at: float) -> float | None:
        """Seconds until the next append is taken, when this connection's
        audio already ran past its pace (:class:`InputPace`); None: take it.
        A refused append also sets :attr:`unread_until`.

        Args:
            pcm: the append's PCM16 at the input rate.
            received_at: when the append arrived, monotonic seconds.
        """
        wait_s = self._pace.retry_after_s(received_at)
        if wait_s is not None:
            audio_ms = len(pcm) * 500 / self.settings.input_rate  # 2 bytes a sample
            self.unread_until = received_at + self._pace.unread_s(audio_ms, wait_s)
        return wait_s

    async def feed(self, pcm: bytes, received_at: float) -> list[tuple[TurnEvent, np.ndarray | None]]:
        """:meth:`append`, in the input-audio threads when ``pcm`` holds at
        least ``OFF_LOOP_MS`` of audio, or always with ``semantic_vad`` (its
        detector scores a pause with the end-of-turn model as it reaches it,
        so the audio after the pause waits for the score). The caller holds
        the connection's lock, so appends are applied in the order they came.

        Raises:
            what :meth:`append` raises.
        """
        # semantic_vad may run the end-of-turn model (~20 ms) on any frame: never on the loop
        semantic = isinstance(self._detector, SemanticTurnDetector)
        if not semantic and len(pcm) * 500 // self.settings.input_rate < OFF_LOOP_MS:  # 2 bytes a sample
            return self.append(pcm, received_at)
        if semantic and self._own_thread is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._own_thread, lambda: self.append(pcm, received_at))
        return await self._runtime.run_input(lambda: self.append(pcm, received_at))

    # What the client plays, for the echo canceller. The voice channel calls
    # these as it sends the answer's audio (times: time.monotonic(), the
    # clock of ``received_at``); without echo cancellation they do nothing.

    def played(self, samples: np.ndarray, sample_rate: int, start_ms: float, sent_at: float) -> None:
        """A chunk of a response's audio was sent to the client (call it for
        every chunk, in order, when it is sent).

        Args:
            samples: float32 ``[n]`` mono in [-1, 1] at ``sample_rate``, the
                chunk as sent (before its PCM16 encoding).
            sample_rate: the session's output rate, Hz.
            start_ms: where the chunk starts on the response's output timeline, ms.
            sent_at: when it was sent, monotonic seconds.
        """
        if self._echo is not None:
            self._echo.played(samples, sample_rate, start_ms, sent_at)

    def playback_paused(self, at: float) -> None:
        """The client's playback holds from ``at`` (monotonic s): what was sent waits."""
        if self._echo is not None:
            self._echo.paused(at)

    def playback_resumed(self, at: float) -> None:
        """The client's playback goes on from ``at`` (monotonic s)."""
        if self._echo is not None:
            self._echo.resumed(at)

    def playback_ended(self, at: float) -> None:
        """The response's audio stops at ``at`` (monotonic s): a barge-in's cut,
        a truncation, a cancel; what the client had not played by then never
        plays. Not needed after an answer that played to its end."""
        if self._echo is not None:
            self._echo.ended(at)

    def close(self) -> None:
        """The connection is gone: its own input thread ends (after what it runs)."""
        if self._own_thread is not None:
            self._own_thread.shutdown(wait=False, cancel_futures=True)

    def append(self, pcm: bytes, received_at: float) -> list[tuple[TurnEvent, np.ndarray | None]]:
        """Append PCM16 at the input rate; return what the detector saw in it,
        each with the turn's audio (float32, 16 kHz) for a stop (taken: the
        buffer drops it) and a pause (a copy, for a speculative start).

        With the detector on, a turn whose audio reaches ``max_input_audio_ms``
        ends there (a :class:`SpeechStopped` at the end of the audio held) and
        the rest of ``pcm`` goes on into the next one.

        Raises:
            ValueError: not whole PCM16 samples.
            bargein.voice.input_buffer.InputAudioFull: without the detector,
                the uncommitted audio would pass ``max_input_audio_ms``
                (nothing is appended).
        """
        samples = self._resampler.process(pcm16_to_float(pcm))
        if self._echo is not None:
            samples = self._echo.clean(samples, received_at)
        if self._detector is None:
            self.buffer.append(samples)
            seen: list[tuple[TurnEvent, np.ndarray | None]] = []
        else:
            seen = self._detect_all(samples)
        self._arrivals.append((self.buffer.total_ms, received_at))
        self._pace.take(len(pcm) * 500 / self.settings.input_rate, received_at)
        return seen

    def _detect_all(self, samples: np.ndarray) -> list[tuple[TurnEvent, np.ndarray | None]]:
        """Hold ``samples`` and run the detector over them, ending the turn
        in progress each time the audio held reaches its bound."""
        seen: list[tuple[TurnEvent, np.ndarray | None]] = []
        while True:
            room = self.buffer.free_samples
            self.buffer.append(samples[:room])
            seen += self._detect(samples[:room])
            samples = samples[room:]
            if not len(samples):
                return seen
            seen += self._end_at_bound()

    def _detect(self, samples: np.ndarray) -> list[tuple[TurnEvent, np.ndarray | None]]:
        """Run the VAD and the detector over ``samples`` (already held)."""
        assert self._detector is not None
        frames = np.concatenate([self._pending, samples])
        usable = len(frames) - len(frames) % FRAME_SAMPLES
        self._pending = frames[usable:]
        seen: list[tuple[TurnEvent, np.ndarray | None]] = []
        for lo in range(0, usable, FRAME_SAMPLES):
            for event in self._detector.push(self._vad.probability(frames[lo : lo + FRAME_SAMPLES])):
                audio = None
                if isinstance(event, SpeechStopped):
                    audio = self.buffer.take(event.audio_start_ms, event.audio_end_ms)
                elif isinstance(event, SpeechPaused):
                    audio = self.buffer.read(event.audio_start_ms, event.audio_end_ms)
                seen.append((event, audio))
        # bounded without a turn end: only what the detector's turn may still need stays
        self.buffer.trim_before(self._detector.keep_from_ms)
        return seen

    def _end_at_bound(self) -> list[tuple[TurnEvent, np.ndarray | None]]:
        """The audio held reached ``max_input_audio_ms``: a turn in progress
        ends here with all it holds, as a silence would end it (refusing the
        audio instead would keep the VAD from ever hearing the silence that
        ends the turn); audio outside a turn (a prefix padding as long as the
        bound) is dropped. Detection starts afresh after it."""
        assert self._detector is not None
        start_ms = self._detector.turn_start_ms
        end_ms = self.buffer.total_ms
        if start_ms is None:
            self.buffer.clear()
            seen: list[tuple[TurnEvent, np.ndarray | None]] = []
        else:
            stopped = SpeechStopped(audio_start_ms=start_ms, audio_end_ms=end_ms)
            seen = [(stopped, self.buffer.take(start_ms, end_ms))]
        self.reset()
        return seen

    def take_all(self) -> tuple[int, int, np.ndarray]:
        """``input_audio.commit``: all uncommitted audio, its start and end ms."""
        self._flush_resampler()
        end = self.buffer.total_ms
        start = end - self.buffer.duration_ms
        audio = self.buffer.take(start, end)
        self.reset()
        return start, end, audio

    def clear(self) -> None:
        """``input_audio.clear``: drop the uncommitted audio (the timeline goes on)."""
        self._flush_resampler()
        self.buffer.clear()
        self.reset()

    def _flush_resampler(self) -> None:
        """Put the samples still in the resampler's filter (about 20 ms at
        24 kHz) on the timeline, so that it ends where the client's appends
        end (8.2); the next append starts a new resampler stream."""
        tail = self._resampler.flush()
        if self._echo is not None:
            tail = np.concatenate([self._echo.clean(tail, None), self._echo.flush()])
        with contextlib.suppress(InputAudioFull):  # at the bound those few ms are dropped
            self.buffer.append(tail)

    def reset(self) -> None:
        """Restart the VAD and the detector (after a commit or a clear): the
        next frame starts at the end of the input timeline."""
        self._pending = np.zeros(0, dtype=np.float32)
        self._vad.reset()
        if self._detector is not None:
            self._detector.reset(self.buffer.total_ms)

    def arrival_of(self, ms: int) -> float | None:
        """When the append holding input-timeline ``ms`` arrived (monotonic s)."""
        for end, at in self._arrivals:
            if end >= ms:
                return at
        return None
