"""Admission against the step-time model, on a fake engine load and a fixed cost model.

The cost model: 10 ms a step, 2 ms a decode, 0.5 ms a prefill token, context
free; ITL target 50 ms, minimum prefill 8 tokens. So a step with the minimum
prefill fits ``10 + 4 + 2 n <= 50``: at most 18 decoding streams; after
``n`` decodes ``(40 - 2 n) / 0.5`` prefill tokens fit a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bargein.engine.step_budget import StepBudget, StepCostCoefficients
from bargein.protocol import events as pe
from bargein.session.runtime.admission import Admission, AdmissionConfig

COST = StepCostCoefficients(
    base_s=0.010, per_decode_s=0.002, per_prefill_token_s=0.0005, per_context_token_s=0.0
)
BUDGET = StepBudget(target_s=0.050, cost=COST, max_tokens=512, min_prefill_tokens=8)


@dataclass(frozen=True)
class Load:
    """What admission reads of the engine (EngineStats has these fields)."""

    num_decoding: int = 0
    num_decoding_tokens: int = 0
    running_remaining_tokens: tuple[int, ...] = ()
    step_budget: StepBudget | None = BUDGET


def admit(admission: Admission, num_prompt: int, load: Load, *, interactive: bool = True) -> object:
    """check_request then check_load, as Service.submit does; the refusal or None."""
    refusal = admission.check_request("someone", 0.0)
    if refusal is not None:
        return refusal
    refusal = admission.check_load(num_prompt, load, interactive=interactive)
    if refusal is not None:
        admission.cancelled("someone")
    return refusal


def test_admits_while_the_batch_fits_the_itl_target_and_refuses_past_it() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0))
    load = Load(num_decoding=16, num_decoding_tokens=1600, running_remaining_tokens=tuple(range(5, 21)))
    assert admit(admission, 50, load) is None  # 17 decoders
    assert admit(admission, 50, load) is None  # 18: 10 + 4 + 36 = 50 ms
    refusal = admit(admission, 50, load)  # 19 would be 52 ms a step
    assert refusal is not None and refusal.code is pe.ErrorCode.OVERLOADED  # type: ignore[attr-defined]
    assert "inter-token" in refusal.message  # type: ignore[attr-defined]
    # one stream must end first: the soonest has 5 tokens left, 5 steps of a full batch's
    # 10 + 18 * 2 = 46 ms
    assert abs(refusal.retry_after_ms - 230) <= 1  # type: ignore[attr-defined]
    assert admission.num_waiting == 2 and admission.num_queued_tokens == 100


def test_retry_after_waits_for_as_many_streams_as_the_excess() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0))
    load = Load(
        num_decoding=20, num_decoding_tokens=2000, running_remaining_tokens=(3, 7, 40, 90) + (100,) * 16
    )
    refusal = admit(admission, 10, load)
    # 21 decoders, 18 fit: three streams must end, the third soonest in 40 steps of 46 ms
    assert refusal is not None and abs(refusal.retry_after_ms - 1840) <= 1  # type: ignore[attr-defined]


def test_the_released_load_makes_room_again() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0))
    load = Load(num_decoding=17, num_decoding_tokens=1700, running_remaining_tokens=(9,) * 17)
    assert admit(admission, 30, load) is None
    assert admit(admission, 30, load) is not None
    admission.started(0.1, admitted_at=0.0)  # the first one's first token: it decodes now
    admission.release_load(30)
    assert admission.num_queued_tokens == 0
    # the engine's next stats count it among the decoding
    assert admit(admission, 30, Load(num_decoding=18, num_decoding_tokens=1730)) is not None
    assert admit(admission, 30, Load(num_decoding=17, num_decoding_tokens=1730)) is None


def test_ttft_target_counts_the_prompt_tokens_queued_ahead() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=1.0))
    load = Load(num_decoding=10, num_decoding_tokens=1000, running_remaining_tokens=(50,) * 10)
    # 10 decodes leave 40 prefill tokens a step; a step takes 10 + 20 + 20 = 50 ms:
    # 1 s is 20 steps, 800 prompt tokens
    assert admit(admission, 700, load) is None  # nobody ahead: admitted whatever its size
    assert admit(admission, 100, load) is None  # 800 tokens: 20 steps, 1.0 s
    refusal = admit(admission, 40, load)  # 840: 21 steps, 1.05 s
    assert refusal is not None and refusal.code is pe.ErrorCode.OVERLOADED  # type: ignore[attr-defined]
    assert "first token" in refusal.message  # type: ignore[attr-defined]
    assert refusal.retry_after_ms == 100  # type: ignore[attr-defined]  # 50 ms late, at least 100 ms
    admission.release_load(700)  # the long one's first token
    assert admit(admission, 40, load) is None


def test_nobody_ahead_is_never_refused_for_its_ttft() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=0.1))
    assert admit(admission, 1900, Load(num_decoding=4, num_decoding_tokens=400)) is None


def test_bulk_requests_get_a_share_of_the_budget_and_sessions_all_of_it() -> None:
    """With 14 streams decoding, a 15th (10 + 4 + 30 = 44 ms) fits the whole
    50 ms target but not 80% of it (40 ms): an HTTP request is refused, a
    session's turn admitted."""
    load = Load(num_decoding=14, num_decoding_tokens=1400, running_remaining_tokens=(20,) * 14)
    bulk = Admission(AdmissionConfig(max_waiting=0, bulk_share=0.8))
    refusal = admit(bulk, 20, load, interactive=False)
    assert refusal is not None and "HTTP" in refusal.message  # type: ignore[attr-defined]
    assert admit(bulk, 20, load, interactive=True) is None


