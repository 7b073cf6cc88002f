"""Echo cancellation (voice/echo.py, issue 39) on a simulated speaker echo: ERLE,
what the default ``server_vad`` makes of the raw and the cleaned input, the
user talking over the echo, and the CPU cost.

The far end is the project's Piper voice speaking a 9.5 s answer at 24 kHz,
sent in 200 ms chunks four times faster than real time through
``EchoPath.played``; the microphone hears it ``delay`` ms later than the
server's reference places it (the round trip and the devices, unknown to
the canceller), ``gain`` dB down, through a 150 ms reverb tail, over a
-60 dBFS noise floor, and sends it in 20 ms appends arriving with up to
10 ms of jitter (loadtests/echo_sim.py). Each row:

* ERLE: the echo's energy in over out, on a run without the noise floor
  (which would bound it), over the 10 ms frames within 30 dB of the loudest.
* turns raw / cleaned: turns Silero + ``TurnDetector(TurnDetection())``
  starts on the microphone's audio and on the canceller's output.
* user: espeak-ng saying "Wait, what about Sundays?" 3 s into the answer, at
  the answer's own level sent (the echo 10-20 dB under it): whether a turn
  starts on the cleaned audio, how long after the user's first voiced
  sample, the user's level in the output relative to the user alone
  (residual echo and noise included; AEC3 ducks a little while both talk),
  and what Whisper hears in that turn, raw and cleaned.
* CPU: process CPU seconds of ``EchoPath.clean`` (reference, resampling and
  AEC3) per second of audio; the baseline, in the same run, is the Silero
  VAD every connection already runs over the same audio.

    .venv/bin/python loadtests/echo_bench.py                        # print the table
    .venv/bin/python loadtests/echo_bench.py --write docs/perf/voice.md  # and put it in the report
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bargein.voice.audio import pcm16_to_float  # noqa: E402
from bargein.voice.echo import EchoPath  # noqa: E402
from bargein.voice.stt import Transcriber  # noqa: E402
from bargein.voice.tts import Synthesizer  # noqa: E402
from bargein.voice.vad import FRAME_SAMPLES, SileroVad  # noqa: E402
from loadtests.echo_sim import ECHO_BEGIN, ECHO_END, USER, Scene, erle_db, piper_answer, simulate, turn_starts  # noqa: E402
from loadtests.speech import espeak_pcm16  # noqa: E402

RATE = 16000
USER_AT_S = 3.0


def row(
    answer: np.ndarray, user: np.ndarray, vad: SileroVad, stt: Transcriber, delay_ms: int, gain_db: float
) -> dict[str, Any]:
    scene = Scene(delay_ms=delay_ms, gain_db=gain_db)
    path = EchoPath()
    echo = simulate(answer, 24000, scene, path.clean, path.played)
    quiet = EchoPath()
    bare = simulate(
        answer, 24000, Scene(delay_ms=delay_ms, gain_db=gain_db, noise_dbfs=None), quiet.clean, quiet.played
    )
    talk = EchoPath()
    both = simulate(answer, 24000, scene, talk.clean, talk.played, user=user, user_at_s=USER_AT_S)
    voiced = np.nonzero(np.abs(user) > 0.01)[0]
    onset = 0.5 + USER_AT_S + voiced[0] / RATE
    starts = [s for s in turn_starts(vad, both.cleaned) if s >= onset - 0.1]
    speech = slice(round(onset * RATE), round(onset * RATE) + len(voiced))
    kept = 10 * np.log10(np.sum(both.cleaned[speech] ** 2) / np.sum(both.user[speech] ** 2))
    seconds = len(echo.mic) / RATE
    turn = slice(round((onset - 0.3) * RATE), round(onset * RATE) + len(voiced) + RATE // 2)
    return {
        "heard_alone": stt.transcribe(both.user[turn]),
        "heard_raw": stt.transcribe(both.mic[turn]),
        "heard_cleaned": stt.transcribe(both.cleaned[turn]),
        "erle": erle_db(bare.mic, bare.cleaned),
        "raw": len(turn_starts(vad, echo.mic)),
        "cleaned": len(turn_starts(vad, echo.cleaned)),
        "user_ms": 1000 * (starts[0] - onset) if starts else float("nan"),
        "user_turns": len(turn_starts(vad, both.cleaned)),
        "kept": kept,
        "cpu_ms": 1000 * (echo.cpu_s + bare.cpu_s + both.cpu_s) / (3 * seconds),
    }


def vad_cpu_ms(vad: SileroVad, seconds: float = 10.0) -> float:
    """CPU ms of the Silero VAD per second of audio (the baseline)."""
    audio = (np.random.default_rng(0).standard_normal(round(seconds * RATE)) * 0.05).astype(np.float32)
    stream = vad.stream()
    c0 = time.process_time()
    for lo in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        stream.probability(audio[lo : lo + FRAME_SAMPLES])
    return 1000 * (time.process_time() - c0) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write", type=Path, help="replace the echo section of this report (docs/perf/voice.md)"
    )
    parser.add_argument("--delays", default="50,100,150,250,400", help="ms, comma-separated")
    parser.add_argument("--gains", default="-10,-20", help="dB, comma-separated")
    args = parser.parse_args()
    load = os.getloadavg()
    synthesizer = Synthesizer(num_threads=1)
    vad = SileroVad()
    stt = Transcriber(num_threads=1)
    answer = piper_answer(synthesizer, 24000)
    user = pcm16_to_float(espeak_pcm16(USER, RATE))
    lines = [
        "| echo delay (unknown to the canceller) | echo level | ERLE | turns on the raw echo | turns on the cleaned echo "
        "| user over the echo: turn after | user's level kept | CPU ms per s of audio |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    cpu = []
    heard = []
    for delay in (int(d) for d in args.delays.split(",")):
        for gain in (float(g) for g in args.gains.split(",")):
            r = row(answer, user, vad, stt, delay, gain)
            cpu.append(r["cpu_ms"])
            turn = "none" if np.isnan(r["user_ms"]) else f"{r['user_ms']:.0f} ms"
            if r["user_turns"] > 1:
                turn += f" ({r['user_turns']:.0f} turns)"
            lines.append(
                f"| {delay} ms | {gain:.0f} dB | {r['erle']:.1f} dB | {r['raw']:.0f} | {r['cleaned']:.0f} "
                f"| {turn} | {r['kept']:.1f} dB | {r['cpu_ms']:.1f} |"
            )
            print(lines[-1], flush=True)
            heard.append(f"| {delay} ms | {gain:.0f} dB | {r['heard_raw']} | {r['heard_cleaned']} |")
    vad_ms = vad_cpu_ms(vad)
    playback = []
    scene = Scene(delay_ms=100, gain_db=-10.0)
    for name, told in (
        ("a 1 s pause at 3 s, told (`playback_paused`/`resumed`)", True),
        ("the same pause, untold", False),
    ):
        path = EchoPath()
        tell = {"paused": path.paused, "resumed": path.resumed} if told else {}
        run = simulate(answer, 24000, scene, path.clean, path.played, pause=(3.0, 1.0), **tell)
        playback.append(
            f"| {name} | {len(turn_starts(vad, run.mic))} | {len(turn_starts(vad, run.cleaned))} |"
        )
    path = EchoPath()
    run = simulate(answer, 24000, scene, path.clean, path.played, cut_s=4.0, ended=path.ended)
    playback.append(
        f"| cut at 4 s (`playback_ended`) | {len(turn_starts(vad, run.mic))} | {len(turn_starts(vad, run.cleaned))} |"
    )
    body = "\n".join(
        [
            ECHO_BEGIN,
            "",
            "## Echo cancellation",
            "",
            f"`python {' '.join(sys.argv)}`, {datetime.date.today()}, {platform.machine()}, "
            f"{os.cpu_count()} cores, load average {load[0]:.1f} before the run. "
            "WebRTC's AEC3 (the `livekit` wheel's `AudioProcessingModule`) against the audio "
            "the server sent, placed in time as `voice/echo.py` places it; the echo is "
            "Piper's 9.5 s answer heard by the microphone `delay` later than that placement, "
            "`level` down, with a 150 ms reverb tail, a -60 dBFS noise floor and 10 ms of "
            "arrival jitter (`loadtests/echo_sim.py`). Turns: Silero with the default "
            "`server_vad`. User: espeak-ng over the echo, 3 s into the answer.",
            "",
            *lines,
            "",
            f'Whisper (tiny.en) on the user\'s turn ("{USER}", from 0.3 s before the '
            "user's first voiced sample to 0.5 s after the last), the microphone's audio "
            f"against the canceller's (the user's voice alone: \"{r['heard_alone']}\"):",
            "",
            "| echo delay | echo level | heard in the raw input | heard in the cleaned input |",
            "| ---: | ---: | --- | --- |",
            *heard,
            "",
            "The playback calls, at 100 ms and -10 dB (turns started on the raw and the cleaned input):",
            "",
            "| playback | raw | cleaned |",
            "| --- | ---: | ---: |",
            *playback,
            "",
            f"CPU: the canceller costs {np.mean(cpu):.1f} ms per second of audio "
            f"({np.mean(cpu) / 10:.1f}% of a core) while a connection has been sent audio "
            f"(nothing before: the input passes through); the Silero VAD every connection "
            f"runs costs {vad_ms:.1f} ms per second of the same audio here.",
            "",
            "The delay is how much later the echo comes than the server's placement "
            "(played when sent, captured when it arrived): the round trip plus the "
            "devices' latencies, which the canceller does not know; AEC3 estimates it. "
            "The 50-150 ms a client adds hold; from about 250 ms AEC3 may let the first "
            "second through while it converges, and 400 ms is past what it covers. Its "
            "output runs 8 ms behind its input (`tests/voice/test_echo.py`). ERLE is "
            "measured on the echo alone without the noise floor; the turn columns with it.",
            "",
            ECHO_END,
        ]
    )
    print(body)
    if args.write is not None:
        text = args.write.read_text() if args.write.exists() else ""
        if ECHO_BEGIN in text and ECHO_END in text:
            text = text[: text.index(ECHO_BEGIN)] + body + text[text.index(ECHO_END) + len(ECHO_END) :]
        else:
            text = text.rstrip("\n") + "\n\n" + body + "\n"
        args.write.write_text(text)


if __name__ == "__main__":
    main()
