"""Continuing a stream from its logged prefix joins its text exactly (session/cluster/takeover.py).

The bundled model's real tokenizer: byte-level BPE, so one emoji spans
several tokens and the dead node may have logged half of one.
"""

from __future__ import annotations

from typing import Any

import pytest

from bargein.engine.config import ModelConfig
from bargein.engine.detokenizer import IncrementalDetokenizer
from bargein.engine.model.loader import load_tokenizer
from bargein.engine.request import FinishReason, RequestOutput, SamplingParams
from bargein.session.cluster.takeover import Continuation, GenerationRecord, LoggedPrefix

pytestmark = pytest.mark.slow

TEXT = "Tea 🍵 time: caf\u00e9 au lait, sushi 🍣🍣 and STOP here, then more words 😀 end."


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(ModelConfig())


def _uninterrupted(
    tokenizer: Any, prompt: tuple[int, ...], ids: list[int], stop: tuple[str, ...]
) -> tuple[list[str], str]:
    """Per-token deltas of the node that would have generated it all, and all its text."""
    detok = IncrementalDetokenizer(tokenizer, prompt, stop)
    deltas = [detok.add([t]) for t in ids]
    deltas[-1] += detok.flush()
    return deltas, detok.text


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


@pytest.mark.parametrize("stop", [(), ("STOP",)])
def test_the_joined_text_equals_an_uninterrupted_run_at_every_takeover_point(
    tokenizer: Any, stop: tuple[str, ...]
) -> None:
    prompt = tuple(tokenizer.encode("Say something."))
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    record = GenerationRecord(prompt_token_ids=prompt, params=SamplingParams(max_tokens=len(ids), stop=stop))
    deltas, full = _uninterrupted(tokenizer, prompt, ids, stop)
    stop_at = (
        next((i + 1 for i in range(len(ids)) if "STOP" in tokenizer.decode(ids[: i + 1])), None)
        if stop
        else None
    )
    for split in range(1, len(ids)):
        if stop_at is not None and split >= stop_at:
            break  # the dead node would have ended the stream itself
        logged_text = "".join(deltas[:split])
        text, end, stopped = _continue(tokenizer, record, ids, split, logged_text)
        assert logged_text + text == full, split
        if stop:
            assert stopped and end == stop_at, (split, end, stop_at)


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
        ),
    )
    assert GenerationRecord.decode(record.encode()) == record
    with pytest.raises(ValueError):
        GenerationRecord.decode(b"\x81\xa1x\x01")
