"""A simulated speaker-to-microphone echo, for the echo canceller's tests and benchmark.

The server sends a spoken answer (float32 chunks at the output rate, faster
than real time); the simulated client plays it from when its first chunk
arrives, and its microphone hears it back ``delay_ms`` later than the
server's reference places it (the round trip and the devices' latencies, which
the canceller does not know), ``gain_db`` quieter, through a little reverb,
over a noise floor, and optionally with the user talking over it. The input
goes to the server in ``chunk_ms`` appends, each arriving (with jitter) when
its last sample was captured.

The echo is made independently of the code under test: one-shot libsoxr
resampling of the whole answer and a numpy delay, not ``PlaybackReference``'s
streaming resampler and placement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import soxr

if TYPE_CHECKING:
    from bargein.voice.tts import Synthesizer
    from bargein.voice.vad import SileroVad

RATE = 16000
# echo_bench.py's section of docs/perf/voice.md lies between these (voice_bench.py keeps it)
ECHO_BEGIN = "<!-- echo: loadtests/echo_bench.py --write docs/perf/voice.md -->"
ECHO_END = "<!-- /echo -->"


@dataclass(frozen=True)
class Scene:
    """One simulated room.

    Attributes:
        delay_ms: how much later the echo comes than the reference places it, ms.
        gain_db: the echo's level relative to what was sent, dB (negative).
        reverb_ms: RT60 of an exponentially decaying reverb tail, ms; 0: none.
        noise_dbfs: the microphone's white-noise floor, dBFS RMS; None: none.
        jitter_ms: each append arrives up to this much later than captured, ms (uniform).
        chunk_ms: input append size, ms.
        send_chunk_ms: output chunk size, ms.
        send_speed: the output is sent this many times faster than real time.
        seed: the noise's, the jitter's and the reverb's random seed.
    """

    delay_ms: int = 100
    gain_db: float = -10.0
    reverb_ms: int = 150
    noise_dbfs: float | None = -60.0
    jitter_ms: float = 10.0
    chunk_ms: int = 20
    send_chunk_ms: int = 200
    send_speed: float = 4.0
    seed: int = 0


def room_echo(played: npt.NDArray[np.float32], scene: Scene) -> npt.NDArray[np.float32]:
    """What the microphone hears of ``played`` (float32 [n] at 16 kHz, on the reference's
    placement): delayed, attenuated and reverberated, float32 [n]."""
    d = scene.delay_ms * RATE // 1000
    x = np.concatenate([np.zeros(d, np.float32), played])[: len(played)]
    if scene.reverb_ms:
        rng = np.random.default_rng(scene.seed + 1)
        n = scene.reverb_ms * RATE // 1000
        tail = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / n)  # -60 dB at reverb_ms
        ir = np.concatenate([[1.0], 0.3 * tail / np.sqrt(np.sum(tail**2))])
        x = np.convolve(x, ir)[: len(played)]
    return (x * 10 ** (scene.gain_db / 20)).astype(np.float32)


@dataclass
class Run:
    """What one simulated session gave: float32 [n] at 16 kHz each."""

    echo: npt.NDArray[np.float32]  # the echo alone, as the microphone heard it
    user: npt.NDArray[np.float32]  # the user's speech alone (zeros without one)
    mic: npt.NDArray[np.float32]  # what the client sent: echo + user + noise
    cleaned: npt.NDArray[np.float32]  # what the canceller gave back (aligned with mic)
    cpu_s: float  # process CPU seconds spent in the clean calls


def simulate(
    answer: npt.NDArray[np.float32],
    answer_rate: int,
    scene: Scene,
    clean: Callable[[npt.NDArray[np.float32], float], npt.NDArray[np.float32]],
    played: Callable[[npt.NDArray[np.float32], int, float, float], None],
    *,
    user: npt.NDArray[np.float32] | None = None,
    user_at_s: float = 0.0,
    lead_s: float = 0.5,
    tail_s: float = 1.0,
    t0: float = 1000.0,
    pause: tuple[float, float] | None = None,
    cut_s: float | None = None,
    paused: Callable[[float], None] | None = None,
    resumed: Callable[[float], None] | None = None,
    ended: Callable[[float], None] | None = None,
) -> Run:
    """Send ``answer`` (float32 at ``answer_rate``) from wall time ``t0 + lead_s``
    and feed the microphone to ``clean`` (``EchoPath.clean``'s signature) in
    appends, calling ``played`` (``EchoPath.played``'s) for each output chunk
    once it is sent, in wall-time order with the appends.

    Args:
        user: the user's speech, float32 at 16 kHz, mixed in at ``user_at_s``
            after the answer starts playing; None: the user is silent.
        pause: (at, length) seconds: the client's playback holds ``at`` seconds
            after it started, for ``length`` seconds (``paused`` and ``resumed``
            are called then).
        cut_s: the answer is cut this long after it started playing (``ended``
            is called then; what was not sent by then is not sent).
    """

    rng = np.random.default_rng(scene.seed)
    start = round((t0 + lead_s) * RATE)  # where the reference places the first sample
    hold_s = 0.0 if pause is None else pause[1]
    total = round((lead_s + len(answer) / answer_rate + hold_s + tail_s) * RATE)
    grid0 = round(t0 * RATE)
    played16 = soxr.resample(answer, answer_rate, RATE, quality="VHQ").astype(np.float32)
    if cut_s is not None:
        played16 = played16[: round(cut_s * RATE)]
    if pause is not None:
        at = round(pause[0] * RATE)
        played16 = np.concatenate(
            [played16[:at], np.zeros(round(pause[1] * RATE), np.float32), played16[at:]]
        )
    placed = np.zeros(total, np.float32)
    placed[start - grid0 : start - grid0 + len(played16)] = played16[: total - (start - grid0)]
    echo = room_echo(placed, scene)
    user_track = np.zeros(total, np.float32)
    if user is not None:
        at = start - grid0 + round(user_at_s * RATE)
        user_track[at : at + len(user)] = user[: total - at]
    noise = (
        np.zeros(total, np.float32)
        if scene.noise_dbfs is None
        else (rng.standard_normal(total) * 10 ** (scene.noise_dbfs / 20)).astype(np.float32)
    )
    mic = echo + user_track + noise
    # what the server does, in wall-time order: chunks sent, the pause and resume, the cut
    step = scene.send_chunk_ms * answer_rate // 1000
    start_at = t0 + lead_s
    sent = [(start_at + (lo / answer_rate) / scene.send_speed, lo) for lo in range(0, len(answer), step)]
    events: list[tuple[float, Callable[[], None]]] = [
        (at, _send(played, answer[lo : lo + step], answer_rate, lo, at)) for at, lo in sent
    ]
    if cut_s is not None:
        events = [e for e in events if e[0] <= start_at + cut_s]
        if ended is not None:
            events.append((start_at + cut_s, _at(ended, start_at + cut_s)))
    if pause is not None and paused is not None and resumed is not None:
        events.append((start_at + pause[0], _at(paused, start_at + pause[0])))
        events.append((start_at + pause[0] + pause[1], _at(resumed, start_at + pause[0] + pause[1])))
    events.sort(key=lambda e: e[0])
    n = scene.chunk_ms * RATE // 1000
    out: list[npt.NDArray[np.float32]] = []
    cpu = 0.0
    for lo in range(0, total - total % n, n):
        arrived = t0 + (lo + n) / RATE + rng.uniform(0, scene.jitter_ms / 1000)
        while events and events[0][0] <= arrived:
            events.pop(0)[1]()
        c0 = time.process_time()
        out.append(clean(mic[lo : lo + n], arrived))
        cpu += time.process_time() - c0
    cleaned = np.concatenate(out)
    m = len(cleaned)
    return Run(echo=echo[:m], user=user_track[:m], mic=mic[:m], cleaned=cleaned, cpu_s=cpu)


def _send(
    played: Callable[[npt.NDArray[np.float32], int, float, float], None],
    chunk: npt.NDArray[np.float32],
    rate: int,
    lo: int,
    sent_at: float,
) -> Callable[[], None]:
    """``played`` of the answer's chunk starting at its sample ``lo``, sent at ``sent_at``."""
    return lambda: played(chunk, rate, lo * 1000 / rate, sent_at)


def _at(fn: Callable[[float], None], at: float) -> Callable[[], None]:
    return lambda: fn(at)


def erle_db(mic: npt.NDArray[np.float32], cleaned: npt.NDArray[np.float32], frame: int = 160) -> float:
    """Echo return loss enhancement, dB: the energy of ``mic`` over that of ``cleaned``
    (both the echo alone), over the 10 ms frames where ``mic`` is within 30 dB of its loudest."""
    k = min(len(mic), len(cleaned)) // frame
    e_in = np.sum(mic[: k * frame].reshape(k, frame).astype(np.float64) ** 2, axis=1)
    e_out = np.sum(cleaned[: k * frame].reshape(k, frame).astype(np.float64) ** 2, axis=1)
    loud = e_in > e_in.max() * 1e-3
    return float(10 * np.log10(e_in[loud].sum() / max(e_out[loud].sum(), 1e-20)))


def turn_starts(vad: SileroVad, audio: npt.NDArray[np.float32]) -> list[float]:
    """Where a default ``server_vad`` (Silero + ``TurnDetector(TurnDetection())``)
    starts a turn in ``audio`` (float32 at 16 kHz), seconds from its start.
    """
    from bargein.voice.turns import SpeechStarted, TurnDetection, TurnDetector
    from bargein.voice.vad import FRAME_SAMPLES

    stream = vad.stream()
    detector = TurnDetector(TurnDetection())
    starts = []
    for lo in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        for event in detector.push(stream.probability(audio[lo : lo + FRAME_SAMPLES])):
            if isinstance(event, SpeechStarted):
                starts.append((lo + FRAME_SAMPLES) / RATE)
    return starts


ANSWER = (
    "Sure. The museum opens at nine in the morning and closes at six, except on Mondays "
    "when it is closed all day. Tickets cost twelve dollars for adults."
)
USER = "Wait, what about Sundays?"


def piper_answer(synthesizer: Synthesizer, rate: int = 24000, text: str = ANSWER) -> npt.NDArray[np.float32]:
    """``text`` spoken by the project's Piper voice,
    float32 at ``rate`` Hz (the session's output rate), as the server would send it."""
    speech = synthesizer.synthesize(text)
    audio = speech.audio.astype(np.float32) / 32768
    return soxr.resample(audio, synthesizer.sample_rate, rate, quality="VHQ").astype(np.float32)
