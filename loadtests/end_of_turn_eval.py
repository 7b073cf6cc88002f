"""What each end-of-turn signal says at a mid-sentence pause, offline.

``semantic_vad`` ends a turn when the end-of-turn model scores its pause
complete (voice/semantic_turns.py). Issue 38 asks for at most 10% false
cut-offs on the mid-sentence-pause set (loadtests/voice_utterances.py). This
scores the set's utterances directly, without a server or a clock, so a
change of model, threshold or input can be judged in a minute:

- **heads**: the part before each pause ("I'd like to book a table for"):
  a turn scored complete here is a false cut-off;
- **fulls**: the whole sentence, and **questions**: the benchmark's complete
  questions: a turn scored incomplete here waits for the eagerness' longest
  silence (4 s at ``auto``).

Each is spoken by both of the set's voices (Piper's joe and espeak-ng),
trimmed to its audible samples, with 300 ms of silence before it (the VAD's
prefix padding) and ``--silence`` ms after it (what the model hears of the
pause), and scored by:

- **audio**: Smart Turn v3.2 (voice/end_of_turn.py), complete at >= 0.5;
- **text**: the bundled chat model on Whisper tiny.en's transcript of the
  same audio (voice/text_end_of_turn.py: the probability that the user's
  message ends after these words), complete at >= ``--text-threshold``;
  ``--truth`` scores the sentences' own text instead of the transcript;
- **both**: complete only if both say so.

Prints one table (rows: signal x voice; columns: heads scored complete, the
false cut-offs, and fulls and questions scored complete) and the
transcripts of the heads the text signal scores complete.

Usage: ``python loadtests/end_of_turn_eval.py [--silence 200]``
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bargein.engine.config import ModelConfig  # noqa: E402
from bargein.engine.model.loader import transformers_folder  # noqa: E402
from bargein.voice.end_of_turn import EndOfTurnModel  # noqa: E402
from bargein.voice.stt import Transcriber  # noqa: E402
from bargein.voice.text_end_of_turn import TextEndOfTurnModel  # noqa: E402
from bargein.voice.vad import SileroVad  # noqa: E402
from loadtests.voice_utterances import PAUSED, QUESTIONS, Voices, _trimmed  # noqa: E402

RATE = 16000
PREFIX_MS = 300  # the VAD's prefix padding: what a turn's audio starts with
VOICES = ("piper", "espeak")


@dataclass(frozen=True, slots=True)
class Scored:
    """One utterance, scored: its transcript and both probabilities."""

    transcript: str
    audio: float
    text: float


def with_silence(pcm: bytes, silence_ms: int) -> npt.NDArray[np.float32]:
    """PCM16 ``pcm`` as float32 at 16 kHz, with the prefix padding before it
    and ``silence_ms`` of digital silence after it."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    return np.concatenate(
        [np.zeros(RATE * PREFIX_MS // 1000, np.float32), x, np.zeros(RATE * silence_ms // 1000, np.float32)]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--silence", type=int, default=200, help="ms of the pause the models hear")
    p.add_argument("--text-threshold", type=float, default=0.05)
    p.add_argument("--truth", action="store_true", help="score the text said, not the transcript")
    p.add_argument("--json", type=Path, help="also write every utterance's scores here")
    args = p.parse_args()
    # the server's transcriber: the VAD's speech with fixed margins (voice/speech_span.py)
    voices, audio_model, stt = Voices(RATE), EndOfTurnModel(), Transcriber(vad=SileroVad())
    text_model = TextEndOfTurnModel(transformers_folder(ModelConfig()))
    sets = {
        "heads": [head for head, _ in PAUSED],
        "fulls": [f"{head} {tail}" for head, tail in PAUSED],
        "questions": list(QUESTIONS),
    }
    scored: dict[tuple[str, str], list[Scored]] = {}
    for voice in VOICES:
        for name, texts in sets.items():
            rows = []
            for text in texts:
                audio = with_silence(_trimmed(voices.speak(text, voice)), args.silence)
                transcript = text if args.truth else stt.transcribe(audio)
                rows.append(
                    Scored(transcript, audio_model.probability(audio), text_model.probability(transcript))
                )
            scored[voice, name] = rows

    if args.json is not None:
        rows = {f"{voice}/{name}": [asdict(s) for s in scored[voice, name]] for voice, name in scored}
        args.json.write_text(json.dumps(rows, indent=1))

    def complete(s: Scored, signal: str) -> bool:
        audio, text = s.audio >= 0.5, s.text >= args.text_threshold
        return {"audio": audio, "text": text, "both": audio and text}[signal]

    print(
        f"# end-of-turn signals on the mid-sentence-pause set ({platform.machine()}, "
        f"{args.silence} ms of the pause heard, text threshold {args.text_threshold})\n"
    )
    print("| signal | voice | heads scored complete (false cut-offs) | fulls complete | questions complete |")
    print("| --- | --- | ---: | ---: | ---: |")
    for signal in ("audio", "text", "both"):
        for voice in VOICES:
            cells = []
            for name in sets:
                rows = scored[voice, name]
                cells.append(f"{sum(complete(s, signal) for s in rows)}/{len(rows)}")
            print(f"| {signal} | {voice} | {' | '.join(cells)} |")
    print("\nheads the text signal scores complete (the transcript, its probability):")
    for voice in VOICES:
        for s in scored[voice, "heads"]:
            if complete(s, "text"):
                print(f"- {voice}: {s.transcript!r} {s.text:.3f}")


if __name__ == "__main__":
    main()
