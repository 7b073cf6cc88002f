"""Confirmed interruptions: do coughs, backchannels, knocks, music and echo
leave a spoken answer alone, and do real interruptions still cut it fast?

One server (``bargein serve --voice on``, started here by voice_bench's
helper, or ``--url``). Each case is a fresh connection to ``/v1/realtime``
(server_vad, 16 kHz in, 24 kHz out, greedy, ``max_tokens`` 48,
``on_disconnect: cancel``) whose client:

- streams its microphone in real time (``CHUNK_MS`` chunks, each sent once
  its last sample would have been captured; silence when nothing is said);
- asks a question by ``response.create`` with text input, and plays the
  answer's ``response.audio.delta``s back to back from the first one's
  arrival (a playback clock: paused on ``response.audio.paused``, resumed
  on ``response.audio.resumed``, the buffer dropped when the answer is
  interrupted);
- once about 1 s of the answer has played, injects the case's sound into
  the microphone, then streams silence until the answer is done (or a
  timeout), stamping every event's arrival.

Sets (fixed seeds):

- **false**: synthesized coughs (band-passed noise bursts), espeak-ng's
  "ahem", "mm-hm", "uh-huh", "yeah", "okay" (en-us, en-gb), knocks (decaying
  150-300 Hz thuds with a click), 3 s of music at -20 dBFS (chords with a
  beat). Pass: never ``finish_reason: "interrupted"``, paused then resumed
  (or never paused: "not heard"), and the text and audio bytes equal the
  reference run of the same prompt (one uninterrupted run per prompt first).
- **real**: 2-8 word phrases in two espeak-ng voices. Pass: the answer's
  ``response.done`` has ``finish_reason: "interrupted"``. Audio stopped:
  from the send of the chunk holding the phrase's first voiced sample to
  ``response.audio.paused`` (``immediate``: to ``speech_started``, after
  which no audio of the answer comes). Decision: from the end of the
  decision window (the earlier of onset + 500 ms and the chunk holding the
  phrase's last voiced sample) to the interrupted ``response.done``.
- **echo**: no user sound; the client's own playback goes back into its
  microphone, delayed 50/100/150 ms at -10/-20 dB (no echo cancellation),
  for whole answers: self-interruptions and pauses counted. Then real
  phrases spoken over that echo.

The false and real sets run twice: ``interruption.mode`` ``confirm`` (the
default) and ``immediate`` (the baseline: every sound the VAD hears cuts).

Prints a table and writes ``--json``.
Usage: ``python loadtests/interruption_bench.py [--json docs/perf/interruptions.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from websockets.asyncio.client import connect  # noqa: E402

from loadtests.speech import espeak_pcm16  # noqa: E402
from loadtests.voice_bench import server  # noqa: E402
from loadtests.voice_utterances import voiced_bounds  # noqa: E402

RATE = 16000  # microphone
OUT_RATE = 24000  # answer audio
CHUNK_MS = 20
CHUNK = RATE * CHUNK_MS // 1000  # samples per microphone chunk
OUT_CHUNK = OUT_RATE * CHUNK_MS // 1000  # answer samples played per chunk
MAX_TOKENS = 48
INJECT_AFTER_MS = 1000  # answer played before the case's sound
WINDOW_MS = 500  # the decision window: onset + this, or the phrase's end if earlier
SETTLE_S = 1.2  # after the sound and the answer are done: late events (discarded)
PROMPTS = (
    "Tell me a story about a dragon.",
    "Describe a walk through a forest in autumn.",
    "Explain how a steam train works.",
    "Tell me about the history of the moon landing.",
)
VOICES = ("en-us", "en-gb")
BACKCHANNELS = ("mm-hm", "uh-huh", "yeah", "okay")
REAL_PHRASES = (
    "Stop, wait a second.",
    "Tell me about dogs instead.",
    "Hold on, what time is it?",
    "No, that is not what I asked.",
    "Wait, can you repeat that?",
    "Actually, let's talk about cats.",
    "Sorry, I have a question.",
    "Please stop talking for a moment.",
    "Can you speak more slowly please?",
    "Let me ask you something else.",
)
ECHO_PATHS = ((50, -10), (100, -10), (150, -10), (50, -20), (100, -20), (150, -20))


# ---- sounds (16 kHz mono PCM16) -------------------------------------------------------


def _pcm(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def _pad(x: np.ndarray, before_ms: int = 100, after_ms: int = 100) -> np.ndarray:
    return np.concatenate([np.zeros(RATE * before_ms // 1000), x, np.zeros(RATE * after_ms // 1000)])


def _bandpass(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    spectrum = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(len(x), 1 / RATE)
    spectrum[(freqs < lo) | (freqs > hi)] = 0
    return np.fft.irfft(spectrum, len(x))


def cough(seed: int) -> bytes:
    """A 200-300 ms burst of band-passed noise: a sharp attack, a fast decay, a breathy tail."""
    rng = np.random.default_rng(seed)
    n = int(RATE * rng.uniform(0.2, 0.3))
    t = np.arange(n) / RATE
    noise = _bandpass(rng.standard_normal(n), rng.uniform(250, 450), rng.uniform(2500, 4000))
    attack = np.minimum(1.0, t / rng.uniform(0.004, 0.01))
    envelope = attack * (0.8 * np.exp(-t / rng.uniform(0.03, 0.05)) + 0.2 * np.exp(-t / 0.12))
    x = noise * envelope
    return _pcm(_pad(x / np.abs(x).max() * 10 ** (-6 / 20)))


def knock(seed: int) -> bytes:
    """2-3 short decaying 150-300 Hz thuds, each with a click, 150-250 ms apart."""
    rng = np.random.default_rng(seed)
    hits = int(rng.integers(2, 4))
    gap = int(RATE * rng.uniform(0.15, 0.25))
    n = gap * hits + RATE // 10
    x = np.zeros(n)
    for h in range(hits):
        m = RATE // 8
        t = np.arange(m) / RATE
        thud = np.sin(2 * np.pi * rng.uniform(150, 300) * t) * np.exp(-t / rng.uniform(0.02, 0.04))
        click = np.zeros(m)
        click[:40] = _bandpass(rng.standard_normal(40 * 8), 2000, 6000)[:40] * np.exp(-np.arange(40) / 8)
        x[h * gap : h * gap + m] += thud + 0.5 * click
    return _pcm(_pad(x / np.abs(x).max() * 10 ** (-6 / 20)))


def music(seed: int, seconds: float = 3.0, dbfs: float = -20.0) -> bytes:
    """``seconds`` of chords (four per bar, a random progression) over a kick-drum beat, at ``dbfs`` RMS."""
    rng = np.random.default_rng(seed)
    roots = [60, 67, 69, 65, 62, 64]  # C G A F D E (MIDI)
    progression = rng.choice(roots, size=4, replace=False)
    bpm = rng.uniform(100, 130)
    beat = 60 / bpm
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    x = np.zeros(n)
    chord_s = seconds / len(progression)
    for i, root in enumerate(progression):
        lo, hi = int(i * chord_s * RATE), int((i + 1) * chord_s * RATE)
        minor = root in (69, 62, 64)
        for step in (0, 3 if minor else 4, 7, 12):
            f = 440 * 2 ** ((root + step - 69) / 12)
            for k, a in ((1, 1.0), (2, 0.4), (3, 0.2)):
                x[lo:hi] += a * np.sin(2 * np.pi * f * k * t[lo:hi])
    kick_n = int(0.15 * RATE)
    kt = np.arange(kick_n) / RATE
    kick = np.sin(2 * np.pi * (50 + 80 * np.exp(-kt / 0.02)) * kt) * np.exp(-kt / 0.05) * 6
    for b in np.arange(0, seconds, beat):
        s = int(b * RATE)
        e = min(n, s + kick_n)
        x[s:e] += kick[: e - s]
    fade = np.minimum(1.0, np.minimum(t, seconds - t) / 0.02)
    x *= fade
    x *= 10 ** (dbfs / 20) / np.sqrt(np.mean(x**2))
    return _pcm(_pad(x))


@dataclass(frozen=True, slots=True)
class Case:
    """One case: ``kind`` false, real or echo; ``sound`` PCM16 at 16 kHz (empty: none)."""

    name: str
    kind: str
    prompt: str
    sound: bytes = b""
    echo: tuple[int, int] | None = None  # (delay ms, gain dB)


def false_cases() -> list[Case]:
    out: list[tuple[str, bytes]] = [(f"cough #{s}", cough(s)) for s in range(5)]
    for voice in VOICES:
        out.append((f"ahem ({voice})", espeak_pcm16("ahem", RATE, voice=voice)))
    for word in BACKCHANNELS:
        for voice in VOICES:
            out.append((f"{word} ({voice})", espeak_pcm16(word, RATE, voice=voice)))
    out += [(f"knock #{s}", knock(s)) for s in range(3)]
    out += [(f"music #{s}", music(s)) for s in range(3)]
    return [Case(name, "false", PROMPTS[i % len(PROMPTS)], pcm) for i, (name, pcm) in enumerate(out)]


def real_cases() -> list[Case]:
    out = []
    for i, phrase in enumerate(REAL_PHRASES):
        for j, voice in enumerate(VOICES):
            pcm = espeak_pcm16(phrase, RATE, voice=voice)
            out.append(Case(f"{phrase} ({voice})", "real", PROMPTS[(2 * i + j) % len(PROMPTS)], pcm))
    return out


def echo_cases(answers: int, over: int) -> list[Case]:
    out = [
        Case(f"echo {d} ms {g} dB", "echo", PROMPTS[i % len(PROMPTS)], b"", (d, g))
        for i, (d, g) in enumerate(ECHO_PATHS[i % len(ECHO_PATHS)] for i in range(answers))
    ]
    for i in range(over):
        d, g = ECHO_PATHS[i % len(ECHO_PATHS)]
        phrase, voice = REAL_PHRASES[i % len(REAL_PHRASES)], VOICES[i % 2]
        pcm = espeak_pcm16(phrase, RATE, voice=voice)
        out.append(
            Case(f"{phrase} ({voice}) over echo {d} ms {g} dB", "echo+real", PROMPTS[i % 4], pcm, (d, g))
        )
    return out


# ---- the client -----------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """What one case saw; times in s from the case's start (monotonic) unless said."""

    name: str
    kind: str
    mode: str
    prompt: str
    echo: tuple[int, int] | None = None
    onset_sent: float | None = None  # chunk with the sound's first voiced sample sent
    end_sent: float | None = None  # ... its last
    first_audio: float | None = None
    played_ms_at_onset: float | None = None
    speech_started: list[float] = field(default_factory=list)
    paused: list[float] = field(default_factory=list)
    resumed: list[float] = field(default_factory=list)
    discarded: list[dict[str, Any]] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    done: float | None = None
    finish: str | None = None
    audio_done: float | None = None  # response.audio.done of the answer
    audio_end_ms: int | None = None  # ... its end_ms: where the answer's audio ended
    text: str = ""
    audio_bytes: int = 0
    audio_sha: str = ""
    identical: bool | None = None
    timed_out: bool = False
    errors: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    stop_ms: float | None = None
    decision_ms: float | None = None
    passed: bool | None = None
    cut: bool = False  # interrupted, or its audio ended short of the reference's
    outcome: str = ""


