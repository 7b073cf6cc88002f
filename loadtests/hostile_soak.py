"""Hostile-client soak: attackers beside a well-behaved voice session and a text session.

One server (``--voice on``) runs two phases of ``--seconds`` each:

1. **baseline**: a well-behaved voice session (real-time microphone audio,
   server VAD, spoken answers; voice_bench's client) and a text session
   (greedy answers of 32 tokens, one after the other) alone;
2. **attacked**: the same two sessions while one connection per attack of
   issue 36 runs beside them, each repeating its attack for the whole phase
   (what the server refuses it retries after a short pause):

   - ``items``: ``conversation.item.create`` of ~0.9 MB items (OpenAI endpoint);
   - ``commit_flood``: push to talk, 4 s of noise + commit, without waiting;
   - ``fast_audio``: audio appended as fast as the socket takes it (server VAD);
   - ``long_turn``: continuous speech that never pauses (server VAD, no responses);
   - ``pending_turns``: short spoken turns with ``create_response: false``;
   - ``resume_audio``: ``stream.resume`` of a spoken answer with
     ``audio_from_ms`` at its end, again and again;
   - ``hostile_json``: ``[`` x 100,000 and a 400-digit temperature (OpenAI endpoint);
   - ``cross_origin``: WebSocket opens from a foreign ``Origin`` and HTTP
     requests with a foreign ``Host`` (DNS rebinding).

Measured: the well-behaved sessions' voice-to-voice latency (speech end to
first answer audio) and text TTFT, p50 / p95 per phase and their ratio; the
server's RSS (sampled every second: max per phase); the lines the server
logged at ERROR or above during each phase; what each attacker got (sent,
refused, error codes).

Writes ``--out`` (default ``docs/perf/hostile.md``) and a json beside it.
Usage: ``python loadtests/hostile_soak.py [--seconds 300]``
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_proc import ROOT, free_port  # noqa: E402
from voice_bench import QUESTIONS, RATE, Mic, pct, voiced_bounds  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from loadtests.speech import espeak_pcm16, silence_pcm16  # noqa: E402

SUBPROTOCOL = "bargein.v1.json"
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b")


# --- the server ---------------------------------------------------------------


class Server:
    """``bargein serve --voice on`` in a subprocess, its log in a file, its RSS readable."""

    def __init__(self, flags: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="hostile_soak_", suffix=".log")[1])
        cmd = [sys.executable, "-m", "bargein", "serve", "--port", str(self.port), "--voice", "on", *flags]
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError("server not ready in 600 s")

    def rss_mb(self) -> float:
        """Resident set size of the server process, MiB (/proc/PID/status VmRSS)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def log_size(self) -> int:
        return self.log.stat().st_size

    def error_lines(self, start: int, end: int) -> list[str]:
        """The log lines at ERROR or above written between byte offsets ``start`` and ``end``."""
        with self.log.open("rb") as f:
            f.seek(start)
            text = f.read(end - start).decode(errors="replace")
        return [line for line in text.splitlines() if ERROR_LINE.search(line)]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._out.close()


# --- the well-behaved sessions ------------------------------------------------


async def voice_turn(
    ws: Any, mic: Mic, t: int, speech: dict[str, bytes], refused: collections.Counter[str]
) -> float | None:
    """Speak question ``t`` and wait for its answer: the voice-to-voice seconds
    (speech end to the answer's first audio), or None when the turn got no
    audio (its response refused: the code is counted in ``refused``)."""
    question = speech[QUESTIONS[t % len(QUESTIONS)]]
    mic.say(question, {f"end{t}": voiced_bounds(question)[1]})
    response_id, first_audio = None, None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        kind, end = event["type"], mic.marks.get(f"end{t}")
        if end is None:
            continue
        if kind == "response.created":
            response_id = event["response_id"]
        elif kind == "response.audio.delta" and first_audio is None and event["response_id"] == response_id:
            first_audio = time.monotonic() - end
        elif kind == "error" and response_id is None:
            refused[event["code"]] += 1  # the turn's response was refused: no answer comes
            break
        elif kind == "response.done" and event["response_id"] == response_id:
            break
    mic.say(silence_pcm16(800, RATE), {})  # a breath before the next question
    return first_audio


