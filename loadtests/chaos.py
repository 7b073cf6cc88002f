"""Chaos: three bargein nodes on one Redis under load, killed and restarted at random.

Starts a redis-server and ``--nodes`` ``bargein serve`` processes on loopback
(shared secret, distinct ``--node-id``, the default format: since issue 37 a
takeover continues a stream exactly in it, not only in exact fp32), computes a reference answer for each
of a few prompts (greedy, one at a time, before any chaos), then runs
``--clients`` client loops for ``--duration`` seconds while a chaos loop
SIGKILLs a random node every ``--kill-every`` seconds (at most one node down
at a time) and restarts it ``--down`` seconds later. Clients behave like
bargein's own: each response is created on a random node; when its
connection drops, the client reconnects to another node and sends
``stream.resume`` from the end of the last delta it got (the node it lands
on takes the stream over if its node died). After the duration, requests in
flight get ``--drain`` seconds to finish.

Reported (stdout as JSON, and ``--out``): responses started, completed
exactly (text equal to the reference), completed with a different text,
completed with an error (an ``error`` event, ``finish_reason`` error, or no
node answering a resume for ``--give-up`` seconds), still unfinished at the
end, streams continued by another node (``took over`` in the nodes' logs),
and tokens lost (a delta starting past the last end received) or
duplicated (a delta starting before it). The goal is zero lost, zero
duplicated.

Usage::

    python loadtests/chaos.py --duration 120 --out docs/perf/chaos.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.redis_server import RedisServer, free_port  # noqa: E402

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works to a child.",
    "List some tips for learning to cook.",
    "Describe a walk through a forest in autumn.",
    "Why is the sky blue? Answer in detail.",
    "Write a poem about the sea.",
)
SECRET = "chaos-secret"
SUBPROTOCOL = "bargein.v1.json"


@dataclass(slots=True)
class Node:
    """One ``bargein serve`` process (restarted on the same port and id)."""

    node_id: str
    port: int
    redis_url: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    num_kills: int = 0

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def start(self, max_tokens: int) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bargein",
                    "serve",
                    "--port",
                    str(self.port),
                    "--redis-url",
                    self.redis_url,
                    "--node-id",
                    self.node_id,
                    "--secret",
                    SECRET,
                    "--lease-ttl",
                    "2",
                    "--max-tokens",
                    str(max_tokens),
                    "--max-num-seqs",
                    "16",
                    "--log-level",
                    "info",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self.num_kills += 1

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass(slots=True, kw_only=True)
class Outcome:
    """One response as its client saw it."""

    prompt: int
    text: str = ""
    end: int = 0
    finish_reason: str | None = None
    error: str | None = None
    resumes: int = 0
    lost_tokens: int = 0
    duplicated_tokens: int = 0
    nodes: list[str] = field(default_factory=list)


class GaveUp(Exception):
    """No node answered for ``give_up_s``."""


async def open_session(
    nodes: list[Node], rng: random.Random, give_up_s: float
) -> tuple[ClientConnection, Node]:
    """A new connection to a random node that accepts it (retrying others)."""
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        node = rng.choice(nodes)
        try:
            ws = await connect(node.ws_url, open_timeout=5, subprotocols=[SUBPROTOCOL])  # type: ignore[list-item]
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if first["type"] == "session.created":
                return ws, node
            await ws.close()
        except (OSError, ConnectionClosed, InvalidStatus, TimeoutError):
            pass  # down, loading (1013) or dying: try another
        await asyncio.sleep(0.2)
    raise GaveUp("no node accepted a connection")


async def one_response(
    nodes: list[Node], rng: random.Random, prompt: int, max_tokens: int, give_up_s: float
) -> Outcome:
    outcome = Outcome(prompt=prompt)
    ws, node = await open_session(nodes, rng, give_up_s)
    outcome.nodes.append(node.node_id)
    await ws.send(
        json.dumps(
            {
                "type": "response.create",
                "max_tokens": max_tokens,
                "temperature": 0,
                "input": [{"role": "user", "content": PROMPTS[prompt]}],
            }
        )
    )
    created: dict[str, Any] = {}
    while True:
        try:
            event = json.loads(await asyncio.wait_for(ws.recv(), give_up_s))
        except (ConnectionClosed, OSError, TimeoutError):
            if not created:
                outcome.error = "dropped before response.created"
                return outcome
            ws, node = await resume(nodes, rng, created, outcome, give_up_s)
            continue
        kind = event["type"]
        if kind == "response.created":
            created = event
        elif kind == "response.delta":
            take(outcome, event)
        elif kind == "response.done":
            outcome.finish_reason = event["finish_reason"]
            await ws.close()
            return outcome
        elif kind == "error":
            if event.get("retryable") and created:
                await ws.close()
                ws, node = await resume(nodes, rng, created, outcome, give_up_s)
                continue
            outcome.error = event["code"]
            await ws.close()
            return outcome


async def resume(
    nodes: list[Node], rng: random.Random, created: dict[str, Any], outcome: Outcome, give_up_s: float
) -> tuple[ClientConnection, Node]:
    ws, node = await open_session(nodes, rng, give_up_s)
    outcome.resumes += 1
    outcome.nodes.append(node.node_id)
    await ws.send(
        json.dumps(
            {
                "type": "stream.resume",
                "stream_id": created["stream_id"],
                "resume_token": created["resume_token"],
                "from": outcome.end,
            }
        )
    )
    return ws, node


def take(outcome: Outcome, delta: dict[str, Any]) -> None:
    """Append a delta; count tokens lost (gap) or duplicated (overlap)."""
    start, end = delta["start"], delta["end"]
    if start > outcome.end:
        outcome.lost_tokens += start - outcome.end
    elif start < outcome.end:
        outcome.duplicated_tokens += min(end, outcome.end) - start
    outcome.text += delta["text"]
    outcome.end = max(outcome.end, end)


async def client_loop(
    nodes: list[Node],
    rng: random.Random,
    until: float,
    max_tokens: int,
    give_up_s: float,
    outcomes: list[Outcome],
) -> None:
    while time.monotonic() < until:
        prompt = rng.randrange(len(PROMPTS))
        try:
            outcomes.append(await one_response(nodes, rng, prompt, max_tokens, give_up_s))
        except GaveUp as exc:
            outcomes.append(Outcome(prompt=prompt, error=str(exc)))


async def chaos_loop(
    nodes: list[Node],
    rng: random.Random,
    until: float,
    kill_every_s: float,
    down_s: float,
    max_tokens: int,
    events: list[str],
) -> None:
    started = time.monotonic()
    while time.monotonic() + kill_every_s < until:
        await asyncio.sleep(rng.uniform(0.5, 1.5) * kill_every_s)
        victim = rng.choice(nodes)
        victim.kill()
        events.append(f"{time.monotonic() - started:6.1f}s kill {victim.node_id}")
        await asyncio.sleep(down_s)
        victim.start(max_tokens)
        events.append(f"{time.monotonic() - started:6.1f}s restart {victim.node_id}")
        while not victim.ready():  # at most one node down (or loading) at a time
            await asyncio.sleep(0.5)
        events.append(f"{time.monotonic() - started:6.1f}s ready {victim.node_id}")


async def references(nodes: list[Node], max_tokens: int) -> list[str]:
    """Each prompt's uninterrupted greedy answer, one at a time on node 0."""
    texts = []
    rng = random.Random(0)
    for prompt in range(len(PROMPTS)):
        outcome = await one_response(nodes[:1], rng, prompt, max_tokens, 60)
        assert outcome.error is None and outcome.resumes == 0, outcome
        texts.append(outcome.text)
    return texts


