"""Stand-ins for the voice models, for session tests without a model.

- :class:`FakeVad`: speech probability from each frame's loudness (a frame
  of :func:`speech` is speech, a frame of :func:`silence` is not), or
  scripted probabilities, one per frame, while its script lasts.
- :class:`FakeTranscriber`: returns scripted texts, optionally only once a
  test opens its gate (it runs in the voice threads, as Whisper does), or
  raises while ``failures`` lasts.
- :class:`FakeSynth`: ``samples_per_char`` samples per code point of the
  segment it is given, each word ending where its characters end.
- :class:`FakeEndOfTurn`: scripted end-of-turn probabilities, one per scoring.

With them a real :class:`~bargein.session.voice_runtime.runtime.VoiceRuntime` (its thread
pool), a real :class:`~bargein.session.runtime.connection.Connection` and a real
:class:`~bargein.session.runtime.service.Service` run the voice loop; the engine is
``tests/session/test_service.py``'s ``ThreadedEngine``, stepped by the test.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bargein.engine.request import FinishReason, RequestOutput
from bargein.protocol import Decoder
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.connection import Connection
from bargein.session.runtime.service import Service
from bargein.session.voice_runtime.channel import plug
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.voice.tts import Speech, Timing, WordEnd
from tests.session.test_service import CountingLog, ThreadedEngine
from tests.waiting import HANG_GUARD_S, wait_until

RATE = 16000  # the tests' input rate: no resampling
FRAME_MS = 32
# A hang guard, never a timing assumption; past HANG_GUARD_S, so that a test
# that waits for a gate's thread to go on fails at its own guard first.
GATE_TIMEOUT_S = 2 * HANG_GUARD_S


def speech(ms: int) -> bytes:
    """``ms`` of PCM16 at RATE that FakeVad hears as speech (a loud square wave)."""
    n = RATE * ms // 1000
    x = np.where(np.arange(n) % 40 < 20, 12000, -12000).astype("<i2")
    return x.tobytes()


def silence(ms: int) -> bytes:
    """``ms`` of digital silence at RATE."""
    return bytes(2 * (RATE * ms // 1000))


class FakeVadStream:
    def __init__(self, vad: FakeVad) -> None:
        self._vad = vad

    def reset(self) -> None:
        self._vad.resets += 1

    def probability(self, frame: np.ndarray) -> float:
        assert frame.shape == (512,)
        self._vad.frames += 1
        if self._vad.script:
            return self._vad.script.popleft()
        return 0.95 if float(np.abs(frame).mean()) > 0.1 else 0.02


class FakeVad:
    """Loud frames are speech; ``script`` (if any) overrides, one value per frame."""

    def __init__(self, script: Iterable[float] = ()) -> None:
        self.script: deque[float] = deque(script)
        self.frames = 0
        self.resets = 0

    def stream(self) -> FakeVadStream:
        return FakeVadStream(self)


class FakeTranscriber:
    """Returns ``texts`` in turn (then ``default``), after its gate opens."""

    def __init__(self, *texts: str, default: str = "hello there") -> None:
        self.texts: deque[str] = deque(texts)
        self.default = default
        self.gate = threading.Event()
        self.gate.set()
        self.heard: list[int] = []  # samples of each call, in order
        self.started = threading.Event()  # set at each call, before the gate
        self.failures = 0  # the next calls that raise, as a failing Whisper does
        self.finished = 0  # calls that returned or raised

    def transcribe(self, audio: np.ndarray) -> str:
        self.heard.append(len(audio))
        self.started.set()
        try:
            assert self.gate.wait(GATE_TIMEOUT_S), "the test never opened the transcriber's gate"
            if self.failures:
                self.failures -= 1
                raise RuntimeError("can't start new thread")  # voice/stt.py at a pids limit
            return self.texts.popleft() if self.texts else self.default
        finally:
            self.finished += 1


class FakeSynth:
    """``samples_per_char`` samples a code point; a word ends where its characters do."""

    def __init__(self, sample_rate: int = 24000, samples_per_char: int = 480) -> None:
        self.sample_rate = sample_rate
        self.samples_per_char = samples_per_char
        self.texts: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: str | None = None  # a text containing it raises
        self.timed: list[str] = []  # texts whose timing alone was asked
        self.finished: list[str] = []  # texts whose synthesis returned or raised

    def synthesize(self, text: str) -> Speech:
        self.texts.append(text)
        try:
            assert self.gate.wait(GATE_TIMEOUT_S), "the test never opened the synthesizer's gate"
            if self.fail is not None and self.fail in text:
                raise RuntimeError("injected synthesis failure")
            words = _words_only(text, self.samples_per_char)
            if not words:
                return Speech(audio=np.zeros(0, dtype=np.int16), words=())
            return Speech(audio=np.full(len(text) * self.samples_per_char, 3000, dtype=np.int16), words=words)
        finally:
            self.finished.append(text)

    def timing(self, text: str) -> Timing:
        """:meth:`synthesize`'s length and words without its audio (noted in ``timed``)."""
        self.timed.append(text)
        speech = _words_only(text, self.samples_per_char)
        return Timing(num_samples=len(text) * self.samples_per_char if speech else 0, words=speech)


