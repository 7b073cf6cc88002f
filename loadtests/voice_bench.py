"""Voice latency: voice-to-voice and barge-in, at 1, 4 and 8 concurrent voice sessions.

Each voice session is a client over ``/v1/realtime`` that streams microphone-
like audio in real time (40 ms PCM16 chunks at 16 kHz, paced by the clock):
a spoken question (espeak-ng), then silence, turn after turn, with the
server's VAD (OpenAI's defaults: threshold 0.5, 300 ms prefix padding, 500 ms
silence) finding the turns and the server speaking the answers (24 kHz).

Measured at the client, from the moment the chunk holding the question's
last voiced sample was sent (``speech end``):

- ``input_audio.speech_stopped`` arrival (the VAD's hangover: the silence window);
- ``input_audio.transcript`` arrival (transcription, or its speculative copy);
- the first ``response.delta`` (time to first token);
- the first ``response.audio.delta`` (the first clause synthesized): the
  **voice-to-voice latency**.

Every third turn the client barges in: once the answer's first audio
arrived it streams a short utterance over it and measures, from the moment
the chunk holding that utterance's first voiced sample was sent, the arrival
of ``input_audio.speech_started`` (the client stops its playback there: the
audio heard stops) and of the answer's ``response.done``
(``interrupted``: the engine aborted it and freed its blocks).

The same sessions run against two servers started here: the default
(speculative answers at a 200 ms pause) and ``--voice-speculation false``
(the baseline: transcription starts when the silence window closes).

Targets (issue 20): voice-to-voice p50 under 800 ms for one session;
barge-in to audio stopped under 100 ms p95.

Writes ``--out`` (default ``docs/perf/voice.md``) and a json beside it.
Usage: ``python loadtests/voice_bench.py [--sessions 1 4 8] [--turns 6]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_proc import served  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from loadtests.speech import espeak_pcm16, silence_pcm16  # noqa: E402

RATE = 16000
CHUNK_MS = 40
CHUNK_BYTES = RATE * 2 * CHUNK_MS // 1000
VOICED = 500  # |sample| above this (of 32767) counts as voiced, for the client's own clock
QUESTIONS = [
    "What is the capital of France?",
    "How far away is the moon?",
    "Can you name three kinds of trees?",
    "Why is the sky blue?",
    "What should I cook for dinner tonight?",
    "How many legs does a spider have?",
]
BARGE = "Wait, stop, tell me something else."


def voiced_bounds(pcm: bytes) -> tuple[int, int]:
    """(first, last) voiced sample index of PCM16 ``pcm``."""
    x = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    idx = np.flatnonzero(x > VOICED)
    return int(idx[0]), int(idx[-1])


@dataclass(slots=True)
class Turn:
    """Client-side times of one voice turn, seconds from the speech end."""

    stopped: float | None = None
    transcript: float | None = None
    first_token: float | None = None
    first_audio: float | None = None
    barge_started: float | None = None  # from the barge-in's onset
    barge_done: float | None = None
    finish: str | None = None


@dataclass(slots=True)
class Session:
    turns: list[Turn] = field(default_factory=list)


class Mic:
    """Streams PCM in real time over one socket; remembers when each sample went."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.marks: dict[str, float] = {}  # name -> when its sample was sent
        self._pending: list[tuple[int, str]] = []  # (byte offset in the stream, name)
        self._sent = 0  # bytes sent
        self._queued = 0  # bytes queued, not yet sent

    def say(self, pcm: bytes, marks: dict[str, int]) -> None:
        """Queue ``pcm``; ``marks``: name -> sample index in it to time."""
        base = self._sent + self._queued
        for name, sample in marks.items():
            self._pending.append((base + 2 * sample, name))
        for lo in range(0, len(pcm), CHUNK_BYTES):
            self.queue.put_nowait(pcm[lo : lo + CHUNK_BYTES])
        self._queued += len(pcm)

    async def run(self) -> None:
        start = time.monotonic()
        n = 0
        silence = silence_pcm16(CHUNK_MS, RATE)
        while True:
            if self.queue.empty():
                chunk, queued = silence, 0
            else:
                chunk = self.queue.get_nowait()
                queued = len(chunk)
            self._queued -= queued
            await self.ws.send(
                json.dumps({"type": "input_audio.append", "audio": base64.b64encode(chunk).decode()})
            )
            now = time.monotonic()
            end = self._sent + len(chunk)
            # a mark's sample is in this chunk only if the chunk came from the queue
            for offset, name in list(self._pending) if queued else []:
                if offset < end:
                    self.marks[name] = now
                    self._pending.remove((offset, name))
            self._sent = end
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_MS / 1000 - time.monotonic()))


async def one_session(url: str, index: int, turns: int, speech: dict[str, bytes]) -> Session:
    session = Session()
    async with connect(url, subprotocols=["bargein.v1.json"], max_size=None) as ws:  # type: ignore[list-item]
        json.loads(await ws.recv())
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "defaults": {"temperature": 0, "max_tokens": 40},
                        "audio": {"input": {"sample_rate": RATE}, "output": {"sample_rate": 24000}},
                    },
                }
            )
        )
        mic = Mic(ws)
        sender = asyncio.create_task(mic.run())
        try:
            await asyncio.sleep(0.2 * index)  # sessions do not speak in lockstep
            for t in range(turns):
                session.turns.append(await one_turn(ws, mic, t, speech, barge=t % 3 == 2))
        finally:
            sender.cancel()
    return session


