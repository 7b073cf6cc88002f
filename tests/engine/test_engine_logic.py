"""LLMEngine's own logic over the fake runner of ``fake_runner.py`` (no model).

Scheduling, preemption, stops, aborts and validation, checked against the
fake model's greedy reference. The real model's tokens are checked against
transformers in ``test_engine_greedy.py``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
import torch

from bargein.engine.config import SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.errors import DuplicateRequestError, PromptTooLongError
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from tests.engine.fake_runner import EOS, VOCAB, FakeRunner, FakeTokenizer, reference

CONFIG = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, prefill_chunk_size=8, max_model_len=48)


def greedy(max_tokens: int = 12, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def prompt_of(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, 32) for _ in range(n))


def run_all(engine: LLMEngine, arrivals: dict[int, list[EngineRequest]]) -> dict[str, list[RequestOutput]]:
    """Step until idle, adding ``arrivals[step]`` before each step."""
    outputs: dict[str, list[RequestOutput]] = defaultdict(list)
    step = 0
    while step <= max(arrivals, default=0) or engine.has_unfinished_requests():
        for request in arrivals.get(step, []):
            engine.add_request(request)
        for out in engine.step():
            outputs[out.request_id].append(out)
        step += 1
        assert step < 5000
    return outputs


@pytest.mark.parametrize("num_blocks", [100, 14])
def test_staggered_requests_match_the_reference_with_and_without_preemption(num_blocks: int) -> None:
    rng = random.Random(num_blocks)
    engine = LLMEngine(FakeRunner(num_blocks=num_blocks), CONFIG)
    arrivals: dict[int, list[EngineRequest]] = defaultdict(list)
    expected = {}
    for i in range(20):
        prompt = prompt_of(rng, rng.randrange(1, 40))
        params = greedy(max_tokens=rng.randrange(1, 16), ignore_eos=i % 3 == 0)
        arrivals[rng.randrange(0, 30)].append(
            EngineRequest(request_id=f"r{i}", prompt_token_ids=prompt, params=params)
        )
        expected[f"r{i}"] = reference(
            prompt, params.max_tokens, CONFIG.max_model_len, ignore_eos=params.ignore_eos
        )
    outputs = run_all(engine, arrivals)
    for request_id, want in expected.items():
        outs = outputs[request_id]
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert [t for o in outs for t in o.new_token_ids] == want
        assert "".join(o.text for o in outs) == FakeTokenizer().decode(want)
        assert outs[-1].num_output_tokens == len(want)
    stats = engine.stats()
    assert stats.num_free_blocks == num_blocks
    assert (stats.num_preemptions > 0) == (num_blocks == 14)
    assert sum(stats.num_finished_by_reason.values()) == 20
    assert stats.num_generated_tokens == sum(len(w) for w in expected.values())


def test_steps_mix_decodes_and_prefill_chunks() -> None:
    runner = FakeRunner(num_blocks=100)
    engine = LLMEngine(runner, CONFIG)
    engine.add_request(
        EngineRequest(request_id="a", prompt_token_ids=(1, 2, 3), params=greedy(ignore_eos=True))
    )
    engine.step()
    engine.add_request(EngineRequest(request_id="b", prompt_token_ids=tuple(range(1, 21)), params=greedy()))
    engine.step()
    last = runner.calls[-1]
    assert [(len(s.token_ids), s.start_pos, s.sample) for s in last] == [(1, 3, True), (8, 0, False)]


def test_prompt_too_long_is_refused_before_any_block() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    with pytest.raises(PromptTooLongError) as info:
        engine.add_request(EngineRequest(request_id="a", prompt_token_ids=(1,) * 48))
    assert (info.value.num_prompt_tokens, info.value.max_model_len) == (48, 48)
    assert engine.stats().num_free_blocks == 20 and not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(EngineRequest(request_id="b", prompt_token_ids=()))


def test_duplicate_live_id_is_refused() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(EngineRequest(request_id="a", prompt_token_ids=(1, 2), params=greedy()))
    with pytest.raises(DuplicateRequestError):
        engine.add_request(EngineRequest(request_id="a", prompt_token_ids=(3,)))


def test_pool_smaller_than_one_sequence_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="KV pool"):
        LLMEngine(FakeRunner(num_blocks=11, block_size=4), CONFIG)  # 44 < 48


def test_stop_string_ends_with_stop_and_cuts_the_text() -> None:
    prompt = (5, 9, 14)
    want = reference(prompt, 12, CONFIG.max_model_len, ignore_eos=True)
    full = FakeTokenizer().decode(want)
    stop = full[4:6]
    cut = full.index(stop)
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(
        EngineRequest(request_id="a", prompt_token_ids=prompt, params=greedy(ignore_eos=True, stop=(stop,)))
    )
    outputs = run_all(engine, {})
    outs = outputs["a"]
    assert outs[-1].finish_reason is FinishReason.STOP
    assert "".join(o.text for o in outs) == full[:cut]
    assert engine.stats().num_free_blocks == 20


def test_eos_and_stop_token_ids_end_with_stop_unless_ignored() -> None:
    rng = random.Random(3)
    prompt = next(p for p in (prompt_of(rng, 6) for _ in range(1000)) if EOS in reference(p, 12, 48)[1:])
    want = reference(prompt, 12, 48)
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(EngineRequest(request_id="eos", prompt_token_ids=prompt, params=greedy()))
    engine.add_request(
        EngineRequest(request_id="ign", prompt_token_ids=prompt, params=greedy(ignore_eos=True))
    )
    stop_id = want[0]
    engine.add_request(
        EngineRequest(request_id="sid", prompt_token_ids=prompt, params=greedy(stop_token_ids=(stop_id,)))
    )
    outputs = run_all(engine, {})
    assert [t for o in outputs["eos"] for t in o.new_token_ids] == want and want[-1] == EOS
    assert outputs["eos"][-1].finish_reason is FinishReason.STOP
    assert outputs["ign"][-1].num_output_tokens == 12
    assert outputs["ign"][-1].finish_reason is FinishReason.LENGTH
    assert outputs["sid"][-1].num_output_tokens == 1
    assert outputs["sid"][-1].finish_reason is FinishReason.STOP


def test_min_tokens_bans_eos_and_stop_token_ids_until_reached() -> None:
    rng = random.Random(5)
    # A prompt whose greedy answer ends at EOS within its first 4 tokens.
    prompt = next(p for p in (prompt_of(rng, 6) for _ in range(5000)) if len(reference(p, 12, 48)) <= 4)
    plain = reference(prompt, 12, 48)
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)

    def run(params: SamplingParams) -> list[RequestOutput]:
        engine.add_request(EngineRequest(request_id="r", prompt_token_ids=prompt, params=params))
        return run_all(engine, {})["r"]

    outs = run(greedy(min_tokens=8))
    tokens = [t for o in outs for t in o.new_token_ids]
    assert len(tokens) >= 8 and EOS not in tokens[:8]
    # Up to the banned EOS the answer is the unconstrained one; after min_tokens EOS ends it again.
    assert tokens[: len(plain) - 1] == plain[:-1]
    assert tokens[-1] == EOS or len(tokens) == 12
    assert outs[-1].finish_reason is (FinishReason.STOP if tokens[-1] == EOS else FinishReason.LENGTH)

    # A stop token id the min_tokens run would sample within its first 8 tokens is banned too.
    stop_id = next(t for t in tokens[len(plain) - 1 : 8] if t not in plain)
    with_stop = [t for o in run(greedy(min_tokens=8, stop_token_ids=(stop_id,))) for t in o.new_token_ids]
    assert len(with_stop) >= 8 and EOS not in with_stop[:8] and stop_id not in with_stop[:8]

    outs = run(greedy(min_tokens=8, ignore_eos=True))
    assert outs[-1].num_output_tokens == 12 and outs[-1].finish_reason is FinishReason.LENGTH
    assert engine.stats().num_free_blocks == 20


def test_min_tokens_must_lie_within_max_tokens() -> None:
    assert greedy(4, min_tokens=4).min_tokens == 4
    for bad in (-1, 5):
        with pytest.raises(ValueError, match="min_tokens"):
            greedy(4, min_tokens=bad)


def test_max_model_len_ends_with_length() -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(
        EngineRequest(request_id="a", prompt_token_ids=(1,) * 40, params=greedy(100, ignore_eos=True))
    )
    outs = run_all(engine, {})["a"]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].num_output_tokens == 8


@pytest.mark.parametrize("steps_before", [0, 1, 4])
def test_abort_is_drained_at_the_next_step_with_its_reason(steps_before: int) -> None:
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(
        EngineRequest(request_id="a", prompt_token_ids=(1,) * 20, params=greedy(ignore_eos=True))
    )
    for _ in range(steps_before):
        engine.step()
    engine.abort_request("a", FinishReason.CANCELLED)
    engine.abort_request("nobody")
    outs = engine.step()
    assert len(outs) == 1
    out = outs[0]
    assert out.finished and out.finish_reason is FinishReason.CANCELLED and out.new_token_ids == ()
    assert out.num_output_tokens == max(0, steps_before - 2)  # prefill takes 3 steps (8+8+4)
    assert engine.stats().num_free_blocks == 20 and not engine.has_unfinished_requests()
    engine.abort_request("a")
    assert engine.step() == []


def test_an_abort_only_if_waiting_spares_a_request_whose_prefill_began() -> None:
    # a queue deadline: the request still queued is dropped, the one in prefill goes on
    engine = LLMEngine(FakeRunner(num_blocks=20), CONFIG)
    engine.add_request(
        EngineRequest(request_id="started", prompt_token_ids=(1,) * 20, params=greedy(2, ignore_eos=True))
    )
    engine.step()  # its first prefill chunk: scheduled, no token yet
    engine.add_request(
        EngineRequest(request_id="queued", prompt_token_ids=(1,) * 4, params=greedy(2, ignore_eos=True))
    )
    for request_id in ("started", "queued", "nobody"):
        engine.abort_request(request_id, FinishReason.CANCELLED, only_if_waiting=True)
    ended = engine.drain_aborts()
    assert [(o.request_id, o.finish_reason, o.num_output_tokens) for o in ended] == [
        ("queued", FinishReason.CANCELLED, 0)
    ]
    outputs = run_all(engine, {})
    assert outputs["started"][-1].finish_reason is FinishReason.LENGTH


class SpreadRunner(FakeRunner):
    """The fake model with spread logits (a fixed function of the history, as
    ``next_token``), so that seeded sampling at temperature 0.8 really draws."""

    def execute(self, seqs: list[Any]) -> torch.Tensor:
        rows = super().execute(seqs)
        spread = [torch.randn(VOCAB, generator=torch.Generator().manual_seed(int(r.argmax()))) for r in rows]
        return rows / 10 + torch.stack(spread) * 2 if spread else rows


def seeded(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, seed=7, max_tokens=max_tokens, ignore_eos=True)


def test_a_seed_gives_the_same_tokens_after_preemption_and_takeover() -> None:
    """Issue 37: a seeded request's noise is keyed by (seed, position), so its
    tokens are the same alone, under load with preemptions (the recompute
    samples again at the same position), and when another engine continues
    it from its logged tokens (a takeover's re-prefill: a new request whose
    prompt is the old prompt plus the tokens so far)."""
    prompt = (3, 1, 4, 1, 5, 9, 2, 6)
    want = tokens_of(run_alone(EngineRequest(request_id="s", prompt_token_ids=prompt, params=seeded(30))))
    assert len(set(want)) > 5  # really sampling
    rng = random.Random(3)
    arrivals: dict[int, list[EngineRequest]] = defaultdict(list)
    for i in range(12):
        other = prompt_of(rng, rng.randrange(4, 30))
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=16, ignore_eos=True)
        arrivals[rng.randrange(0, 6)].append(
            EngineRequest(request_id=f"o{i}", prompt_token_ids=other, params=params)
        )
    arrivals[2].append(EngineRequest(request_id="s", prompt_token_ids=prompt, params=seeded(30)))
    engine = LLMEngine(SpreadRunner(num_blocks=14), CONFIG)
    loaded = run_all(engine, arrivals)["s"]
    assert engine.stats().num_preemptions > 0
    assert tokens_of(loaded) == want
    takeover = EngineRequest(request_id="t", prompt_token_ids=prompt + tuple(want[:11]), params=seeded(19))
    assert tokens_of(run_alone(takeover)) == want[11:]


def run_alone(request: EngineRequest) -> list[RequestOutput]:
    return run_all(LLMEngine(SpreadRunner(num_blocks=100), CONFIG), {0: [request]})[request.request_id]


def tokens_of(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]
