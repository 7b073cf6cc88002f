"""Thousands of random rounds of the stream contract against a real server.

Each round (loadtests/contract_rounds.py) starts a response and, at a random
moment, cancels it, interrupts it with the next response, or drops the socket
and resumes from an offset the client held; then replays the stream. Every
round checks that the delivered deltas, ``response.done`` and the replays
agree. The suite runs a few hundred rounds (tests/app/test_stream_contract.py);
this script runs as many as asked, against the memory log or a real Redis,
and prints what it ran and how many rounds disagreed.

    python loadtests/stream_contract.py --rounds 2000 --clients 6
    python loadtests/stream_contract.py --rounds 2000 --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.contract_rounds import Tally, run_round  # noqa: E402
from loadtests.server_proc import load_average, served  # noqa: E402


async def run(ws_url: str, rounds: int, clients: int, seed: int) -> tuple[Tally, list[str]]:
    """``rounds`` rounds over ``clients`` concurrent clients; the tally and failures."""
    tally, failures = Tally(), []
    per_client = -(-rounds // clients)

    async def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        for round_ in range(per_client):
            try:
                await run_round(ws_url, rng, tally)
            except AssertionError as exc:
                failures.append(f"client {index} round {round_}: {exc}")

    await asyncio.gather(*(client(i) for i in range(clients)))
    return tally, failures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", help="serve from this Redis instead of the memory log")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    flags = ["--max-model-len", "1024", "--max-tokens", "64"]
    if args.redis_url:
        flags += ["--redis-url", args.redis_url, "--secret", "stream-contract"]
    with served(flags) as http_url:
        started = time.perf_counter()
        tally, failures = asyncio.run(
            run(http_url.replace("http", "ws", 1) + "/v1/realtime", args.rounds, args.clients, args.seed)
        )
        wall_s = time.perf_counter() - started
    num_rounds = sum(tally.scenarios.values())
    result = {
        "rounds": num_rounds,
        "failures": len(failures),
        "wall_s": round(wall_s, 1),
        "log": "redis" if args.redis_url else "memory",
        "clients": args.clients,
        "scenarios": dict(tally.scenarios),
        "finish_reasons": dict(tally.finish_reasons),
        "tokens": tally.tokens,
        "load_average": load_average(),
    }
    print(json.dumps(result, indent=2))
    for failure in failures[:20]:
        print("FAIL", failure)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
