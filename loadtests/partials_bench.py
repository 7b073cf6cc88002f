"""Transcribing and prefilling while the user speaks: end of turn to first token, three ways.

One voice session per server, text answers (no synthesis, so the first
token is what is timed), a conversation that grows turn by turn under a
system prompt of a few hundred tokens. Each turn is espeak-ng speech with a
mid-sentence pause (``--pause-ms``, past the 200 ms pause, short of the
silence window), streamed in real time (40 ms chunks at 16 kHz, paced by the
clock). Three servers, started here one after the other on the same flags
but these:

- ``answer``: the default: a speculative answer at each pause (issue 20);
- ``prefill``: ``--voice-speculation false``: a partial transcript and a
  prefill-only request at each pause (issue 38);
- ``neither``: ``--voice-speculation false --voice-prefill false``: partial
  transcripts only, the prompt prefilled when the turn ends.

Measured at the client from the moment the chunk holding the turn's last
voiced sample was sent: ``input_audio.speech_stopped`` (the silence window),
the final ``input_audio.transcript``, the first ``response.delta`` (time to
first token); and ``speech_stopped`` to the first token (what the end of the
turn still costs). From the server's ``/debug/engine``: tokens prefilled
speculatively and, of those, reused by a turn's request.

Usage: ``python loadtests/partials_bench.py [--turns 6] [--out docs/perf/partials.md]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_proc import served  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from loadtests.speech import espeak_pcm16, silence_pcm16  # noqa: E402

RATE = 16000
CHUNK_MS = 40
SILENCE_MS = 800  # the window: longer than the mid-sentence pause
MODES = {
    "answer": [],
    "prefill": ["--voice-speculation", "false"],
    "neither": ["--voice-speculation", "false", "--voice-prefill", "false"],
}
INSTRUCTIONS = (
    "You are the voice assistant of a small restaurant booking service in a riverside town. "
    "You help callers book, move and cancel tables, answer questions about opening hours, the menu, "
    "allergies, parking, accessibility, private rooms, children's seating and gift vouchers. "
    "The restaurants you book are: The Old Bridge (Italian, 40 seats, terrace in summer), Saffron "
    "(Indian, 60 seats, vegetarian menu), Harbour Lights (seafood, 30 seats, closed Mondays) and "
    "The Mill (British, 80 seats, private room for 20). Lunch is served from twelve to half past two, "
    "dinner from six to ten. Always confirm the day, the time, the number of people and a name. "
    "Keep every answer short: one or two sentences, spoken, no lists, no symbols."
)
TURNS = [
    ("I would like to book a table", "for four people on Friday evening."),
    ("Is the terrace at The Old Bridge", "open in the evening?"),
    ("Can you move my booking", "from Friday to Saturday at eight?"),
    ("Do you have a vegetarian menu", "at Saffron for a group of six?"),
    ("Is there parking near", "Harbour Lights on a Sunday?"),
    ("Please book the private room", "at The Mill for twenty people next Thursday."),
]


def spoken(text: str) -> bytes:
    """``text`` by espeak-ng without its leading and trailing silence, so the
    pause between two parts is the one this script puts there."""
    x = np.frombuffer(espeak_pcm16(text, RATE), dtype="<i2")
    loud = np.flatnonzero(np.abs(x) > 300)
    return x[loud[0] : loud[-1] + 1].tobytes()


def chunks(pcm: bytes) -> list[bytes]:
    step = RATE * 2 * CHUNK_MS // 1000
    return [pcm[lo : lo + step] for lo in range(0, len(pcm), step)]


async def one_session(url: str, turns: int, pause_ms: int) -> list[dict[str, float]]:
    """The turns of one session; per turn the latencies in seconds."""
    results: list[dict[str, float]] = []
    async with connect(url.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "instructions": INSTRUCTIONS,
                        "defaults": {"temperature": 0, "max_tokens": 24},
                        "audio": {
                            "input": {
                                "sample_rate": RATE,
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": SILENCE_MS},
                            },
                            "output": None,
                        },
                    },
                }
            )
        )
        marks: dict[str, float] = {}
        events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()

        async def reader() -> None:
            async for frame in ws:
                events.put_nowait((time.monotonic(), json.loads(frame)))

        read = asyncio.create_task(reader())
        try:
            for t in range(turns):
                first, second = TURNS[t % len(TURNS)]
                head = silence_pcm16(300, RATE) + spoken(first) + silence_pcm16(pause_ms, RATE)
                tail = spoken(second)
                audio = chunks(head) + chunks(tail)
                last_voiced = len(chunks(head)) + len(chunks(tail)) - 1
                audio += chunks(silence_pcm16(SILENCE_MS + 1500, RATE))
                start = time.monotonic()
                for i, chunk in enumerate(audio):
                    # paced by the clock, as a microphone sends
                    await asyncio.sleep(max(0.0, start + i * CHUNK_MS / 1000 - time.monotonic()))
                    await ws.send(
                        json.dumps({"type": "input_audio.append", "audio": base64.b64encode(chunk).decode()})
                    )
                    if i == last_voiced:
                        marks["end"] = time.monotonic()
                results.append(await _turn(events, marks["end"]))
        finally:
            read.cancel()
    return results


async def _turn(events: asyncio.Queue[tuple[float, dict[str, Any]]], end: float) -> dict[str, float]:
    got: dict[str, float] = {}
    while True:
        at, event = await asyncio.wait_for(events.get(), 60)
        kind = event["type"]
        if kind == "input_audio.speech_stopped":
            got["stopped"] = at - end
        elif kind == "input_audio.transcript" and event["final"]:
            got["transcript"] = at - end
        elif kind == "response.delta" and "first_token" not in got:
            got["first_token"] = at - end
        elif kind == "error":
            print("error:", event, flush=True)
        elif kind == "response.done":
            if "first_token" not in got:
                # a response.done without text before the turn's answer (seen
                # with speculative answers: docs/perf/partials.md): counted, skipped
                got["empty_done"] = got.get("empty_done", 0) + 1
                print("response.done without text:", event["finish_reason"], flush=True)
                continue
            got["stopped_to_first_token"] = got["first_token"] - got["stopped"]
            return got


def engine_stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/debug/engine", timeout=10).json()["stats"])


def p50(values: list[float]) -> float:
    kept = [v for v in values if v == v]  # turns answered without text are left out (NaN)
    return statistics.median(kept) * 1000 if kept else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--pause-ms", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("docs/perf/partials.md"))
    args = parser.parse_args()
    rows = []
    raw: dict[str, Any] = {}
    for mode, flags in MODES.items():
        with served([*flags, "--voice", "on"]) as url:
            before = engine_stats(url)
            turns = asyncio.run(one_session(url, args.turns, args.pause_ms))
            after = engine_stats(url)
        prefilled = after["num_speculative_prefill_tokens"] - before["num_speculative_prefill_tokens"]
        hits = after["num_speculative_prefill_hits"] - before["num_speculative_prefill_hits"]
        raw[mode] = {"turns": turns, "prefilled": prefilled, "hits": hits}
        empty = sum(int(t.get("empty_done", 0)) for t in turns)
        keys = ("stopped", "transcript", "first_token", "stopped_to_first_token")
        med = {k: p50([t[k] for t in turns]) for k in keys}
        rows.append((mode, med, prefilled, hits, empty))
        print(mode, {k: round(v) for k, v in med.items()}, prefilled, hits, empty, flush=True)
    load = os.getloadavg()
    lines = [
        "# Partial transcripts and speculative prefill: end of turn to first token",
        "",
        f"`python loadtests/partials_bench.py --turns {args.turns} --pause-ms {args.pause_ms}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        "(a shared machine: compare rows of this run only).",
        "",
        f"One session per server, {args.turns} turns, each with a {args.pause_ms} ms pause mid-sentence, "
        f"silence window {SILENCE_MS} ms, text answers, a system prompt of a few hundred tokens and a "
        "conversation growing turn by turn. Milliseconds, p50, from the chunk holding the turn's last "
        "voiced sample (`speech_stopped`: the window; `transcript`: the final one; `first token`: the "
        "first `response.delta`), and from `speech_stopped` to the first token.",
        "",
        "| server | speech_stopped | final transcript | first token | speech_stopped -> first token "
        "| prefilled speculatively (tokens) | of those reused | empty `response.done` |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode, med, prefilled, hits, empty in rows:
        share = f"{hits} ({hits / prefilled:.0%})" if prefilled else "0"
        lines.append(
            f"| {mode} | {med['stopped']:.0f} | {med['transcript']:.0f} | {med['first_token']:.0f} "
            f"| {med['stopped_to_first_token']:.0f} | {prefilled} | {share} | {empty} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