async def voice_session(
    ws_url: str, deadline: float, speech: dict[str, bytes], refused: collections.Counter[str]
) -> list[float]:
    """Spoken questions in real time until ``deadline``; voice-to-voice seconds per answered turn."""
    latencies: list[float] = []
    async with connect(ws_url, subprotocols=[SUBPROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        json.loads(await ws.recv())
        audio = {"input": {"sample_rate": RATE}, "output": {"sample_rate": 24000}}
        defaults = {"temperature": 0, "max_tokens": 40}
        await ws.send(
            json.dumps({"type": "session.update", "session": {"defaults": defaults, "audio": audio}})
        )
        mic = Mic(ws)
        sender = asyncio.create_task(mic.run())
        try:
            t = 0
            while time.monotonic() < deadline:
                latency = await voice_turn(ws, mic, t, speech, refused)
                if latency is not None:
                    latencies.append(latency)
                t += 1
        finally:
            sender.cancel()
    return latencies


async def text_session(ws_url: str, deadline: float, refused: collections.Counter[str]) -> list[float]:
    """Greedy 32-token answers one after the other until ``deadline``; TTFT seconds each
    (``refused`` counts the error codes of the requests that got none)."""
    ttfts: list[float] = []
    async with connect(ws_url, subprotocols=[SUBPROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        json.loads(await ws.recv())
        n = 0
        while time.monotonic() < deadline:
            n += 1
            rid = f"t{n}"
            question = QUESTIONS[n % len(QUESTIONS)]
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "response_id": rid,
                        "input": [{"role": "user", "content": question}],
                        "temperature": 0,
                        "max_tokens": 32,
                    }
                )
            )
            sent, first = time.monotonic(), None
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if event.get("response_id") != rid:
                    continue
                if event["type"] == "response.delta" and first is None:
                    first = time.monotonic() - sent
                elif event["type"] == "error":
                    refused[event["code"]] += 1
                    break
                elif event["type"] == "response.done":
                    break
            if first is not None:
                ttfts.append(first)
            await asyncio.sleep(0.5)
    return ttfts


# --- the attackers ------------------------------------------------------------


class Tally:
    """What one attacker sent and what the server answered."""

    def __init__(self) -> None:
        self.sent = 0
        self.codes: collections.Counter[str] = collections.Counter()
        self.closed: str | None = None  # how the server ended the connection, if it did

    def saw(self, event: dict[str, Any]) -> None:
        if event.get("type") == "error":
            error = event.get("error")
            self.codes[str(error.get("code") if isinstance(error, dict) else event.get("code"))] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "errors": dict(self.codes), "closed": self.closed}


async def drain(ws: Any, tally: Tally) -> None:
    """Read and tally every event until the socket closes (how it closed goes in ``tally.closed``)."""
    try:
        async for frame in ws:
            if isinstance(frame, str):
                tally.saw(json.loads(frame))
    except ConnectionClosed as exc:
        tally.closed = str(exc)
    else:
        tally.closed = "closed normally"


def pcm_b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


