"""xgrammar against llguidance on this CPU, for the bundled SmolLM2 tokenizer.

What issue 40 asked before choosing a grammar library: the one-off cost of
wrapping the tokenizer, the compile time of a few JSON schemas, the time to
fill one sequence's token bitmask per generated token (the cost a
constrained row adds to each step), and what each does with a schema
keyword it cannot enforce.

Usage::

    .venv/bin/python loadtests/grammar_choice_bench.py            # prints a markdown table
    .venv/bin/python loadtests/grammar_choice_bench.py --repeats 5

The masks are filled along a real path: each schema's example instance,
tokenized, is fed token by token (fill the mask, then accept the token), so
the time is that of a sequence that decodes the instance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import llguidance
import llguidance.hf
import torch
import xgrammar as xgr

from bargein.engine.config import ModelConfig
from bargein.engine.model.loader import load_tokenizer

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "flat object": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36},
    ),
    "nested, arrays, enum": (
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "day": {"enum": ["mon", "tue", "wed"]},
                            "temp_c": {"type": "number", "minimum": -50, "maximum": 60},
                        },
                        "required": ["day", "temp_c"],
                    },
                },
            },
            "required": ["city", "days"],
        },
        {"city": "Paris", "days": [{"day": "mon", "temp_c": 12.5}, {"day": "tue", "temp_c": 9}]},
    ),
    "anyOf, $ref, pattern": (
        {
            "$defs": {"id": {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"}},
            "type": "object",
            "properties": {
                "ref": {"$ref": "#/$defs/id"},
                "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]},
            },
            "required": ["ref", "value"],
        },
        {"ref": "abc-12", "value": "short"},
    ),
    "tool call (2 functions)": (
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": "get_weather"},
                        "arguments": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                            "required": ["city"],
                        },
                    },
                    "required": ["name", "arguments"],
                },
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": "book_table"},
                        "arguments": {
                            "type": "object",
                            "properties": {"people": {"type": "integer", "minimum": 1}},
                            "required": ["people"],
                        },
                    },
                    "required": ["name", "arguments"],
                },
            ]
        },
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
    ),
}
UNSUPPORTED = {"uniqueItems": True, "if": {"type": "string"}, "format": "email-ish"}


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench_xgrammar(tokenizer: Any, vocab: int, repeats: int) -> dict[str, Any]:
    info_s, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab), repeats)
    out: dict[str, Any] = {"tokenizer_s": info_s, "compile_s": {}, "mask_us": {}}
    for name, (schema, instance) in SCHEMAS.items():

        def compile_one(schema: dict[str, Any] = schema) -> Any:
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":")
            )

        out["compile_s"][name], compiled = timed(compile_one, repeats)
        ids = tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        per_token = []
        for _ in range(repeats):
            matcher = xgr.GrammarMatcher(compiled)
            for token in ids:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask, 0)
                per_token.append(time.perf_counter() - t0)
                assert matcher.accept_token(token), (name, token)
        out["mask_us"][name] = statistics.median(per_token) * 1e6
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    try:
        compiler.compile_json_schema(json.dumps({"type": "array", **UNSUPPORTED}), any_whitespace=False)
        out["unsupported"] = "compiles (keywords ignored)"
    except Exception as exc:  # noqa: BLE001 - whatever it raises is the finding
        out["unsupported"] = f"refused: {str(exc)[:80]}"
    return out


def bench_llguidance(tokenizer: Any, vocab: int, repeats: int) -> dict[str, Any]:
    tok_s, lltok = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab), repeats)
    out: dict[str, Any] = {"tokenizer_s": tok_s, "compile_s": {}, "mask_us": {}}
    defaults: Any = {"whitespace_flexible": False}
    for name, (schema, instance) in SCHEMAS.items():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)

        def compile_one(grammar: str = grammar) -> Any:
            return llguidance.LLMatcher(lltok, grammar, log_level=0)

        out["compile_s"][name], _ = timed(compile_one, repeats)
        ids = tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
        per_token = []
        for _ in range(repeats):
            matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
            for token in ids:
                t0 = time.perf_counter()
                matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)
                per_token.append(time.perf_counter() - t0)
                assert matcher.consume_token(token), (name, token, matcher.get_error())
        out["mask_us"][name] = statistics.median(per_token) * 1e6
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        {"type": "array", **UNSUPPORTED}, defaults=defaults
    )
    error = llguidance.LLMatcher.validate_grammar(grammar, lltok)
    out["unsupported"] = f"refused: {error[:80]}" if error else "compiles (keywords ignored)"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = load_tokenizer(ModelConfig())
    vocab = len(tokenizer)
    torch.set_num_threads(1)
    results = {
        f"xgrammar {version('xgrammar')}": bench_xgrammar(tokenizer, vocab, args.repeats),
        f"llguidance {version('llguidance')}": bench_llguidance(tokenizer, vocab, args.repeats),
    }
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, vocab {vocab}, median of {args.repeats}\n"
    )
    names = list(results)
    print("| | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---" for _ in names) + " |")
    print("| tokenizer wrap, s | " + " | ".join(f"{results[n]['tokenizer_s']:.3f}" for n in names) + " |")
    for schema in SCHEMAS:
        cells = " | ".join(f"{results[n]['compile_s'][schema] * 1e3:.1f}" for n in names)
        print(f"| compile '{schema}', ms | {cells} |")
    for schema in SCHEMAS:
        cells = " | ".join(f"{results[n]['mask_us'][schema]:.0f}" for n in names)
        print(f"| mask fill per token '{schema}', us | {cells} |")
    print("| uniqueItems + if + format | " + " | ".join(results[n]["unsupported"] for n in names) + " |")


if __name__ == "__main__":
    main()
