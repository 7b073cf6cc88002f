"""Continuing a stream from its logged prefix joins its text exactly (session/streams/cluster/takeover.py).

The bundled model's real tokenizer: byte-level BPE, so one emoji spans
several tokens and the dead node may have logged half of one.
"""

from __future__ import annotations

from typing import Any

import pytest

from bargein.engine.config import ModelConfig
from bargein.engine.detokenizer import IncrementalDetokenizer
from bargein.engine.grammar_spec import GrammarKind, GrammarSpec
from bargein.engine.model.loader import load_tokenizer
from bargein.engine.request import FinishReason, RequestOutput, SamplingParams
from bargein.session.streams.cluster.takeover import (
    Continuation,
    GenerationRecord,
    LoggedPrefix,
    continuation_params,
)

pytestmark = pytest.mark.slow

TEXT = "Tea 🍵 time: caf\u00e9 au lait, sushi 🍣🍣 and STOP here, then more words 😀 end."


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(ModelConfig())


def _uninterrupted(
    tokenizer: Any, prompt: tuple[int, ...], ids: list[int], params: SamplingParams
) -> tuple[list[str], str, int | None]:
    """Per-token deltas of the node that would have generated it all, all its
    text, and how many tokens it took to stop (None: no stop string matched)."""
    detok = IncrementalDetokenizer(tokenizer, prompt, params.stop, min_tokens=params.min_tokens)
    deltas, stop_at = [], None
    for i, token in enumerate(ids, start=1):
        deltas.append(detok.add([token]))
        if detok.stopped and stop_at is None:
            stop_at = i
    deltas[-1] += detok.flush()
    return deltas, detok.text, stop_at


def _continue(
    tokenizer: Any, record: GenerationRecord, ids: list[int], split: int, logged_text: str
) -> tuple[str, int, bool]:
    """Take over after ``split`` logged tokens: text, end and whether a stop ended it."""
    aborted: list[str] = []
    cont = Continuation(
        tokenizer,
        record,
        LoggedPrefix(token_ids=tuple(ids[:split]), text=logged_text),
        abort=lambda sid, reason: aborted.append(sid),
    )
    text, end = "", split
    rest = ids[split:]
    for i, token in enumerate(rest, start=1):
        out = cont.translate(
            RequestOutput(
                request_id="s",
                new_token_ids=(token,),
                text="(ignored)",
                num_prompt_tokens=99,
                num_output_tokens=i,
                finished=i == len(rest),
                finish_reason=FinishReason.LENGTH if i == len(rest) else None,
            )
        )
        assert out.num_prompt_tokens == len(record.prompt_token_ids)
        assert out.num_output_tokens == split + i
        text += out.text
        end = out.num_output_tokens
        if out.finished:
            return text, end, out.finish_reason is FinishReason.STOP and i < len(rest)
    return text, end, False


@pytest.mark.parametrize(
    ("stop", "min_tokens"),
    [((), 0), (("STOP",), 0), (("e",), 12), (("STOP", "e"), 20)],  # "e" in "Tea", the first token
)
def test_the_joined_text_equals_an_uninterrupted_run_at_every_takeover_point(
    tokenizer: Any, stop: tuple[str, ...], min_tokens: int
) -> None:
    prompt = tuple(tokenizer.encode("Say something."))
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    params = SamplingParams(max_tokens=len(ids), stop=stop, min_tokens=min_tokens)
    record = GenerationRecord(prompt_token_ids=prompt, params=params)
    deltas, full, stop_at = _uninterrupted(tokenizer, prompt, ids, params)
    assert (stop_at is None) == (not stop)
    assert stop_at is None or stop_at > min_tokens  # min_tokens held the stop string off
    for split in range(1, len(ids)):
        if stop_at is not None and split >= stop_at:
            break  # the dead node would have ended the stream itself
        logged_text = "".join(deltas[:split])
        text, end, stopped = _continue(tokenizer, record, ids, split, logged_text)
        assert logged_text + text == full, split
        if stop:
            assert stopped and end == stop_at, (split, end, stop_at)


def test_a_continuation_has_the_budgets_less_the_logged_tokens() -> None:
    params = SamplingParams(max_tokens=10, min_tokens=4, ignore_eos=True)
    assert continuation_params(params, 3) == SamplingParams(max_tokens=7, min_tokens=1, ignore_eos=True)
    assert continuation_params(params, 6) == SamplingParams(max_tokens=4, min_tokens=0, ignore_eos=True)


def test_a_generation_record_round_trips(tokenizer: Any) -> None:
    record = GenerationRecord(
        prompt_token_ids=(1, 70000, 2**32 - 1),
        params=SamplingParams(
            max_tokens=9,
            temperature=0.7,
            top_p=0.9,
            top_k=5,
            seed=42,
            stop=("a", "\u00e9"),
            stop_token_ids=(3,),
            ignore_eos=True,
            min_tokens=4,
        ),
    )
    assert GenerationRecord.decode(record.encode()) == record
    # a grammar travels too, so a node that continues the stream constrains it alike
    constrained = GenerationRecord(
        prompt_token_ids=(1, 2),
        params=SamplingParams(grammar=GrammarSpec(kind=GrammarKind.REGEX, source="[a-z]+")),
    )
    assert GenerationRecord.decode(constrained.encode()) == constrained
    with pytest.raises(ValueError):
        GenerationRecord.decode(b"\x81\xa1x\x01")