def noise_pcm16(ms: int, level: int = 3000) -> bytes:
    rng = np.random.default_rng(ms)
    return rng.integers(-level, level, RATE * ms // 1000, dtype=np.int16).astype("<i2").tobytes()


async def voice_socket(ws_url: str, turn_detection: dict[str, Any] | None) -> Any:
    ws = await connect(ws_url, subprotocols=[SUBPROTOCOL], max_size=None)  # type: ignore[list-item]
    json.loads(await ws.recv())
    audio = {
        "input": {"sample_rate": RATE, "turn_detection": turn_detection},
        "output": {"sample_rate": 24000},
    }
    await ws.send(json.dumps({"type": "session.update", "session": {"audio": audio}}))
    return ws


async def attack_items(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    text = "a" * 900_000
    async with connect(urls["openai"], max_size=2**24) as ws:
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            tally.sent += 1
            await asyncio.sleep(0.05)
        reader.cancel()


async def attack_commit_flood(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    noise = pcm_b64(noise_pcm16(4000))
    ws = await voice_socket(urls["ws"], None)
    async with ws:
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            await ws.send(json.dumps({"type": "input_audio.append", "audio": noise}))
            await ws.send(json.dumps({"type": "input_audio.commit"}))
            tally.sent += 1
            await asyncio.sleep(0.1)
        reader.cancel()


async def attack_fast_audio(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    chunk = pcm_b64(noise_pcm16(1000, level=200))
    ws = await voice_socket(urls["ws"], {"type": "server_vad"})
    async with ws:
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            await ws.send(json.dumps({"type": "input_audio.append", "audio": chunk}))
            tally.sent += 1
            await asyncio.sleep(0.005)  # 1 s of audio every 5 ms: ~200x real time
        reader.cancel()


async def attack_long_turn(urls: dict[str, str], deadline: float, tally: Tally, speech: bytes) -> None:
    # no responses: the bound under test is the turn's length, not the engine's share
    ws = await voice_socket(urls["ws"], {"type": "server_vad", "create_response": False})
    async with ws:
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            for lo in range(0, len(speech), 3200):  # 100 ms chunks in real time, never a pause
                await ws.send(
                    json.dumps({"type": "input_audio.append", "audio": pcm_b64(speech[lo : lo + 3200])})
                )
                tally.sent += 1
                await asyncio.sleep(0.1)
        reader.cancel()


async def attack_pending_turns(urls: dict[str, str], deadline: float, tally: Tally, speech: bytes) -> None:
    ws = await voice_socket(urls["ws"], {"type": "server_vad", "create_response": False})
    async with ws:
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            await ws.send(json.dumps({"type": "input_audio.append", "audio": pcm_b64(speech)}))
            await ws.send(json.dumps({"type": "input_audio.commit"}))
            tally.sent += 1
            await asyncio.sleep(len(speech) / 2 / RATE)  # real time on average
        reader.cancel()


async def attack_resume_audio(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    async with connect(urls["ws"], subprotocols=[SUBPROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"output": {}}}}))
        create = {
            "type": "response.create",
            "response_id": "spoken",
            "input": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "max_tokens": 200,
            "temperature": 0,
        }
        created = end = None
        while end is None:  # the answer to replay; a refused create (overloaded) is tried again
            await ws.send(json.dumps(create))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 300))
                if event["type"] == "response.created":
                    created = event
                elif event["type"] == "response.done":
                    end = event["end"]
                    break
                elif event["type"] == "error" and created is None:
                    await asyncio.sleep(event.get("retry_after_ms", 1000) / 1000)
                    break
    assert created is not None
    resume = {
        "type": "stream.resume",
        "stream_id": created["stream_id"],
        "resume_token": created["resume_token"],
        "from": end,
        "audio_from_ms": 2**31 - 1,
    }
    async with connect(urls["ws"], subprotocols=[SUBPROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        json.loads(await ws.recv())
        reader = asyncio.create_task(drain(ws, tally))
        while time.monotonic() < deadline and not reader.done():
            await ws.send(json.dumps(resume))
            tally.sent += 1
            await asyncio.sleep(0.05)
        reader.cancel()


async def attack_hostile_json(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    frames = ["[" * 100_000, '{"type": "response.create", "response": {"temperature": 1' + "0" * 400 + "}}"]
    while time.monotonic() < deadline:
        try:
            async with connect(urls["openai"], max_size=2**24) as ws:
                json.loads(await ws.recv())
                for frame in frames:
                    await ws.send(frame)
                    tally.sent += 1
                    tally.saw(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        except ConnectionClosed as exc:
            tally.codes[f"closed {exc.rcvd.code if exc.rcvd else None}"] += 1
        await asyncio.sleep(0.2)


async def attack_cross_origin(urls: dict[str, str], deadline: float, tally: Tally) -> None:
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            tally.sent += 1
            try:
                async with connect(urls["ws"], subprotocols=[SUBPROTOCOL], origin="http://evil.example"):  # type: ignore[list-item,arg-type]
                    tally.codes["ws_accepted"] += 1
            except Exception as exc:  # noqa: BLE001 - a refusal is what we count
                tally.codes[f"ws_{type(exc).__name__}"] += 1
            response = await client.get(
                urls["http"] + "/v1/models", headers={"Host": f"rebind.evil.example:{urls['port']}"}
            )
            tally.codes[f"http_{response.status_code}"] += 1
            await asyncio.sleep(0.2)


# --- a phase ------------------------------------------------------------------


async def sample_rss(server: Server, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        out.append(server.rss_mb())
        await asyncio.sleep(1)


async def phase(server: Server, seconds: float, speech: dict[str, bytes], attacked: bool) -> dict[str, Any]:
    urls = {
        "http": server.url,
        "port": str(server.port),
        "ws": server.url.replace("http", "ws") + "/v1/realtime",
        "openai": server.url.replace("http", "ws") + "/v1/realtime?model=bargein",
    }
    deadline = time.monotonic() + seconds
    log_start = server.log_size()
    stop = asyncio.Event()
    rss: list[float] = []
    sampler = asyncio.create_task(sample_rss(server, stop, rss))
    tallies: dict[str, Tally] = {}
    attacks: list[Awaitable[None]] = []
    if attacked:
        long_speech = b"".join(speech[q] for q in QUESTIONS) * 3
        short = speech[QUESTIONS[0]]
        plan: dict[str, Callable[[Tally], Awaitable[None]]] = {
            "items": lambda t: attack_items(urls, deadline, t),
            "commit_flood": lambda t: attack_commit_flood(urls, deadline, t),
            "fast_audio": lambda t: attack_fast_audio(urls, deadline, t),
            "long_turn": lambda t: attack_long_turn(urls, deadline, t, long_speech),
            "pending_turns": lambda t: attack_pending_turns(urls, deadline, t, short),
            "resume_audio": lambda t: attack_resume_audio(urls, deadline, t),
            "hostile_json": lambda t: attack_hostile_json(urls, deadline, t),
            "cross_origin": lambda t: attack_cross_origin(urls, deadline, t),
        }
        for name, attack in plan.items():
            tallies[name] = Tally()
            attacks.append(attack(tallies[name]))
    refused: collections.Counter[str] = collections.Counter()
    voice_refused: collections.Counter[str] = collections.Counter()
    results = await asyncio.gather(
        voice_session(urls["ws"], deadline, speech, voice_refused),
        text_session(urls["ws"], deadline, refused),
        *attacks,
        return_exceptions=True,
    )
    stop.set()
    await sampler
    voice, text, *attack_results = results
    failures = {
        name: repr(r) for name, r in (("voice", voice), ("text", text)) if isinstance(r, BaseException)
    }
    voice = [] if isinstance(voice, BaseException) else voice
    text = [] if isinstance(text, BaseException) else text
    out: dict[str, Any] = {
        "well_behaved_failed": failures,
        "voice_to_voice_s": {"p50": pct(voice, 50), "p95": pct(voice, 95), "n": len(voice)},
        "ttft_s": {"p50": pct(text, 50), "p95": pct(text, 95), "n": len(text)},
        "text_refused": dict(refused),
        "voice_refused": dict(voice_refused),
        "rss_mb": {"start": rss[0] if rss else None, "max": max(rss, default=None), "end": server.rss_mb()},
        "error_log_lines": server.error_lines(log_start, server.log_size()),
    }
    if attacked:
        out["attacks"] = {
            name: {**tally.as_dict(), "failed": repr(result) if isinstance(result, BaseException) else None}
            for (name, tally), result in zip(tallies.items(), attack_results, strict=True)
        }
    return out


def ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    base, hit = results["baseline"], results["attacked"]
    lines = [
        "# Hostile-client soak",
        "",
        f"`loadtests/hostile_soak.py`, {time.strftime('%Y-%m-%d')}, {platform.machine()} "
        f"({results['cpu']}), {os.cpu_count()} cores, one run, one server with `--voice on` and default flags. "
        f"Two phases of {args.seconds:.0f} s: a well-behaved voice session (real-time audio, server VAD, "
        "spoken answers of up to 40 tokens) and a text session (greedy 32-token answers) alone, then the "
        "same two beside one connection per attack of issue 36.",
        "",
        "| | baseline | attacked | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, name in (("voice_to_voice_s", "voice-to-voice"), ("ttft_s", "text TTFT")):
        for q in ("p50", "p95"):
            lines.append(
                f"| {name} {q} (ms) | {ms(base[key][q])} | {ms(hit[key][q])} | {ratio(hit[key][q], base[key][q])} |"
            )
        lines.append(f"| {name} turns | {base[key]['n']} | {hit[key]['n']} | |")
    lines.append(f"| voice turns refused | {base['voice_refused']} | {hit['voice_refused']} | |")
    lines.append(f"| text requests refused | {base['text_refused']} | {hit['text_refused']} | |")
    lines.append(f"| server RSS max (MiB) | {base['rss_mb']['max']:.0f} | {hit['rss_mb']['max']:.0f} | |")
    lines.append(
        f"| well-behaved sessions that failed | {base['well_behaved_failed'] or 'none'} | "
        f"{hit['well_behaved_failed'] or 'none'} | |"
    )
    lines.append(
        f"| lines logged at ERROR | {len(base['error_log_lines'])} | {len(hit['error_log_lines'])} | |"
    )
    lines += ["", "What each attacker sent and was answered (error codes counted):", ""]
    lines += ["| attack | sent | answers | connection | failed |", "| --- | ---: | --- | --- | --- |"]
    for name, a in hit["attacks"].items():
        answers = ", ".join(f"`{k}` {v}" for k, v in sorted(a["errors"].items())) or "—"
        lines.append(f"| {name} | {a['sent']} | {answers} | {a['closed'] or 'open'} | {a['failed'] or ''} |")
    if hit["error_log_lines"]:
        lines += ["", "Lines logged at ERROR during the attacked phase (first 20):", "", "```"]
        lines += [line[:300] for line in hit["error_log_lines"][:20]]
        lines.append("```")
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="length of each phase")
    parser.add_argument("--out", type=Path, default=Path("docs/perf/hostile.md"))
    parser.add_argument("--flags", nargs="*", default=[], help="extra bargein serve flags")
    args = parser.parse_args()
    speech = {q: espeak_pcm16(q, RATE) + silence_pcm16(200, RATE) for q in QUESTIONS}
    server = Server(args.flags)
    try:
        results: dict[str, Any] = {"cpu": cpu_name()}
        for name, attacked in (("baseline", False), ("attacked", True)):
            results[name] = asyncio.run(phase(server, args.seconds, speech, attacked))
            print(name, json.dumps(results[name])[:2000], flush=True)
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    args.out.write_text(render(results, args))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
