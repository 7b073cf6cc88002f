"""Voice latency and turn-taking: voice-to-voice, barge-in and false cut-offs, per turn-detection mode.

Each voice session is a client over ``/v1/realtime`` that streams microphone-
like audio in real time (40 ms PCM16 chunks at 16 kHz, each sent once its
last sample would have been captured) and lets the server find the turns and
speak the answers (24 kHz, greedy, up to 40 tokens). The turn detection is
the session's, one mode per session: ``server_vad`` (OpenAI's defaults:
threshold 0.5, 300 ms prefix padding, 500 ms silence) or ``semantic_vad``
with an eagerness (``semantic_vad:auto``); a mode the server refuses is
reported as such and skipped, so the same script runs against a server
without ``semantic_vad``.

Two sets (``loadtests/voice_utterances.py``):

- **Complete questions** (espeak-ng), at 1, 4 and 8 concurrent sessions,
  each latency measured at the client from the question's last voiced
  sample (its capture time) and broken down into: the end-of-turn decision
  (``input_audio.committed`` of the turn; ``speech_stopped`` in the json),
  the final transcript, the first token and the first audio byte
  (**voice to voice**). Also the stall (time a client playing the answer
  from its first audio would wait for audio not arrived yet). Every third
  turn the client barges in over the answer: from the interruption's first
  voiced sample to ``speech_started`` and to the answer's ``response.done``.
- **Mid-sentence pauses**: 30 sentences with a 400-900 ms pause inside,
  in bargein's own voice (Piper) and espeak-ng's, alternating. An answer
  shown before the user finished (``response.created`` or audio before the
  sentence's last chunk went out, or the part before the pause answered
  as a turn of its own) is a **false cut-off**; a turn committed before the
  sentence ended is counted as a split.

Every turn that ends must get an answer, a refusal or an error: a turn
whose answer has not ended after ``--turn-timeout`` is counted as **lost**
(with the events seen, printed), and the run goes on.

By default one server is started (``bargein serve --voice on``) and every
mode runs against it; ``--url`` uses a running server instead, and
``--speculation-baseline`` adds a second server with
``--voice-speculation false``.

Writes ``--out`` (default ``docs/perf/voice.md``) and a json beside it.
Usage: ``python loadtests/voice_bench.py [--sessions 1 4 8] [--turns 6]
[--modes server_vad semantic_vad:auto] [--pause-modes ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_proc import served  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from loadtests.echo_sim import ECHO_BEGIN, ECHO_END  # noqa: E402
from loadtests.voice_report import render  # noqa: E402
from loadtests.voice_session import RATE, ModeRefused, Turn, VoiceSession  # noqa: E402
from loadtests.voice_utterances import BARGE, QUESTIONS, Utterance, Voices, paused_set, questions  # noqa: E402

MODES = ["server_vad", "semantic_vad:auto"]
PAUSE_MODES = [
    "server_vad",
    "semantic_vad:low",
    "semantic_vad:medium",
    "semantic_vad:high",
    "semantic_vad:auto",
]


async def question_session(
    url: str, mode: str, index: int, turns: int, speech: dict[str, Utterance], timeout_s: float
) -> list[Turn]:
    """One session saying ``turns`` complete questions (a barge-in every third)."""
    async with connect(url, subprotocols=["bargein.v1.json"], max_size=None) as ws:  # type: ignore[list-item]
        session = VoiceSession(ws, mode, turn_timeout_s=timeout_s)
        await session.start()
        try:
            await asyncio.sleep(0.2 * index)  # sessions do not speak in lockstep
            out = []
            for t in range(turns):
                barge = speech[BARGE] if t % 3 == 2 else None
                out.append(await session.question(speech[QUESTIONS[t % len(QUESTIONS)]], barge))
                report_lost(out[-1], mode, f"session {index} question {t}")
            return out
        finally:
            await session.stop()


async def paused_session(url: str, mode: str, utterances: list[Utterance], timeout_s: float) -> list[Turn]:
    """One session saying ``utterances`` (the mid-sentence-pause set, or its share)."""
    async with connect(url, subprotocols=["bargein.v1.json"], max_size=None) as ws:  # type: ignore[list-item]
        session = VoiceSession(ws, mode, turn_timeout_s=timeout_s)
        await session.start()
        try:
            out = []
            for utterance in utterances:
                out.append(await session.paused(utterance))
                report_lost(out[-1], mode, repr(utterance.text))
            return out
        finally:
            await session.stop()


def report_lost(turn: Turn, mode: str, what: str) -> None:
    """Print a lost turn with what the client saw meanwhile."""
    if turn.lost:
        print(f"LOST [{mode}] {what}: errors {turn.errors}", file=sys.stderr)
        for line in turn.trace[-40:]:
            print("   ", line, file=sys.stderr)


async def run_questions(
    url: str, mode: str, sessions: int, turns: int, speech: dict[str, Utterance], timeout_s: float
) -> list[Turn]:
    runs = [question_session(url, mode, i, turns, speech, timeout_s) for i in range(sessions)]
    return [t for ts in await asyncio.gather(*runs) for t in ts]


async def run_paused(
    url: str, mode: str, sessions: int, utterances: list[Utterance], timeout_s: float
) -> list[Turn]:
    shares = [utterances[i::sessions] for i in range(sessions)]
    runs = [paused_session(url, mode, share, timeout_s) for share in shares if share]
    return [t for ts in await asyncio.gather(*runs) for t in ts]


def scrape(url: str) -> dict[str, float]:
    """The server's voice counters now (``/metrics``)."""
    import httpx

    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(("bargein_voice_speculations_total", "bargein_transcription_seconds")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def speculations(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Speculative answers adopted and dropped between two scrapes."""
    out = {}
    for outcome in ("adopted", "dropped"):
        name = f'bargein_voice_speculations_total{{outcome="{outcome}"}}'
        out[outcome] = after.get(name, 0.0) - before.get(name, 0.0)
    return out


@contextlib.contextmanager
def server(url: str | None, flags: list[str]) -> Iterator[str]:
    """The HTTP base URL of ``url``, or of a ``bargein serve --voice on`` started here."""
    if url is not None:
        yield url
        return
    with served([*flags, "--voice", "on"]) as started:
        yield started


def bench_server(
    base: str, args: argparse.Namespace, speech: dict[str, Utterance], paused: list[Utterance]
) -> dict[str, Any]:
    """Every mode of both sets against one server."""
    ws_url = base.replace("http", "ws", 1) + "/v1/realtime"
    out: dict[str, Any] = {"questions": {}, "paused": {}, "refused": {}}
    for mode in args.modes:
        for n in args.sessions:
            before = scrape(base)
            try:
                turns = asyncio.run(run_questions(ws_url, mode, n, args.turns, speech, args.turn_timeout))
            except ModeRefused as exc:
                out["refused"][mode] = str(exc)
                print(f"{mode}: refused by the server ({exc}); skipped", flush=True)
                break
            level = {"turns": [asdict(t) for t in turns], "speculations": speculations(before, scrape(base))}
            out["questions"].setdefault(mode, {})[n] = level
            print(mode, n, "sessions:", summary_line(turns), flush=True)
    for mode in [] if args.no_pause_set else args.pause_modes:
        if mode in out["refused"]:
            continue
        try:
            turns = asyncio.run(run_paused(ws_url, mode, args.pause_sessions, paused, args.turn_timeout))
        except ModeRefused as exc:
            out["refused"][mode] = str(exc)
            print(f"{mode}: refused by the server ({exc}); skipped", flush=True)
            continue
        out["paused"][mode] = {"turns": [asdict(t) for t in turns]}
        cut = sum(t.cut_off for t in turns)
        print(
            mode,
            f"pause set: {cut}/{len(turns)} false cut-offs, {sum(t.lost for t in turns)} lost",
            flush=True,
        )
    return out


def summary_line(turns: list[Turn]) -> str:
    v2v = sorted(t.first_audio for t in turns if t.first_audio is not None)
    p50 = f"{v2v[len(v2v) // 2] * 1000:.0f} ms" if v2v else "-"
    return f"{len(turns)} turns, {sum(t.lost for t in turns)} lost, voice-to-voice p50 {p50}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--turns", type=int, default=6, help="complete questions per session")
    parser.add_argument("--modes", nargs="+", default=MODES, help="turn detection of the question set")
    parser.add_argument(
        "--pause-modes", nargs="+", default=PAUSE_MODES, help="... of the mid-sentence-pause set"
    )
    parser.add_argument("--pause-sessions", type=int, default=2, help="sessions sharing the pause set")
    parser.add_argument("--no-pause-set", action="store_true")
    parser.add_argument(
        "--pause-count", type=int, default=30, help="the first N of the pause set (a quick check)"
    )
    parser.add_argument("--turn-timeout", type=float, default=60.0, help="s until an unanswered turn is lost")
    parser.add_argument("--url", help="a running server's HTTP base URL (default: start one)")
    parser.add_argument(
        "--speculation-baseline", action="store_true", help="also a --voice-speculation false server"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/perf/voice.md"))
    parser.add_argument(
        "--flags",
        type=shlex.split,
        default=[],
        help='extra bargein serve flags, one quoted string: --flags "--voice-text-turn false"',
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    speech = questions(RATE)
    paused = [] if args.no_pause_set else paused_set(Voices(RATE))[: args.pause_count]
    servers: dict[str, list[str]] = {"given" if args.url else "default": []}
    if args.speculation_baseline and not args.url:
        servers["--voice-speculation false"] = ["--voice-speculation", "false"]
    results: dict[str, Any] = {}
    for name, flags in servers.items():
        with server(args.url, [*flags, *args.flags]) as base:
            results[name] = bench_server(base, args, speech, paused)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "command": " ".join(sys.argv),
        "turns": args.turns,
        "pause_set": [{"text": u.text, "voice": u.voice, "pause_ms": u.pause_ms} for u in paused],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # the echo canceller's section (loadtests/echo_bench.py --write) is kept as it was
    kept = args.out.read_text() if args.out.exists() else ""
    echo = kept[kept.index(ECHO_BEGIN) : kept.index(ECHO_END) + len(ECHO_END)] if ECHO_END in kept else ""
    args.out.write_text(render(results, meta) + (f"\n{echo}\n" if echo else ""))
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