async def one_turn(ws: Any, mic: Mic, t: int, speech: dict[str, bytes], *, barge: bool) -> Turn:
    question = speech[QUESTIONS[t % len(QUESTIONS)]]
    _, last = voiced_bounds(question)
    mic.say(question, {f"end{t}": last})
    turn = Turn()
    response_id = None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        now = time.monotonic()
        end = mic.marks.get(f"end{t}")
        kind = event["type"]
        if end is None:
            continue
        since = now - end
        if kind == "input_audio.speech_stopped" and turn.stopped is None:
            turn.stopped = since
        elif kind == "input_audio.transcript" and turn.transcript is None:
            turn.transcript = since
        elif kind == "response.created":
            response_id = event["response_id"]
        elif kind == "response.delta" and turn.first_token is None and event["response_id"] == response_id:
            turn.first_token = since
        elif (
            kind == "response.audio.delta"
            and turn.first_audio is None
            and event["response_id"] == response_id
        ):
            turn.first_audio = since
            if barge:
                first, _ = voiced_bounds(speech[BARGE])
                mic.say(speech[BARGE], {f"barge{t}": first})
        elif kind == "input_audio.speech_started" and barge and turn.barge_started is None:
            onset = mic.marks.get(f"barge{t}")
            if onset is not None:
                turn.barge_started = now - onset
        elif kind == "response.done" and event["response_id"] == response_id:
            turn.finish = event["finish_reason"]
            if barge:
                onset = mic.marks.get(f"barge{t}")
                turn.barge_done = None if onset is None else now - onset
                await drain_barge_turn(ws)
            mic.say(silence_pcm16(800, RATE), {})  # a breath before the next question
            return turn


async def drain_barge_turn(ws: Any) -> None:
    """The barge-in utterance is a turn too: let its answer finish unheard."""
    answering = None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if event["type"] == "response.created":
            answering = event["response_id"]
        elif event["type"] == "response.done" and event["response_id"] == answering:
            return


def pct(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summarize(sessions: list[Session]) -> dict[str, Any]:
    turns = [t for s in sessions for t in s.turns]
    out: dict[str, Any] = {"turns": len(turns)}
    for name in ("stopped", "transcript", "first_token", "first_audio"):
        vals = [getattr(t, name) for t in turns if getattr(t, name) is not None]
        out[name] = {"p50": pct(vals, 50), "p95": pct(vals, 95), "n": len(vals)}
    for name in ("barge_started", "barge_done"):
        vals = [getattr(t, name) for t in turns if getattr(t, name) is not None]
        out[name] = {"p50": pct(vals, 50), "p95": pct(vals, 95), "n": len(vals)}
    out["interrupted"] = sum(1 for t in turns if t.finish == "interrupted")
    return out


def scrape(url: str) -> dict[str, float]:
    import httpx

    wanted = (
        "bargein_voice_speculations_total",
        "bargein_transcription_seconds_sum",
        "bargein_transcription_seconds_count",
    )
    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


async def run_level(ws_url: str, sessions: int, turns: int, speech: dict[str, bytes]) -> list[Session]:
    return list(await asyncio.gather(*(one_session(ws_url, i, turns, speech) for i in range(sessions))))


def ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.0f}"


def render(results: dict[str, dict[int, dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        "# Voice latency",
        "",
        f"`loadtests/voice_bench.py`, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{os.cpu_count()} cores, one run. Sessions stream audio in real time (40 ms chunks); "
        f"{args.turns} turns each, a barge-in every third; greedy answers of up to 40 tokens, spoken at 24 kHz.",
        "Times in ms at the client, from the chunk holding the question's last voiced sample "
        "(barge-in: from the chunk holding the interruption's first voiced sample).",
        "",
        "| server | sessions | speech_stopped p50 | transcript p50 | first token p50 | "
        "**voice-to-voice p50** | voice-to-voice p95 | barge-in → speech_started p50 / p95 | "
        "barge-in → response.done p50 / p95 | speculations adopted / dropped |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for server, levels in results.items():
        for n, r in levels.items():
            spec = r.get("speculations", {})
            lines.append(
                f"| {server} | {n} | {ms(r['stopped']['p50'])} | {ms(r['transcript']['p50'])} | "
                f"{ms(r['first_token']['p50'])} | **{ms(r['first_audio']['p50'])}** | {ms(r['first_audio']['p95'])} | "
                f"{ms(r['barge_started']['p50'])} / {ms(r['barge_started']['p95'])} | "
                f"{ms(r['barge_done']['p50'])} / {ms(r['barge_done']['p95'])} | "
                f"{spec.get('adopted', 0):.0f} / {spec.get('dropped', 0):.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("docs/perf/voice.md"))
    parser.add_argument("--flags", nargs="*", default=[], help="extra bargein serve flags")
    args = parser.parse_args()
    speech = {q: espeak_pcm16(q, RATE) for q in [*QUESTIONS, BARGE]}
    servers = {"default (speculative)": [], "--voice-speculation false": ["--voice-speculation", "false"]}
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for name, flags in servers.items():
        results[name] = {}
        with served([*flags, *args.flags, "--voice", "on"]) as url:
            ws_url = url.replace("http", "ws") + "/v1/realtime"
            for n in args.sessions:
                before = scrape(url)
                sessions = asyncio.run(run_level(ws_url, n, args.turns, speech))
                after = scrape(url)
                summary = summarize(sessions)
                summary["speculations"] = {
                    outcome: after.get(f'bargein_voice_speculations_total{{outcome="{outcome}"}}', 0)
                    - before.get(f'bargein_voice_speculations_total{{outcome="{outcome}"}}', 0)
                    for outcome in ("adopted", "dropped")
                }
                results[name][n] = summary
                print(name, n, json.dumps(summary), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, args))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
