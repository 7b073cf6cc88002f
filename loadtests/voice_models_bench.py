"""The voice models alone, timed, each against a baseline of the same run.

What the voice tests (tests/voice/) check is behaviour; how fast is measured
here, on the bundled models, and printed with its ratio to a baseline
measured in the same run (machines drift; compare only numbers of one run):

- loading the VAD, Whisper and Piper (printed, no baseline);
- the VAD: ms per 32 ms frame, against the frame's 32 ms (real time);
- Whisper: seconds per second of espeak-ng speech (real-time factor);
- Piper: seconds per second of the audio it makes (real-time factor), and
  ``Synthesizer.timing`` (the durations model alone) against
  ``Synthesizer.synthesize`` of the same text, in CPU time;
- espeak-ng: ms to phonemize one sentence (one process), against a bare
  ``espeak-ng --version`` process (what starting it costs).

Medians of ``--reps`` runs after one warm-up run each.

Usage: ``python loadtests/voice_models_bench.py [--reps 5]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bargein.voice.audio import pcm16_to_float  # noqa: E402
from bargein.voice.espeak import Espeak, espeak_binary  # noqa: E402
from bargein.voice.models import load_voice_models  # noqa: E402
from bargein.voice.vad import FRAME_SAMPLES, SAMPLE_RATE  # noqa: E402
from loadtests.speech import espeak_pcm16, silence_pcm16  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
QUESTION = "I would like to book a table for dinner tonight."


def median_s(fn: Callable[[], object], reps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls on ``clock``, after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="timed runs of each measurement (median)")
    args = p.parse_args()
    print(
        f"voice_models_bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, median of {args.reps}"
    )

    start = time.perf_counter()
    models = load_voice_models()
    print(f"load: {time.perf_counter() - start:.2f} s (VAD, Whisper, Piper)")

    speech = pcm16_to_float(silence_pcm16(1000, SAMPLE_RATE) + espeak_pcm16(SENTENCE, SAMPLE_RATE))
    frames = speech[: len(speech) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)

    def vad() -> None:
        stream = models.vad.stream()
        for frame in frames:
            stream.probability(frame)

    frame_ms = median_s(vad, args.reps) / len(frames) * 1000
    real_ms = FRAME_SAMPLES * 1000 / SAMPLE_RATE
    print(f"VAD: {frame_ms:.3f} ms a {real_ms:.0f} ms frame: {frame_ms / real_ms:.3f}x real time")

    question = pcm16_to_float(espeak_pcm16(QUESTION, SAMPLE_RATE))
    stt_s = median_s(lambda: models.transcriber.transcribe(question), args.reps)
    question_s = len(question) / SAMPLE_RATE
    print(f"STT: {stt_s:.2f} s for {question_s:.2f} s of speech: {stt_s / question_s:.3f}x real time")

    synth = models.synthesizer
    audio_s = len(synth.synthesize(SENTENCE).audio) / synth.sample_rate
    tts_s = median_s(lambda: synth.synthesize(SENTENCE), args.reps)
    print(f"TTS: {tts_s * 1000:.0f} ms for {audio_s:.2f} s of audio: {tts_s / audio_s:.3f}x real time")
    synth_cpu = median_s(lambda: synth.synthesize(SENTENCE), args.reps, time.process_time)
    timing_cpu = median_s(lambda: synth.timing(SENTENCE), args.reps, time.process_time)
    print(
        f"TTS timing(): {timing_cpu * 1000:.1f} ms CPU against synthesize()'s {synth_cpu * 1000:.1f} ms: "
        f"{timing_cpu / synth_cpu:.3f}x"
    )

    espeak, words = Espeak("en-us"), SENTENCE.split()
    binary = espeak_binary()
    bare_s = median_s(
        lambda: subprocess.run([binary, "--version"], capture_output=True, check=True), args.reps
    )
    call_s = median_s(lambda: espeak.phonemize(words), args.reps)
    print(
        f"espeak-ng: {call_s * 1000:.1f} ms a {len(words)}-word sentence against {bare_s * 1000:.1f} ms "
        f"for a bare process: {call_s / bare_s:.2f}x"
    )


if __name__ == "__main__":
    main()