def test_without_a_step_budget_the_model_is_not_consulted() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=0.01))
    busy = Load(num_decoding=500, num_decoding_tokens=10**6, step_budget=None)
    for _ in range(5):
        assert admit(admission, 1000, busy) is None
    assert admission.check_load(1000, None) is None
    assert admission.num_queued_tokens == 0


def test_invalid_bulk_share_is_refused() -> None:
    with pytest.raises(ValueError, match="bulk_share"):
        AdmissionConfig(bulk_share=0.0)


def test_precheck_judges_the_load_alone_and_counts_nothing() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0))
    full = Load(num_decoding=18, num_decoding_tokens=1800, running_remaining_tokens=(2,) * 18)
    assert admission.check_request("someone", 0.0) is None
    refusal = admission.precheck_load(full)
    assert refusal is not None and refusal.retry_after_ms == 100  # type: ignore[attr-defined]
    assert admission.precheck_load(Load(num_decoding=10)) is None
    assert admission.num_queued_tokens == 0


def test_a_short_queue_on_an_idle_engine_costs_its_own_tokens_not_a_full_step() -> None:
    """Nothing decodes, so a step may take 512 prompt tokens; 120 queued cost
    10 + 60 ms, not the 266 ms of a full step."""
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=0.1))
    idle = Load()
    assert admit(admission, 60, idle) is None
    assert admit(admission, 60, idle) is None  # 70 ms
    assert admit(admission, 200, idle) is not None  # 320 tokens: 170 ms


def burst(admission: Admission, size: int, *, max_tokens: int) -> list[object]:
    """``size`` requests of 20 prompt tokens arriving at once on an idle engine:
    each one's verdict (none of them has its first token yet)."""
    verdicts = []
    for _ in range(size):
        assert admission.check_request("someone", 0.0) is None
        verdict = admission.judge_load(20, Load(), max_tokens=max_tokens)
        if verdict.refusal is not None:
            admission.cancelled("someone")
        verdicts.append(verdict)
    return verdicts


