"""What constrained decoding costs, and whether its answers hold (issue 40).

Three parts, one run:

1. **Decode tokens/s** of the engine (default format, greedy) at N = 1 and
   8 concurrent requests with every request constrained, half of them, and
   none, the mixes alternating run by run (A B C, C B A, ...) so a drifting
   load hits each alike. A constrained request's grammar is a JSON schema
   whose answer is longer than ``--new-tokens`` (a list of at least 100
   ``{"name", "qty"}`` objects), so every request decodes exactly that many
   tokens (unconstrained ones with EOS ignored). Also where the step's time
   went: waiting for the masks after the forward pass (they are filled on
   a worker thread during it) and sampling.
2. **Grammar compile time** for ``--schemas`` hypothesis-generated schemas
   (loadtests/structured_schemas.py): the first compile of each, and a
   second request for the same schema (the cache).
3. With ``--acceptance``: each of those schemas over HTTP with the official
   ``openai`` SDK against an in-process server (``response_format``
   ``json_schema`` strict, greedy), the answer validated with
   ``jsonschema``; and ``tool_choice`` ``required`` and named over
   ``--tool-seeds`` seeds, each call validated against its function.

Usage::

    .venv/bin/python loadtests/structured_bench.py                      # parts 1 and 2, 20 schemas
    .venv/bin/python loadtests/structured_bench.py --schemas 200 --acceptance

Writes the report below the marker line of ``--out``
(docs/perf/structured.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
from hypothesis import HealthCheck, Phase, given, settings

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.grammar import GrammarCompiler
from bargein.engine.grammar_spec import GrammarSpec
from bargein.engine.model.loader import load_tokenizer
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the checkout's loadtests/

from loadtests.structured_schemas import prompt_for, schemas  # noqa: E402

MARKER = "<!-- loadtests/structured_bench.py writes below this line -->"
LIST_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "qty"],
                "additionalProperties": False,
            },
            "minItems": 100,
            "maxItems": 200,
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}
MIXES = {"none": 0.0, "half": 0.5, "all": 1.0}


def build_engine(max_batch: int, max_model_len: int) -> LLMEngine:
    runner = ModelRunner(
        ModelConfig(),
        CacheConfig(block_size=16, num_blocks=max_batch * -(-max_model_len // 16)),
        max_model_len,
    )
    config = SchedulerConfig(
        max_num_seqs=max_batch,
        max_num_batched_tokens=256,
        prefill_chunk_size=256,
        max_model_len=max_model_len,
    )
    return LLMEngine(runner, config)


def decode_run(
    engine: LLMEngine, prompt: tuple[int, ...], n: int, share: float, new_tokens: int, tag: str
) -> dict[str, float]:
    """``n`` requests at once, ``round(n * share)`` of them constrained; decode tokens/s
    once every request has its first token, and the mask wait and sampling per step."""
    grammar = GrammarSpec.json_schema(LIST_SCHEMA)
    num_constrained = round(n * share)
    for i in range(n):
        constrained = i < num_constrained
        params = SamplingParams(
            temperature=0,
            max_tokens=new_tokens,
            ignore_eos=not constrained,
            grammar=grammar if constrained else None,
        )
        engine.add_request(EngineRequest(request_id=f"{tag}-{i}", prompt_token_ids=prompt, params=params))
    phases_before = dict(engine.time_by_phase)
    first: dict[str, float] = {}
    produced: list[tuple[float, int]] = []
    num_steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        num_steps += 1
        now = time.perf_counter()
        for out in outputs:
            first.setdefault(out.request_id, now)
        produced.append((now, sum(len(o.new_token_ids) for o in outputs)))
    end = time.perf_counter()
    window_start = max(first.values())
    decoded = sum(tokens for t, tokens in produced if t > window_start)
    spent = {k: engine.time_by_phase[k] - phases_before.get(k, 0.0) for k in ("mask_wait", "sample", "model")}
    return {
        "tok_s": decoded / (end - window_start),
        "mask_wait_ms": spent["mask_wait"] / num_steps * 1e3,
        "sample_ms": spent["sample"] / num_steps * 1e3,
        "model_ms": spent["model"] / num_steps * 1e3,
    }


def decode_bench(args: argparse.Namespace) -> list[str]:
    engine = build_engine(8, 64 + args.new_tokens + 1)
    tokenizer = engine.tokenizer
    prompt = tuple(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "List the things in a kitchen as JSON."}],
            add_generation_prompt=True,
            tokenize=True,
        )["input_ids"]
    )
    engine.grammars.matcher(GrammarSpec.json_schema(LIST_SCHEMA))  # wrap the tokenizer, compile: not timed
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    order = list(MIXES)
    for run in range(args.runs):
        for n in (1, 8):
            for mix in order if run % 2 == 0 else order[::-1]:
                if n == 1 and mix == "half":
                    continue
                result = decode_run(engine, prompt, n, MIXES[mix], args.new_tokens, f"r{run}-{n}-{mix}")
                results.setdefault((n, mix), []).append(result)
                print(n, mix, {k: round(v, 2) for k, v in result.items()}, flush=True)
    lines = [
        f"Decode, greedy, {args.new_tokens} tokens a request, median of {args.runs} runs "
        "(mixes alternating); the engine's default format:",
        "",
        "| N | constrained | decode tok/s | vs none | mask wait ms/step | sample ms/step | model ms/step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in (1, 8):
        base = statistics.median(r["tok_s"] for r in results[(n, "none")])
        for mix in MIXES:
            if (n, mix) not in results:
                continue
            rs = results[(n, mix)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            lines.append(
                f"| {n} | {mix} | {med['tok_s']:.1f} | {100 * (med['tok_s'] / base - 1):+.1f}% | "
                f"{med['mask_wait_ms']:.2f} | {med['sample_ms']:.2f} | {med['model_ms']:.1f} |"
            )
    return lines


def generated_schemas(count: int) -> list[dict[str, Any]]:
    collected: list[dict[str, Any]] = []

    @settings(
        max_examples=count,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(schemas())
    def collect(schema: dict[str, Any]) -> None:
        collected.append(schema)

    collect()
    return collected


def compile_bench(
    schema_list: list[dict[str, Any]], tokenizer: Any, vocab: int, eos: frozenset[int]
) -> list[str]:
    compiler = GrammarCompiler(tokenizer, vocab, eos)
    compiler.matcher(GrammarSpec.json_schema({"type": "object"}))  # the tokenizer wrap, apart
    cold, cached = [], []
    for schema in schema_list:
        spec = GrammarSpec.json_schema(schema)
        t0 = time.perf_counter()
        compiler.matcher(spec)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compiler.matcher(spec)
        cached.append(time.perf_counter() - t0)
    stats = compiler.stats()

    def row(name: str, values: list[float]) -> str:
        ms = sorted(v * 1e3 for v in values)
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        return f"| {name} | {statistics.median(ms):.2f} | {p90:.2f} | {ms[-1]:.2f} |"

    return [
        f"Grammar compile, {len(schema_list)} generated schemas (tokenizer wrap {stats.tokenizer_s:.2f} s, once):",
        "",
        "| | median ms | p90 ms | max ms |",
        "| --- | --- | --- | --- |",
        row("first compile", cold),
        row("same schema again (cache)", cached),
    ]


def acceptance(schema_list: list[dict[str, Any]], tool_seeds: int) -> list[str]:
    import openai

    from bargein.app.embedded import EmbeddedServer
    from bargein.app.settings import ServerConfig, Settings
    from bargein.engine.config import EngineConfig
    from bargein.session.conversation.config import SessionConfig

    server = EmbeddedServer(
        Settings(
            engine=EngineConfig(scheduler=SchedulerConfig(max_model_len=1024)),
            session=SessionConfig(max_tokens=400, default_max_tokens=64),
            server=ServerConfig(port=0, log_level="warning"),
        )
    )
    server.start()
    failures: list[str] = []
    lengths = []
    try:
        client = openai.OpenAI(base_url=f"http://{server.host}:{server.port}/v1", api_key="x", max_retries=0)
        for schema in schema_list:
            reply = client.chat.completions.create(
                model="bargein",
                messages=prompt_for(schema),  # type: ignore[arg-type]
                max_tokens=400,
                temperature=0,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": schema, "strict": True},
                },
            )
            assert reply.usage is not None
            lengths.append(reply.usage.completion_tokens)
            try:
                jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)
            except (ValueError, jsonschema.ValidationError) as exc:
                failures.append(f"{json.dumps(schema)[:200]}: {str(exc)[:200]}")
        tool_failures = tool_acceptance(client, tool_seeds)
    finally:
        server.stop()
    return [
        f"Acceptance over HTTP (the `openai` SDK, `response_format` `json_schema` strict, greedy): "
        f"{len(schema_list) - len(failures)} of {len(schema_list)} answers validate with `jsonschema` "
        f"(answers of {min(lengths)} to {max(lengths)} tokens, median {statistics.median(lengths):.0f}).",
        *[f"- failed: {f}" for f in failures],
        "",
        f"Tool calls (`tool_choice` `required` and named, {tool_seeds} seeds each, temperature 1): "
        f"{2 * tool_seeds - len(tool_failures)} of {2 * tool_seeds} valid.",
        *[f"- failed: {f}" for f in tool_failures],
    ]


def tool_acceptance(client: Any, seeds: int) -> list[str]:
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    booking = {
        "type": "object",
        "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12}},
        "required": ["people"],
        "additionalProperties": False,
    }
    of = {"get_weather": weather, "book_table": booking}
    tools = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in of.items()]
    failures = []
    for seed in range(seeds):
        for choice in ("required", {"type": "function", "function": {"name": "book_table"}}):
            reply = client.chat.completions.create(
                model="bargein",
                messages=[{"role": "user", "content": "Weather in Rome, and a table for 4."}],
                tools=tools,
                tool_choice=choice,
                max_tokens=200,
                temperature=1.0,
                seed=seed,
            )
            try:
                calls = reply.choices[0].message.tool_calls
                assert calls and reply.choices[0].finish_reason == "tool_calls"
                for call in calls:
                    jsonschema.validate(json.loads(call.function.arguments), of[call.function.name])
            except (AssertionError, KeyError, ValueError, jsonschema.ValidationError) as exc:
                failures.append(f"seed {seed} {choice}: {exc!r}"[:200])
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--acceptance", action="store_true")
    parser.add_argument("--accept", type=int, default=None, help="acceptance on the first N schemas only")
    parser.add_argument("--tool-seeds", type=int, default=20)
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("docs/perf/structured.md"))
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    lines = [
        MARKER,
        "",
        "## The benchmark",
        "",
        f"`loadtests/structured_bench.py{' --skip-decode' if args.skip_decode else f' --runs {args.runs}'}"
        f" --schemas {args.schemas}"
        f"{' --acceptance' if args.acceptance else ''}"
        f"{f' --accept {args.accept}' if args.accept else ''} --new-tokens {args.new_tokens}"
        f" --tool-seeds {args.tool_seeds}`, {started}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {load:.2f} at the start (a shared machine).",
        "",
    ]
    schema_list = generated_schemas(args.schemas)
    if not args.skip_decode:
        lines += [*decode_bench(args), ""]
    tokenizer = load_tokenizer(ModelConfig())
    lines += [*compile_bench(schema_list, tokenizer, len(tokenizer), frozenset({tokenizer.eos_token_id})), ""]
    if args.acceptance:
        lines += [*acceptance(schema_list[: args.accept], args.tool_seeds), ""]
    text = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    head = text.split(MARKER)[0].rstrip() + "\n\n"
    args.out.write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