def _words_only(text: str, samples_per_char: int) -> tuple[WordEnd, ...]:
    """FakeSynth's word ends: each where its characters end."""
    return tuple(
        WordEnd(char_end=m.end(), sample_end=m.end() * samples_per_char) for m in re.finditer(r"\S+", text)
    )


class FakeEndOfTurn:
    """Scores each turn with the next of ``scores`` (then ``default``); notes the samples it heard."""

    def __init__(self, *scores: float, default: float = 0.9) -> None:
        self.scores: deque[float] = deque(scores)
        self.default = default
        self.heard: list[int] = []  # samples of each call, in order
        self.threads: list[str] = []  # the thread of each call
        self.failures = 0  # the next calls that raise

    def probability(self, audio: np.ndarray) -> float:
        self.heard.append(len(audio))
        self.threads.append(threading.current_thread().name)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected end-of-turn failure")
        return self.scores.popleft() if self.scores else self.default


class FakeTextEndOfTurn:
    """The text end-of-turn model: words ending with one of ``open_endings``
    score 0.01 (not the end of a message), any other 0.9; notes what it read."""

    def __init__(self, *open_endings: str) -> None:
        self.open_endings = open_endings
        self.read: list[str] = []

    def probability(self, text: str) -> float:
        self.read.append(text)
        return 0.01 if text.rstrip(" .").endswith(self.open_endings) else 0.9


@dataclass
class FakeModels:
    vad: FakeVad
    transcriber: FakeTranscriber
    synthesizer: FakeSynth
    end_of_turn: FakeEndOfTurn = field(default_factory=FakeEndOfTurn)
    text_end_of_turn: FakeTextEndOfTurn | None = None


class RecordingTemplate:
    """The engine's tokenizer: records each conversation it is given."""

    def __init__(self) -> None:
        self.conversations: list[list[dict[str, str]]] = []
        self.gate = threading.Event()  # tokenizing (in a thread) waits for it
        self.gate.set()
        self.rendered = 0  # calls that returned or raised

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> list[int]:
        self.conversations.append([dict(m) for m in conversation])
        try:
            assert self.gate.wait(GATE_TIMEOUT_S), "the test never opened the tokenizer's gate"
            return [1, 2, 3]
        finally:
            self.rendered += 1