class Client:
    """One connection: a real-time microphone (the case's sound, plus the
    echo of the playback), a playback clock, every event stamped."""

    def __init__(self, ws: Any, case: Case, mode: str) -> None:
        self.ws = ws
        self.case = case
        self.mode = mode
        self.t0 = time.monotonic()
        self.r = Result(case.name, case.kind, mode, case.prompt, case.echo)
        self.audio: list[bytes] = []  # the answer's audio deltas, in order
        # 24 kHz audio received, not played: (arrival, bytes); a tick plays only
        # what had arrived when it began (this process may run a tick late,
        # and a speaker cannot play what it has not received)
        self.buffer: deque[tuple[float, bytes]] = deque()
        self.played = 0  # answer samples played (24 kHz)
        self.playing = False  # from the first delta on
        self.paused = False
        self.done = asyncio.Event()
        self.sound_sent = asyncio.Event()
        self._sound: deque[bytes] = deque()
        self._marks: list[tuple[int, str]] = []  # (chunk index in the sound, mark name)
        self._sound_index = 0
        self._echo: deque[float] | None = None
        if case.echo is not None:
            delay_ms, _ = case.echo
            self._echo = deque([0.0] * (RATE * delay_ms // 1000))
            self._gain = 10 ** (case.echo[1] / 20)
            self._resampler = soxr.ResampleStream(OUT_RATE, RATE, 1, dtype="float32")

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def start(self) -> None:
        json.loads(await self.ws.recv())  # session.created
        td = {"type": "server_vad", "interruption": {"mode": self.mode}}
        session = {
            "defaults": {"temperature": 0, "max_tokens": MAX_TOKENS},
            "on_disconnect": "cancel",
            "audio": {
                "input": {"sample_rate": RATE, "turn_detection": td},
                "output": {"sample_rate": OUT_RATE},
            },
        }
        await self.ws.send(json.dumps({"type": "session.update", "session": session}))
        while True:
            event = json.loads(await self.ws.recv())
            if event["type"] == "error":
                raise RuntimeError(f"session.update refused: {event}")
            if event["type"] == "session.updated":
                break

    def say(self, pcm: bytes) -> None:
        """Queue ``pcm``; mark the chunks that hold its first and last voiced samples."""
        first, last = voiced_bounds(pcm)
        self._marks = [(first // CHUNK, "onset"), (last // CHUNK, "end")]
        for lo in range(0, len(pcm), 2 * CHUNK):
            self._sound.append(pcm[lo : lo + 2 * CHUNK].ljust(2 * CHUNK, b"\0"))
        self._sound_index = 0

    def _play(self, tick_start: float) -> np.ndarray:
        """One chunk of playback (24 kHz float) from the audio that had arrived
        by ``tick_start`` (monotonic s), advancing the playback clock."""
        out = np.zeros(OUT_CHUNK, dtype=np.float32)
        if not self.playing or self.paused:
            return out
        filled = 0
        while filled < OUT_CHUNK and self.buffer and self.buffer[0][0] <= tick_start:
            arrived, pcm = self.buffer[0]
            take = pcm[: 2 * (OUT_CHUNK - filled)]
            out[filled : filled + len(take) // 2] = (
                np.frombuffer(take, dtype="<i2").astype(np.float32) / 32768
            )
            filled += len(take) // 2
            if len(take) < len(pcm):
                self.buffer[0] = (arrived, pcm[len(take) :])
            else:
                self.buffer.popleft()
        self.played += filled
        return out

    async def mic(self) -> None:
        """Send one chunk each ``CHUNK_MS``: the sound queued (else silence) plus the echo."""
        start, n = time.monotonic(), 0
        silence = np.zeros(CHUNK, dtype=np.float32)
        while True:
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_MS / 1000 - time.monotonic()))
            played = self._play(start + (n - 1) * CHUNK_MS / 1000)
            from_sound = bool(self._sound)
            x = (
                np.frombuffer(self._sound.popleft(), dtype="<i2").astype(np.float32) / 32768
                if from_sound
                else silence.copy()
            )
            if self._echo is not None:
                self._echo.extend((self._resampler.resample_chunk(played) * self._gain).tolist())
                while len(self._echo) < CHUNK:
                    self._echo.appendleft(0.0)  # the resampler's own delay, a few samples
                x = x + np.array([self._echo.popleft() for _ in range(CHUNK)], dtype=np.float32)
            chunk = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
            await self.ws.send(
                json.dumps({"type": "input_audio.append", "audio": base64.b64encode(chunk).decode()})
            )
            if from_sound:
                t = self.now()
                for index, name in self._marks:
                    if index == self._sound_index:
                        if name == "onset":
                            self.r.onset_sent = t
                            self.r.played_ms_at_onset = self.played * 1000 / OUT_RATE
                        else:
                            self.r.end_sent = t
                self._sound_index += 1
                if not self._sound:
                    self.sound_sent.set()

    async def read(self) -> None:
        async for frame in self.ws:
            t = self.now()
            e = json.loads(frame)
            kind = e.get("type", "")
            r = self.r
            if kind != "response.audio.delta" and kind != "response.delta":
                r.events.append((round(t, 4), kind))
            ours = e.get("response_id") == "ask"
            if kind == "response.audio.delta" and ours:
                pcm = base64.b64decode(e["audio"])
                self.audio.append(pcm)
                self.buffer.append((time.monotonic(), pcm))
                if r.first_audio is None:
                    r.first_audio = t
                    self.playing = True
            elif kind == "response.audio.done" and ours and r.audio_done is None:
                r.audio_done, r.audio_end_ms = t, e.get("end_ms")
            elif kind == "response.delta" and ours:
                r.text += e["text"]
            elif kind == "input_audio.speech_started":
                r.speech_started.append(t)
                if self.mode == "immediate" and self.playing and r.done is None:
                    self.buffer.clear()  # the answer is interrupted: no audio of it follows
            elif kind == "response.audio.paused" and ours:
                r.paused.append(t)
                self.paused = True
            elif kind == "response.audio.resumed" and ours:
                r.resumed.append(t)
                self.paused = False
            elif kind == "input_audio.discarded":
                r.discarded.append({"at": t, "reason": e.get("reason"), "transcript": e.get("transcript")})
            elif kind == "input_audio.transcript" and e.get("final"):
                r.transcripts.append(e.get("text", ""))
            elif kind == "error":
                r.errors.append(f"{e.get('code')}: {e.get('message')}")
            elif kind == "response.done" and ours and r.done is None:
                r.done, r.finish = t, e.get("finish_reason")
                if r.finish == "interrupted":
                    self.buffer.clear()
                    self.playing = False
                self.done.set()


async def wait_until(pred: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def run_case(url: str, case: Case, mode: str, timeout_s: float) -> tuple[Result, bytes]:
    """One case on its own connection; returns what it saw and the answer's audio."""
    async with connect(url, subprotocols=["bargein.v1.json"], max_size=None) as ws:  # type: ignore[list-item]
        c = Client(ws, case, mode)
        await c.start()
        tasks = [asyncio.create_task(c.read()), asyncio.create_task(c.mic())]
        try:
            c.t0 = time.monotonic()
            create = {
                "type": "response.create",
                "response_id": "ask",
                "input": [{"role": "user", "content": case.prompt}],
                "modalities": ["text", "audio"],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            await ws.send(json.dumps(create))
            r = c.r
            deadline = time.monotonic() + timeout_s
            if case.kind == "reference":
                r.timed_out = not await wait_until(lambda: r.done is not None, timeout_s)
            else:
                played_enough = await wait_until(
                    lambda: (
                        c.played * 1000 >= INJECT_AFTER_MS * OUT_RATE or (r.done is not None and not c.buffer)
                    ),
                    timeout_s,
                )
                if case.sound and played_enough and c.played * 1000 >= INJECT_AFTER_MS * OUT_RATE:
                    c.say(case.sound)
                elif case.sound:
                    r.outcome = "no injection: the answer ended first"
                    c.sound_sent.set()
                else:
                    c.sound_sent.set()

                def finished() -> bool:
                    if r.finish == "interrupted" and case.kind != "echo":
                        return True  # cut: nothing more to see of the answer
                    if not (c.sound_sent.is_set() and r.done is not None):
                        return False
                    if case.kind == "echo" and (c.buffer or c.paused):
                        return False  # the whole answer is played back into the microphone
                    if case.kind in ("real", "echo+real") and r.audio_done is None:
                        return False  # the answer's audio ends: cut, or played out
                    return True

                r.timed_out = not await wait_until(finished, max(0.0, deadline - time.monotonic()))
                if not r.timed_out and r.finish != "interrupted":
                    await asyncio.sleep(SETTLE_S)  # speech_stopped, discarded, a late pause
            audio = b"".join(c.audio)
            r.audio_bytes = len(audio)
            r.audio_sha = hashlib.sha256(audio).hexdigest()[:16]
            return r, audio
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# ---- judging ---------------------------------------------------------------------------


def judge(r: Result, ref: dict[str, Any] | None) -> None:
    """Fill the latencies, ``identical``, ``passed`` and ``outcome`` of a case."""
    onset = r.onset_sent
    if ref is not None:
        r.identical = (
            r.text == ref["text"] and r.audio_sha == ref["audio_sha"] and r.audio_bytes == ref["audio_bytes"]
        )
    after = [
        t for t in (r.paused if r.mode == "confirm" else r.speech_started) if onset is not None and t >= onset
    ]
    if after and onset is not None:
        r.stop_ms = (after[0] - onset) * 1000
    # Cut: the response was interrupted, or (its generation had ended: 48
    # tokens take ~2 s, their audio ~15 s) its audio ended short of the
    # reference's; the cut is known at response.done or response.audio.done.
    short = (
        ref is not None
        and r.audio_end_ms is not None
        and r.audio_end_ms < ref["audio_ms"] - 50
        and len(r.resumed) <= len(r.paused)
    )
    cut = r.cut = r.finish == "interrupted" or short
    cut_at = r.done if r.finish == "interrupted" else r.audio_done
    if onset is not None and cut and cut_at is not None and cut_at >= onset:
        window_end = (
            onset + WINDOW_MS / 1000 if r.end_sent is None else min(onset + WINDOW_MS / 1000, r.end_sent)
        )
        r.decision_ms = (cut_at - window_end) * 1000
    if r.outcome:
        r.passed = False
    elif r.timed_out:
        r.passed, r.outcome = False, "timed out"
    elif r.kind in ("real", "echo+real"):
        r.passed = cut
        r.outcome = (
            "cut" if cut else f"not cut ({r.finish}, paused {len(r.paused)}, resumed {len(r.resumed)})"
        )
        if not cut and r.done is not None and onset is not None and r.done < onset:
            r.outcome = "not cut: the answer was done before the phrase"
    elif r.kind == "false":
        if cut:
            r.passed, r.outcome = False, "cut"
        elif not r.paused and not r.speech_started:
            r.passed, r.outcome = bool(r.identical), "not heard"
        elif not r.paused:
            r.passed, r.outcome = bool(r.identical), "heard, not paused"
        elif len(r.resumed) >= len(r.paused):
            r.passed, r.outcome = bool(r.identical), "resumed"
        else:
            r.passed, r.outcome = False, "paused, never resumed"
        if r.outcome != "cut" and not r.identical:
            r.outcome += ", audio differs"
    elif r.kind == "echo":
        r.passed = not cut
        r.outcome = "self-interrupted" if cut else f"{len(r.paused)} pauses"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(results: list[Result]) -> dict[str, Any]:
    n = len(results)
    stops = [r.stop_ms for r in results if r.stop_ms is not None]
    decisions = [r.decision_ms for r in results if r.decision_ms is not None]
    return {
        "n": n,
        "passed": sum(bool(r.passed) for r in results),
        "cut": sum(r.cut for r in results),
        "paused": sum(bool(r.paused) for r in results),
        "resumed": sum(bool(r.paused) and len(r.resumed) >= len(r.paused) and not r.cut for r in results),
        "not_heard": sum(not r.paused and not r.speech_started for r in results),
        "identical": sum(bool(r.identical) for r in results),
        "timed_out": sum(r.timed_out for r in results),
        "stop_p50_ms": pct(stops, 0.5),
        "stop_p95_ms": pct(stops, 0.95),
        "decision_p50_ms": pct(decisions, 0.5),
        "decision_p95_ms": pct(decisions, 0.95),
        "pauses": sum(len(r.paused) for r in results),
    }


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def table(results: dict[str, list[Result]]) -> str:
    lines = [
        "| mode | set | n | passed | resumed | not heard | identical audio | cut | stop p50 / p95 ms | decision p50 / p95 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, rs in results.items():
        if not rs:
            continue
        s = summarize(rs)
        mode, kind = key.split("/")
        n = s["n"]
        lines.append(
            f"| {mode} | {kind} | {n} | {s['passed']} ({100 * s['passed'] / n:.0f}%) | {s['resumed']} "
            f"| {s['not_heard']} | {s['identical']} ({100 * s['identical'] / n:.0f}%) "
            f"| {s['cut']} ({100 * s['cut'] / n:.0f}%) | {fmt(s['stop_p50_ms'])} / {fmt(s['stop_p95_ms'])} "
            f"| {fmt(s['decision_p50_ms'])} / {fmt(s['decision_p95_ms'])} |"
        )
    return "\n".join(lines)


def case_table(rs: list[Result]) -> str:
    lines = [
        "| mode | set | case | outcome | paused / resumed | stop ms | decision ms | heard as |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rs:
        heard = "; ".join(f"{d['reason']}: {d['transcript']!r}" for d in r.discarded) or "; ".join(
            repr(t) for t in r.transcripts
        )
        lines.append(
            f"| {r.mode} | {r.kind} | {r.name} | {r.outcome} | {len(r.paused)} / {len(r.resumed)} "
            f"| {fmt(r.stop_ms)} | {fmt(r.decision_ms)} | {heard} |"
        )
    return "\n".join(lines)


# ---- the run ---------------------------------------------------------------------------


async def run_all(url: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[Result]]]:
    refs: dict[str, Any] = {}
    warm, _ = await run_case(url, Case("warm-up", "reference", PROMPTS[-1]), "confirm", 180.0)
    print(f"warm-up: done at {warm.done} s", flush=True)
    for prompt in PROMPTS:
        runs = []
        for _ in range(2 if prompt == PROMPTS[0] else 1):  # the first twice: is the reference reproducible?
            r, _audio = await run_case(url, Case(prompt, "reference", prompt), "confirm", args.timeout)
            runs.append(r)
        r = runs[0]
        refs[prompt] = {
            "text": r.text,
            "audio_bytes": r.audio_bytes,
            "audio_sha": r.audio_sha,
            "audio_ms": r.audio_bytes * 1000 // 2 // OUT_RATE,
            "finish": r.finish,
            "reproducible": all(x.audio_sha == r.audio_sha and x.text == r.text for x in runs),
            "done_s": r.done,
            "first_audio_s": r.first_audio,
        }
        print(f"reference {prompt!r}: {refs[prompt]['audio_ms']} ms of audio, done at {r.done} s", flush=True)
    falses, reals = false_cases(), real_cases()
    echoes = echo_cases(args.echo_answers, args.echo_over)
    if args.quick:
        falses, reals, echoes = falses[::7], reals[::9], echoes[:1] + echoes[-1:]
    results: dict[str, list[Result]] = {}
    for mode in ("confirm", "immediate"):
        for kind, cases in (("false", falses), ("real", reals)):
            key = f"{mode}/{kind}"
            results[key] = []
            for case in cases:
                r, _ = await run_case(url, case, mode, args.timeout)
                judge(r, refs[case.prompt])
                results[key].append(r)
                print(
                    f"[{key}] {case.name}: {r.outcome} stop {fmt(r.stop_ms)} decision {fmt(r.decision_ms)}",
                    flush=True,
                )
    plain = [c for c in echoes if c.kind == "echo"]
    over = [c for c in echoes if c.kind == "echo+real"]
    for key, cases, parallel in (("confirm/echo", plain, args.echo_parallel), ("confirm/echo+real", over, 1)):
        results[key] = []
        for lo in range(0, len(cases), parallel):
            batch = cases[lo : lo + parallel]
            done = await asyncio.gather(*(run_case(url, c, "confirm", args.echo_timeout) for c in batch))
            for case, (r, _) in zip(batch, done, strict=True):
                judge(r, refs[case.prompt])
                results[key].append(r)
                print(f"[{key}] {case.name}: {r.outcome}", flush=True)
    return refs, results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--url", help="a running server's HTTP base URL (default: start one)")
    parser.add_argument("--json", type=Path, default=Path("docs/perf/interruptions.json"))
    parser.add_argument("--timeout", type=float, default=30.0, help="s per case")
    parser.add_argument("--echo-timeout", type=float, default=60.0, help="s per echo case")
    parser.add_argument("--echo-answers", type=int, default=24, help="whole answers played back as echo")
    parser.add_argument("--echo-over", type=int, default=6, help="real phrases spoken over the echo")
    parser.add_argument("--echo-parallel", type=int, default=2, help="echo answers at a time")
    parser.add_argument("--quick", action="store_true", help="a few cases of each set (a smoke test)")
    parser.add_argument(
        "--flags", type=shlex.split, default=[], help="extra bargein serve flags, one quoted string"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.monotonic()
    with server(args.url, args.flags) as base:
        url = base.replace("http", "ws", 1) + "/v1/realtime"
        refs, results = asyncio.run(run_all(url, args))
    model = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next(
        (line.split(":", 1)[1].strip() for line in model.splitlines() if line.startswith("Model name")), "?"
    )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{cpu}, {platform.machine()}, {os.cpu_count()} cores",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "command": " ".join(["python", *sys.argv]),
        "chunk_ms": CHUNK_MS,
        "max_tokens": MAX_TOKENS,
        "inject_after_ms": INJECT_AFTER_MS,
    }
    summary = {key: summarize(rs) for key, rs in results.items()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "meta": meta,
                "references": refs,
                "summary": summary,
                "cases": {key: [asdict(r) for r in rs] for key, rs in results.items()},
            },
            indent=1,
        )
    )
    print()
    print(table(results))
    print()
    print(case_table([r for rs in results.values() for r in rs]))
    print()
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
