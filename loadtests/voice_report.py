"""The voice benchmark's report (``docs/perf/voice.md``) from its results.

``results`` is what ``voice_bench.py`` measured, per server: ``questions``
(mode -> sessions -> turns and speculations), ``paused`` (mode -> turns of
the mid-sentence-pause set) and ``refused`` (mode -> the server's error).
Each turn is a :class:`loadtests.voice_session.Turn` as a dict.
"""

from __future__ import annotations

from typing import Any

BREAKDOWN = (
    ("committed", "end of turn"),
    ("transcript", "transcript"),
    ("first_token", "first token"),
    ("first_audio", "**first audio (voice to voice)**"),
)


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``; None if empty."""
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def ms(v: float | None) -> str:
    """Seconds as whole milliseconds, or a dash."""
    return "—" if v is None else f"{v * 1000:.0f}"


def _values(turns: list[dict[str, Any]], name: str) -> list[float]:
    return [t[name] for t in turns if t.get(name) is not None]


def _p50_p95(turns: list[dict[str, Any]], name: str) -> str:
    values = _values(turns, name)
    return f"{ms(pct(values, 50))} / {ms(pct(values, 95))}"


def question_rows(server: str, questions: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """One row per mode and number of sessions."""
    rows = []
    for mode, levels in questions.items():
        for n, level in levels.items():
            turns = level["turns"]
            answered = sum(1 for t in turns if not t["lost"] and t["refused"] is None)
            refused = sum(1 for t in turns if t["refused"] is not None)
            errors = sum(len(t["errors"]) for t in turns)
            spec = level.get("speculations", {})
            cells = [_p50_p95(turns, name) for name, _ in BREAKDOWN]
            rows.append(
                f"| {server} | {mode} | {n} | {answered}/{len(turns)} | {refused} | {errors} | "
                + " | ".join(cells)
                + f" | {_p50_p95(turns, 'stall')} | {_p50_p95(turns, 'barge_started')} | "
                f"{_p50_p95(turns, 'barge_done')} | {spec.get('adopted', 0):.0f} / {spec.get('dropped', 0):.0f} |"
            )
    return rows


def paused_rows(server: str, paused: dict[str, dict[str, Any]]) -> list[str]:
    """One row per mode of the mid-sentence-pause set."""
    rows = []
    for mode, result in paused.items():
        turns = result["turns"]
        n = len(turns)
        cut = sum(t["cut_off"] for t in turns)
        split = sum(t["split"] for t in turns)
        lost = sum(t["lost"] for t in turns)
        rate = f"{100 * cut / n:.0f}%" if n else "—"
        rows.append(
            f"| {server} | {mode} | {n} | **{cut} ({rate})** | {split} | {lost} | "
            f"{_p50_p95(turns, 'committed')} | {_p50_p95(turns, 'first_audio')} |"
        )
    return rows


def render(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """The Markdown report."""
    load = ", ".join(f"{x:.1f}" for x in meta["load_before"])
    load_after = ", ".join(f"{x:.1f}" for x in meta["load_after"])
    lines = [
        "# Voice latency and turn-taking",
        "",
        f"`{meta['command']}`, {meta['date']}, {meta['machine']}, one run; load average "
        f"before {load}, after {load_after}.",
        "",
        "## Complete questions",
        "",
        f"Sessions stream audio in real time (40 ms chunks, each sent once captured); {meta['turns']} "
        "questions each (espeak-ng), a barge-in every third; greedy answers of up to 40 tokens, "
        "spoken at 24 kHz. Times in ms at the client, p50 / p95, from the capture of the "
        "question's last voiced sample (barge-in: of the interruption's first). End of turn: "
        "`input_audio.committed`; stall: time a client playing the answer from its first audio "
        "waits for audio not arrived yet. Answered: turns whose answer ended; refused: turns answered "
        "by an `error` instead (admission); the rest are lost (no answer, refusal or error within "
        "the time limit).",
        "",
        "| server | mode | sessions | answered | refused | errors | "
        + " | ".join(label for _, label in BREAKDOWN)
        + " | stall | barge-in → speech_started | barge-in → response.done | speculations adopted / dropped |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for server, result in results.items():
        lines += question_rows(server, result["questions"])
    lines += [
        "",
        "## Mid-sentence pauses",
        "",
        f"{len(meta['pause_set'])} sentences with a pause of 400-900 ms inside (Piper's joe and "
        "espeak-ng's en-us, alternating; `loadtests/voice_utterances.py`). False cut-off: an answer "
        "(`response.created` or audio) arrived before the sentence's last chunk was sent, or the "
        "part before the pause was answered as a turn of its own (however late). Split: a turn was "
        "committed before the sentence ended (answered or not). End of turn and first "
        "audio: ms from the sentence's last voiced sample, p50 / p95.",
        "",
        "| server | mode | sentences | false cut-offs | splits | lost | end of turn | first audio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for server, result in results.items():
        lines += paused_rows(server, result["paused"])
    refused = [(server, mode, why) for server, r in results.items() for mode, why in r["refused"].items()]
    if refused:
        lines += ["", "Modes the server refused (not measured):", ""]
        lines += [f"- {server}, `{mode}`: {why}" for server, mode, why in refused]
    return "\n".join(lines) + "\n"