class Client:
    """A Connection with a fake engine and fake voice models; records what it sends."""

    def __init__(self, service: VoiceService, engine: ThreadedEngine, models: FakeModels) -> None:
        self.service = service
        self.engine = engine
        self.models = models
        self.events: list[Any] = []
        self.conn = Connection(service, self._send, voice=plug(service.voice))
        self.n_out: dict[str, int] = {}  # tokens generated per stream

    async def _send(self, event: object) -> None:
        self.events.append(event)
        await asyncio.sleep(0)  # a socket write yields

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    async def wait_for(
        self, kind: type, count: int = 1, where: Callable[[Any], bool] = lambda e: True
    ) -> list[Any]:
        """The events of ``kind`` sent so far (those ``where`` accepts), once there are ``count``."""

        def found() -> list[Any] | None:
            events = [e for e in self.of(kind) if where(e)]
            return events if len(events) >= count else None

        return await wait_until(found, f"{count} {kind.__name__} (sent: {self.kinds()})")

    async def wait_until(self, predicate: Callable[[], object], what: str) -> None:
        await wait_until(predicate, what)

    def kinds(self) -> list[str]:
        """The names of the events sent so far, in order."""
        return [type(e).__name__ for e in self.events]

    async def audio(self, pcm: bytes, chunk_ms: int = 32) -> None:
        """``pcm`` as input_audio.append events of ``chunk_ms`` each."""
        step = 2 * RATE * chunk_ms // 1000
        for lo in range(0, len(pcm), step):
            await self.conn.handle(pe.InputAudioAppend(audio=pcm[lo : lo + step]))

    async def voice_session(
        self, *, output: bool = True, detection: str = "server_vad", **turn_detection: Any
    ) -> None:
        """16 kHz input, ``detection`` (server VAD) with ``turn_detection``, 24 kHz output (or text only)."""
        await self.send(
            type="session.update",
            session={
                "audio": {
                    "input": {
                        "sample_rate": RATE,
                        "turn_detection": {"type": detection, **turn_detection},
                    },
                    "output": {"sample_rate": 24000} if output else None,
                }
            },
        )

    async def send(self, **fields: Any) -> None:
        """A client event as the wire gives it (JSON, decoded and validated)."""
        await self.conn.handle(wire(**fields))

    def generate(self, stream_id: str, *texts: str, finish: FinishReason | None = None) -> None:
        """The engine writes ``texts`` (one token each), then ends with ``finish``."""
        steps: list[list[RequestOutput]] = []
        for text in texts:
            n = self.n_out.get(stream_id, 0) + 1
            self.n_out[stream_id] = n
            steps.append([_output(stream_id, (7,), text, n)])
        if finish is not None:
            steps.append([_output(stream_id, (), "", self.n_out.get(stream_id, 0), finish)])
        self.engine.run_steps(steps)

    async def close(self) -> None:
        await self.conn.close()


def wire(**fields: Any) -> Any:
    """The client event of a JSON frame with ``fields``."""
    return Decoder(fmt="json").decode(json.dumps(fields))


def _output(
    stream_id: str, tokens: tuple[int, ...], text: str, n: int, finish: FinishReason | None = None
) -> RequestOutput:
    return RequestOutput(
        request_id=stream_id,
        new_token_ids=tokens,
        text=text,
        num_prompt_tokens=3,
        num_output_tokens=n,
        finished=finish is not None,
        finish_reason=finish,
    )


class VoiceService(Service):
    """A Service and the voice runtime its connections are plugged into (as the app holds both)."""

    def __init__(self, *args: Any, voice: VoiceRuntime, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.voice = voice


async def voice_service(
    models: FakeModels | None = None,
    *,
    config: VoiceConfig | None = None,
    session: SessionConfig | None = None,
) -> tuple[VoiceService, ThreadedEngine, FakeModels]:
    """A started Service on a ThreadedEngine with fake voice models."""
    models = models or FakeModels(vad=FakeVad(), transcriber=FakeTranscriber(), synthesizer=FakeSynth())
    engine = ThreadedEngine()
    engine.tokenizer = RecordingTemplate()  # type: ignore[assignment]
    runtime = VoiceRuntime(models, config or VoiceConfig())
    service = VoiceService(engine, CountingLog(), session or SessionConfig(), secret=b"k", voice=runtime)
    await service.start()
    return service, engine, models


async def stop(service: VoiceService) -> None:
    await service.stop()
    service.voice.close()


async def done(c: Client) -> None:
    """Close ``c``'s connection, then stop its service and voice runtime."""
    await c.close()
    await stop(c.service)
