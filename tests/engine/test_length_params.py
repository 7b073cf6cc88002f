"""``min_tokens`` and ``ignore_eos`` on the real model (greedy, default format).

The prompt is one the default model answers in three tokens ("Yes." and
EOS), so every constraint below visibly changes where the answer ends.
"""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from tests.engine.conftest import RunnerFactory

pytestmark = pytest.mark.slow

CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=64, max_model_len=256)
QUESTION = "Reply with one word: yes or no?"


def greedy(**kw: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=16, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(default_runner_factory: RunnerFactory) -> LLMEngine:
    return LLMEngine(default_runner_factory(num_blocks=64, max_model_len=256), CONFIG)


@pytest.fixture(scope="module")
def prompt(hf_tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    ids = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )
    return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run(
    engine: LLMEngine, prompt: tuple[int, ...], params: dict[str, SamplingParams]
) -> dict[str, list[RequestOutput]]:
    """All requests in one batch; step until each finished."""
    for name, p in params.items():
        engine.add_request(EngineRequest(request_id=name, prompt_token_ids=prompt, params=p))
    outputs: dict[str, list[RequestOutput]] = {name: [] for name in params}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


def tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def text(outs: list[RequestOutput]) -> str:
    return "".join(o.text for o in outs)


def test_min_tokens_and_ignore_eos_fix_the_length(engine: LLMEngine, prompt: tuple[int, ...]) -> None:
    eos = engine.runner.eos_token_ids
    outputs = run(
        engine,
        prompt,
        {
            "plain": greedy(),
            "min": greedy(min_tokens=8),
            "ignore": greedy(ignore_eos=True),
            "both": greedy(ignore_eos=True, min_tokens=8),
            "max": greedy(min_tokens=16),
        },
    )
    plain = tokens(outputs["plain"])
    assert len(plain) == 3 and plain[-1] in eos, text(outputs["plain"])  # "Yes." EOS
    assert outputs["plain"][-1].finish_reason is FinishReason.STOP

    with_min = tokens(outputs["min"])
    assert len(with_min) >= 8 and not eos & set(with_min[:8])
    assert with_min[:2] == plain[:2]  # the same answer up to the EOS it may not sample
    assert text(outputs["min"]).startswith("Yes.")

    for name in ("ignore", "both", "max"):
        assert outputs[name][-1].num_output_tokens == 16, name
        assert outputs[name][-1].finish_reason is FinishReason.LENGTH, name
    assert tokens(outputs["ignore"])[:3] == plain  # ignore_eos samples EOS and goes on
    assert not eos & set(tokens(outputs["both"])[:8])  # min_tokens bans EOS even with ignore_eos
    assert not eos & set(tokens(outputs["max"]))
    assert engine.stats().num_free_blocks == 64


def test_min_tokens_holds_off_stop_token_ids_and_stop_strings(
    engine: LLMEngine, prompt: tuple[int, ...]
) -> None:
    eos = engine.runner.eos_token_ids
    plain = tokens(run(engine, prompt, {"plain": greedy()})["plain"])
    period = plain[1]  # "."
    outputs = run(
        engine,
        prompt,
        {
            "sid": greedy(stop_token_ids=(period,)),
            "sid-min": greedy(stop_token_ids=(period,), min_tokens=4),
            "str": greedy(stop=("Yes",)),
            "str-min": greedy(stop=("Yes",), min_tokens=4),
        },
    )
    assert tokens(outputs["sid"]) == plain[:2] and outputs["sid"][-1].finish_reason is FinishReason.STOP
    sid_min = tokens(outputs["sid-min"])
    assert len(sid_min) >= 4 and period not in sid_min[:4] and not eos & set(sid_min[:4])
    assert text(outputs["str"]) == "" and outputs["str"][-1].finish_reason is FinishReason.STOP
    # "Yes" ends inside the first 4 tokens' text: it does not stop the answer there.
    assert text(outputs["str-min"]).startswith("Yes.") and len(tokens(outputs["str-min"])) >= 4