def summarize(
    outcomes: list[Outcome], refs: list[str], unfinished: int, kills: int, args: argparse.Namespace
) -> dict[str, Any]:
    done = [o for o in outcomes if o.error is None and o.finish_reason not in (None, "error")]
    exact = [o for o in done if o.text == refs[o.prompt]]
    return {
        "nodes": args.nodes,
        "clients": args.clients,
        "duration_s": args.duration,
        "max_tokens": args.max_tokens,
        "kills": kills,
        "responses_started": len(outcomes) + unfinished,
        "completed_exactly": len(exact),
        "completed_different_text": len(done) - len(exact),
        "completed_with_error": len(outcomes) - len(done),
        "unfinished_at_end": unfinished,
        "responses_resumed": sum(1 for o in outcomes if o.resumes),
        "resumed_and_exact": sum(1 for o in exact if o.resumes),
        "lost_tokens": sum(o.lost_tokens for o in outcomes),
        "duplicated_tokens": sum(o.duplicated_tokens for o in outcomes),
        "errors": dict(Counter(o.error or o.finish_reason for o in outcomes if o not in done)),
        "different": [asdict(o) for o in done if o not in exact][:5],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    redis = RedisServer()
    redis.start()
    log_dir = tempfile.mkdtemp(prefix="bargein-chaos-")
    nodes = [
        Node(node_id=f"n{i}", port=free_port(), redis_url=redis.url, log_path=f"{log_dir}/n{i}.log")
        for i in range(args.nodes)
    ]
    try:
        for node in nodes:
            node.start(args.max_tokens)
        while not all(node.ready() for node in nodes):
            await asyncio.sleep(0.5)
        refs = await references(nodes, args.max_tokens)
        until = time.monotonic() + args.duration
        outcomes: list[Outcome] = []
        events: list[str] = []
        clients = [
            asyncio.create_task(
                client_loop(
                    nodes, random.Random(rng.random()), until, args.max_tokens, args.give_up, outcomes
                )
            )
            for _ in range(args.clients)
        ]
        await chaos_loop(nodes, rng, until, args.kill_every, args.down, args.max_tokens, events)
        _, pending = await asyncio.wait(clients, timeout=max(0.0, until - time.monotonic()) + args.drain)
        for task in pending:
            task.cancel()
        report = summarize(outcomes, refs, len(pending), sum(n.num_kills for n in nodes), args)
        report["takeovers"] = sum(
            Path(n.log_path).read_text(errors="replace").count("took over") for n in nodes
        )
        report["chaos"] = events
        report["logs"] = log_dir
        return report
    finally:
        for node in nodes:
            if node.proc is not None:
                node.proc.terminate()
                node.proc.wait()
        redis.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6, help="concurrent client loops")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of chaos")
    parser.add_argument("--kill-every", type=float, default=25.0, help="mean seconds between kills")
    parser.add_argument("--down", type=float, default=3.0, help="seconds a killed node stays down")
    parser.add_argument("--drain", type=float, default=90.0, help="seconds to finish in-flight")
    parser.add_argument(
        "--give-up", type=float, default=60.0, help="seconds without any answer before a client gives up"
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if report["lost_tokens"] == report["duplicated_tokens"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