def test_a_burst_past_the_batch_is_queued_while_its_first_tokens_meet_the_ttft_target() -> None:
    """18 streams fit the ITL target; the rest of a burst waits in the engine's
    queue for them to end (16 steps of a full batch's 46 ms a round), then
    prefills (20 ms): the 19th to 36th wait one round, the 37th to 54th two
    (1.49 s), both within a 1.5 s TTFT target; a third round (2.23 s) is not.
    Without a TTFT target the old rule refuses past 18."""
    verdicts = burst(Admission(AdmissionConfig(max_waiting=0, target_ttft_s=1.5)), 60, max_tokens=16)
    refused = [i for i, v in enumerate(verdicts) if v.refusal is not None]  # type: ignore[attr-defined]
    assert refused == list(range(54, 60))
    predicted = [v.predicted_ttft_s for v in verdicts]  # type: ignore[attr-defined]
    assert predicted[0] == pytest.approx(0.020)  # its own prompt: one step of 10 + 20 * 0.5 ms
    assert predicted[18] == pytest.approx(16 * 0.046 + 0.020)  # waits one round
    assert predicted[35] == predicted[18] and predicted[36] == pytest.approx(32 * 0.046 + 0.020)
    refusal = verdicts[54].refusal  # type: ignore[attr-defined]
    assert refusal.code is pe.ErrorCode.OVERLOADED and "first token to 2.2 s" in refusal.message
    assert abs(refusal.retry_after_ms - 48 * 46) <= 1  # three rounds of 16 steps

    old_rule = burst(Admission(AdmissionConfig(max_waiting=0)), 60, max_tokens=16)
    assert sum(v.refusal is not None for v in old_rule) == 42  # type: ignore[attr-defined]


def test_long_answers_ahead_are_not_queued_behind() -> None:
    """The same burst with 48-token answers: one round is 48 steps (2.2 s), past
    the TTFT target, so the 19th is refused, and told when room comes."""
    verdicts = burst(Admission(AdmissionConfig(max_waiting=0, target_ttft_s=1.5)), 19, max_tokens=48)
    assert [v.refusal is None for v in verdicts] == [True] * 18 + [False]  # type: ignore[attr-defined]
    assert abs(verdicts[18].refusal.retry_after_ms - 48 * 46) <= 1  # type: ignore[attr-defined]


def test_a_running_batch_ending_soon_makes_a_new_request_wait_not_fail() -> None:
    """18 streams decode, the soonest ends in 5 steps: a 19th waits 5 full steps
    (230 ms) and prefills its 100 tokens in the room 18 decodes leave (at
    least the minimum 8 a step)."""
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=1.5))
    load = Load(num_decoding=18, num_decoding_tokens=1800, running_remaining_tokens=(5,) + (40,) * 17)
    assert admission.check_request("someone", 0.0) is None
    verdict = admission.judge_load(100, load, max_tokens=48)
    assert verdict.refusal is None
    assert verdict.predicted_ttft_s == pytest.approx(
        5 * 0.046 + 12 * 0.050 + (0.010 + 0.036 + 0.002), abs=1e-3
    )


def test_a_stream_that_started_since_the_engines_last_stats_still_counts() -> None:
    """The engine's stats date from its last step: a request whose first token
    came since is neither waiting nor decoding in them. It still takes its place
    in the batch: with 18 such streams, a 19th waits (and, past the TTFT
    target, is refused), as with the stats up to date."""
    admission = Admission(AdmissionConfig(max_waiting=0, target_ttft_s=0.5))
    for _ in range(18):
        assert admit(admission, 20, Load()) is None
        admission.started(0.1, admitted_at=0.0)
        admission.release_load(20)
    assert admission.num_waiting == 0 and admission.num_active == 18
    assert admission.check_request("someone", 0.2) is None
    stale = Load()  # nothing decoding yet, as of the last step
    verdict = admission.judge_load(20, stale, max_tokens=48)
    assert verdict.refusal is not None and "19 streams" in verdict.refusal.message
    admission.cancelled("someone")
    for _ in range(18):
        admission.ended("someone")
    assert admission.num_active == 0
