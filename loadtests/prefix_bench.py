"""Prefix caching across turns: TTFT of each turn of a conversation, cache on and off.

A voice-assistant conversation over ``/v1/realtime``: a system prompt of about
200 tokens, 12 user turns of 10-40 words, answers of up to ``--max-tokens``
tokens, and a barge-in every third turn (the client cancels after a few
deltas with ``heard_chars`` at about half of what it got, as a voice client
whose user spoke over the answer). Every turn re-sends nothing: the session
keeps the conversation, so turn ``n``'s prompt is the whole history so far.

TTFT is measured at the client, from sending ``response.create`` to the first
``response.delta``. The same conversations run against two servers started
by this script on the bundled model, one with the prefix cache (the default)
and one with ``--no-prefix-caching``, one conversation alone and then
``--concurrency`` at once (each its own system prompt, so nothing is shared
between them but the template's first tokens). Greedy decoding, so both
servers see the same answers and the same prompts. ``usage.cached_tokens`` of
each turn is reported too.

Targets (issue 18): turn 12's TTFT within 1.3x of turn 1's, and at least 5x
lower than without the cache; at 1 and at 8 concurrent conversations.

Writes ``--out`` (default ``docs/perf/prefix-cache.md``) and a json beside it.
Usage: ``python loadtests/prefix_bench.py [--turns 12] [--concurrency 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_proc import served  # noqa: E402

from bargein.client.realtime_client import RealtimeClient  # noqa: E402

SYSTEM = (
    "You are Juniper, a friendly voice assistant in a kitchen. You help with recipes, "
    "timers, unit conversions and shopping lists. Answer in one or two short sentences, "
    "because your answers are spoken aloud. Never use lists, markdown or emoji. If the user "
    "interrupts you, stop and answer their new question. If you are not sure what the user "
    "meant, ask one short question back. Use metric units unless the user asks otherwise. "
    "Keep track of what is in the oven and of every timer the user set, and remind the user "
    "of them when it helps. Be warm, but do not chat about yourself. Household: {who}."
)
HOUSEHOLDS = [
    "Ana and her two children",
    "Ben, who cooks for a running club",
    "Chloe, a vegetarian",
    "Dev and his grandmother",
    "Elif, who bakes bread every weekend",
    "Farid, who is learning to cook",
    "Grete, who hosts dinner parties",
    "Hiro, who likes spicy food",
]
TURNS = [
    "Hi, I want to bake a simple loaf of bread this afternoon. What do I need?",
    "How much flour and water exactly, for one loaf?",
    "Can I use instant yeast instead of fresh yeast, and how much of it?",
    "Okay, the dough is mixed. How long should it rise in a warm kitchen?",
    "Set a timer for that please, and remind me what to do after it rings.",
    "While it rises, what soup would go well with fresh bread on a cold day?",
    "I have carrots, two onions, a potato, some ginger and half a litre of stock. Is that enough?",
    "How long do I simmer the carrots before I blend everything?",
    "The timer rang and the dough has doubled. What now, do I knead it again?",
    "What temperature for the oven, and do I need steam for a good crust?",
    "How do I know when the bread is done without cutting it open?",
    "Thanks. Can you sum up the timers I still have running and what is left to do?",
]


WARM_UP = ["Good morning! Are you listening?", "What sort of things can you help me with today?"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    index: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    interrupted: bool


async def conversation(
    url: str, who: str, turns: int, max_tokens: int, barge_every: int, utterances: list[str] = TURNS
) -> list[Turn]:
    """One conversation on one connection; the TTFT of each of its turns."""
    out: list[Turn] = []
    async with RealtimeClient(url) as client:
        await client.update(instructions=SYSTEM.format(who=who))
        for i in range(turns):
            barge = barge_every > 0 and (i + 1) % barge_every == 0
            started = time.perf_counter()
            ttft = None
            num_deltas = 0
            async for _ in client.respond(
                utterances[i % len(utterances)], max_tokens=max_tokens, temperature=0
            ):
                if ttft is None:
                    ttft = time.perf_counter() - started
                num_deltas += 1
                if barge and num_deltas >= 6:
                    break
            response = client.current
            assert response is not None
            if barge and response.done is None:
                done = await client.cancel(heard_chars=len(response.text) // 2)
            else:
                done = response.done
            assert done is not None and ttft is not None, done
            usage = done["usage"]
            out.append(
                Turn(
                    index=i + 1,
                    ttft_s=ttft,
                    prompt_tokens=usage["prompt_tokens"],
                    cached_tokens=usage.get("cached_tokens") or 0,
                    completion_tokens=usage["completion_tokens"],
                    interrupted=done["finish_reason"] == "interrupted",
                )
            )
    return out


async def run_all(url: str, concurrency: int, args: argparse.Namespace) -> list[list[Turn]]:
    return list(
        await asyncio.gather(
            *(
                conversation(
                    url, HOUSEHOLDS[c % len(HOUSEHOLDS)], args.turns, args.max_tokens, args.barge_every
                )
                for c in range(concurrency)
            )
        )
    )


def per_turn(results: list[list[Turn]], turns: int) -> list[dict[str, float]]:
    """Median over conversations of each turn's numbers."""
    rows = []
    for t in range(turns):
        at = [conv[t] for conv in results]
        rows.append(
            {
                "turn": t + 1,
                "ttft_s": statistics.median(x.ttft_s for x in at),
                "prompt_tokens": statistics.median(x.prompt_tokens for x in at),
                "cached_tokens": statistics.median(x.cached_tokens for x in at),
                "interrupted": any(x.interrupted for x in at),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--barge-every", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="conversations run one after the other for the 1-conversation case",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/perf/prefix-cache.md"))
    args = parser.parse_args()

    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name, flags in (("cache", []), ("no cache", ["--no-prefix-caching"])):
        with served(flags) as base:
            url = base.replace("http://", "ws://") + "/v1/realtime"
            # Warm-up (first-call costs out of the numbers) with a household and words
            # of its own: each measured conversation's first turn then finds only the
            # system prompt's shared head cached, as a new conversation would.
            asyncio.run(conversation(url, "a warm-up household", 2, args.max_tokens, 0, WARM_UP))
            runs[name] = {}
            for concurrency in (1, args.concurrency):
                if concurrency == 1:  # one at a time, each a new household: a median per turn
                    results = [
                        asyncio.run(
                            conversation(
                                url,
                                f"{HOUSEHOLDS[r % len(HOUSEHOLDS)]} (alone)",
                                args.turns,
                                args.max_tokens,
                                args.barge_every,
                            )
                        )
                        for r in range(args.repeats)
                    ]
                else:
                    results = asyncio.run(run_all(url, concurrency, args))
                runs[name][str(concurrency)] = per_turn(results, args.turns)
                print(name, concurrency, [round(r["ttft_s"], 3) for r in runs[name][str(concurrency)]])
    report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    lines = [
        "# Prefix caching across turns",
        "",
        f"`python loadtests/prefix_bench.py` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}. The bundled SmolLM2-135M, greedy, "
        f"{args.turns} turns of one conversation per connection (answers up to {args.max_tokens} tokens, "
        f"a barge-in with `heard_chars` at half of what was received every {args.barge_every} turns); "
        "TTFT at the client: for 1 conversation the median of `--repeats` conversations run one after the other (each with its own household, none of the concurrent run's), for the concurrent case the median over the conversations. Both servers ran in this script, "
        "one after the other: the prefix cache on (default) and `--no-prefix-caching`.",
        "",
    ]
    summary = []
    for concurrency in runs["cache"]:
        on, off = runs["cache"][concurrency], runs["no cache"][concurrency]
        lines += [
            f"## {concurrency} concurrent conversation{'s' if concurrency != '1' else ''}",
            "",
            "| turn | prompt tokens | cached tokens | TTFT cache on | TTFT cache off | off / on | barge-in |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
        ]
        for a, b in zip(on, off, strict=True):
            lines.append(
                f"| {a['turn']} | {a['prompt_tokens']:.0f} | {a['cached_tokens']:.0f} | "
                f"{a['ttft_s'] * 1000:.0f} ms | {b['ttft_s'] * 1000:.0f} ms | "
                f"{b['ttft_s'] / a['ttft_s']:.1f}x | {'yes' if a['interrupted'] else ''} |"
            )
        last, first = on[-1]["ttft_s"], on[0]["ttft_s"]
        speedup = off[-1]["ttft_s"] / last
        summary.append(
            f"- {concurrency} concurrent: turn {args.turns} / turn 1 with the cache "
            f"**{last / first:.2f}x** (target <= 1.3x); turn {args.turns} without / with the cache "
            f"**{speedup:.1f}x** (target >= 5x)."
        )
        lines.append("")
    lines[4:4] = ["## Summary", "", *summary, ""]  # after the introduction
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": runs}, indent=1) + "\n"
    )
    print("\n".join(summary))


if __name__ == "__main__":
    main()
