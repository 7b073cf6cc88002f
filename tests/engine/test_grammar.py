"""Constrained decoding on the real model (default format): engine/grammar.py in the engine.

A constrained request's output always parses and validates, greedy and
seeded; an unconstrained request in the same step gets the same tokens with
and without a constrained neighbour (masking comes after the logits, and
only on the constrained row); a preempted constrained sequence recomputes
and still validates; a takeover's replayed tokens put the matcher where the
dead node's was.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import jsonschema
import pytest
from transformers import PreTrainedTokenizerBase

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.errors import GrammarError
from bargein.engine.grammar import check_grammar
from bargein.engine.grammar_spec import GrammarKind, GrammarSpec
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from tests.engine.conftest import RunnerFactory

pytestmark = pytest.mark.slow

CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=64, max_model_len=512)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(default_runner_factory: RunnerFactory) -> LLMEngine:
    return LLMEngine(default_runner_factory(num_blocks=96, max_model_len=512), CONFIG)


def chat(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[int, ...]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run(engine: LLMEngine, requests: list[EngineRequest]) -> dict[str, list[RequestOutput]]:
    """All requests in one batch; step until each finished."""
    for request in requests:
        engine.add_request(request)
    outputs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


def text(outs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outs)


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_output_validates_and_ends_with_the_grammar(
    engine: LLMEngine, hf_tokenizer: PreTrainedTokenizerBase, temperature: float
) -> None:
    prompt = chat(hf_tokenizer, "Describe a person as JSON.")
    grammar = GrammarSpec.json_schema(PERSON)
    requests = [
        EngineRequest(
            request_id=f"p{seed}",
            prompt_token_ids=prompt,
            params=SamplingParams(temperature=temperature, seed=seed, max_tokens=120, grammar=grammar),
        )
        for seed in range(4)
    ]
    outputs = run(engine, requests)
    for name, outs in outputs.items():
        body = json.loads(text(outs))  # the whole answer parses: no text before or after
        jsonschema.validate(body, PERSON)
        assert outs[-1].finish_reason is FinishReason.STOP, (name, text(outs))
        # the grammar's end finished it: no EOS step was spent after the closing brace
        assert not set(tokens(outs)) & engine.runner.eos_token_ids, name
        assert " " not in text(outs).replace(body["name"], "")  # compact: no whitespace outside strings


def test_unconstrained_neighbour_gets_the_same_tokens(
    engine: LLMEngine, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    free = chat(hf_tokenizer, "Tell me about the sea.")
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=40)
    alone = run(engine, [EngineRequest(request_id="free", prompt_token_ids=free, params=params)])
    constrained = SamplingParams(
        temperature=0, max_tokens=60, grammar=GrammarSpec(kind=GrammarKind.JSON_OBJECT)
    )
    together = run(
        engine,
        [
            EngineRequest(request_id="free", prompt_token_ids=free, params=params),
            EngineRequest(
                request_id="json",
                prompt_token_ids=chat(hf_tokenizer, "A JSON object, please."),
                params=constrained,
            ),
        ],
    )
    assert tokens(together["free"]) == tokens(alone["free"])
    assert together["json"][-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    if together["json"][-1].finish_reason is FinishReason.STOP:
        assert isinstance(json.loads(text(together["json"])), dict)


def test_regex_and_preemption(
    default_runner_factory: RunnerFactory, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    # a pool too small for all four: the newest are preempted and recomputed mid-answer
    engine = LLMEngine(
        default_runner_factory(num_blocks=12, block_size=16, max_model_len=160),
        replace(CONFIG, max_model_len=160),
    )
    grammar = GrammarSpec(kind=GrammarKind.REGEX, source=r"[A-Z][a-z]{2,8}( [a-z]{2,8}){30,40}\.")
    prompt = chat(hf_tokenizer, "Write one long sentence.")
    outputs = run(
        engine,
        [
            EngineRequest(
                request_id=f"r{i}",
                prompt_token_ids=prompt,
                params=SamplingParams(temperature=1.0, seed=i, max_tokens=80, grammar=grammar),
            )
            for i in range(4)
        ],
    )
    assert engine.scheduler.num_preemptions > 0
    for name, outs in outputs.items():
        assert re.fullmatch(grammar.source, text(outs)), (name, text(outs))
        assert outs[-1].finish_reason is FinishReason.STOP


def test_replayed_tokens_continue_the_grammar(
    engine: LLMEngine, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    grammar = GrammarSpec.json_schema(PERSON)
    prompt = chat(hf_tokenizer, "Describe a person as JSON.")
    params = SamplingParams(temperature=0, max_tokens=120, grammar=grammar)
    whole = run(engine, [EngineRequest(request_id="whole", prompt_token_ids=prompt, params=params)])["whole"]
    head = tokens(whole)[:5]
    # a takeover: the logged tokens join the prompt and the grammar consumes them first
    rest = run(
        engine,
        [
            EngineRequest(
                request_id="rest",
                prompt_token_ids=prompt + tuple(head),
                params=SamplingParams(temperature=0, max_tokens=115, grammar=grammar),
                num_replayed_tokens=len(head),
            )
        ],
    )["rest"]
    assert head + tokens(rest) == tokens(whole)


def test_unsupported_keyword_is_named() -> None:
    with pytest.raises(GrammarError) as info:
        check_grammar(GrammarSpec.json_schema({"type": "array", "uniqueItems": True}))
    assert info.value.keyword == "uniqueItems"
    check_grammar(GrammarSpec.json_schema(PERSON))  # supported: no error
