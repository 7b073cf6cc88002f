"""Admission control on a fake clock: rate limits, per-principal cap, queue bound, queue-time estimate."""

from __future__ import annotations

import pytest

from bargein.protocol import events as pe
from bargein.session.runtime.admission import Admission, AdmissionConfig, TokenBucket


def test_request_bucket_refuses_past_the_burst_and_says_when_to_retry() -> None:
    admission = Admission(AdmissionConfig(rate_limit_requests=2.0, burst_s=1.0))
    assert admission.check_request("alice", now=0.0) is None
    assert admission.check_request("alice", now=0.0) is None
    refusal = admission.check_request("alice", now=0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert refusal.retry_after_ms == 500  # one request refills in 1/2 s
    assert admission.check_request("bob", now=0.0) is None  # buckets are per principal
    assert admission.check_request("alice", now=0.5) is None


def test_token_bucket_charges_prompt_plus_max_tokens() -> None:
    admission = Admission(AdmissionConfig(rate_limit_tokens=100.0, burst_s=1.0))
    assert admission.charge_tokens("alice", 80, now=0.0) is None
    refusal = admission.charge_tokens("alice", 80, now=0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert refusal.retry_after_ms == 600  # 60 more tokens at 100/s
    # A request larger than the bucket passes when the bucket is full (it goes in debt).
    assert admission.charge_tokens("bob", 500, now=0.0) is None
    assert admission.charge_tokens("bob", 1, now=1.0) is not None


def test_audio_bucket_charges_a_turns_seconds_per_principal() -> None:
    admission = Admission(AdmissionConfig(rate_limit_audio_s=2.0, burst_s=2.0))  # 4 s held
    assert admission.charge_audio("alice", 3.0, now=0.0) is None
    refusal = admission.charge_audio("alice", 2.0, now=0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert refusal.retry_after_ms == 500 and "audio" in refusal.message  # 1 s more at 2 s/s
    assert admission.charge_audio("alice", 2.0, now=0.5) is None  # refused: nothing was taken
    assert admission.charge_audio("bob", 30.0, now=0.0) is None  # a long turn from a full bucket
    assert admission.charge_tokens("bob", 10**6, now=0.0) is None  # the other limits are apart
    assert Admission(AdmissionConfig()).charge_audio("carol", 1e6, now=0.0) is None  # off


def test_a_resumes_speech_is_charged_after_it_is_made_and_refused_in_debt() -> None:
    admission = Admission(AdmissionConfig(rate_limit_audio_s=2.0, burst_s=2.0))  # 4 s held
    budget = admission.audio_budget("alice")
    assert budget.refusal(0.0) is None
    budget.spend(7.0, 0.0)  # a segment longer than what was left: 3 s in debt
    refusal = budget.refusal(1.0)  # 1 s later: 1 s in debt
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert refusal.retry_after_ms == 500
    assert admission.charge_audio("alice", 0.5, now=1.0) is not None  # the turns' bucket too
    assert budget.refusal(1.6) is None  # it holds 0.2 s: one more segment may start
    assert admission.audio_budget("bob").refusal(1.0) is None  # per principal
    off = Admission(AdmissionConfig()).audio_budget("carol")
    off.spend(1e6, 0.0)
    assert off.refusal(0.0) is None


def test_cap_on_active_responses_per_principal() -> None:
    admission = Admission(AdmissionConfig(max_active_per_principal=2))
    assert admission.check_request("alice", 0.0) is None
    assert admission.check_request("alice", 0.0) is None
    refusal = admission.check_request("alice", 0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert "at once" in refusal.message and refusal.retry_after_ms > 0
    admission.started(0.1, admitted_at=0.0)
    admission.ended("alice")
    assert admission.check_request("alice", 0.2) is None


def test_bounded_waiting_queue_and_saturation() -> None:
    admission = Admission(AdmissionConfig(max_waiting=2))
    assert not admission.saturated()
    assert admission.check_request("a", 0.0) is None
    assert admission.check_request("b", 0.0) is None
    assert admission.saturated()
    refusal = admission.check_request("c", 0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.OVERLOADED
    assert refusal.retry_after_ms >= 100
    admission.cancelled("a")  # refused later (e.g. prompt too long): leaves the queue
    assert not admission.saturated()
    assert admission.check_request("c", 0.0) is None


def test_queue_time_deadline_refuses_up_front_by_estimate() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=2.0, window_s=10.0))
    assert admission.expected_wait_s(0.0) is None  # nothing learnt yet: admit
    for _ in range(6):  # a burst: six admitted at once
        assert admission.check_request("a", 0.0) is None
    for t in range(1, 6):  # the engine serves one a second: gaps of 1 s
        admission.started(float(t), admitted_at=0.0)
    # one still waits: a new one leaves after it, two gaps from now
    assert admission.expected_wait_s(5.0) == pytest.approx(2.0)
    assert admission.check_request("a", 5.0) is None  # 2 s, not over 2 s
    refusal = admission.check_request("a", 5.0)  # 2 ahead: 3 s
    assert refusal is not None and refusal.code is pe.ErrorCode.OVERLOADED
    assert refusal.retry_after_ms == 1000
    # The gaps age out of the window: no estimate, no refusal by time.
    assert admission.check_request("a", 60.0) is None


def test_an_underloaded_server_learns_no_wait_from_the_arrival_gaps() -> None:
    """One request every 2 s, each served before the next arrives: the queue
    was never busy, so nothing estimates a wait (the arrival gap is not the
    engine's speed) and every request is admitted, however many waited once."""
    admission = Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=0.5, window_s=30.0))
    for i in range(10):
        now = 2.0 * i
        assert admission.check_request("a", now) is None
        admission.started(now + 0.3, admitted_at=now)
    assert admission.expected_wait_s(20.0) is None
    assert admission.check_request("a", 20.0) is None
    assert admission.check_request("a", 20.0) is None  # one waits ahead: still no estimate


def test_dropped_requests_leave_the_queue_without_counting_as_served() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=5.0, window_s=10.0))
    for _ in range(8):
        assert admission.check_request("a", 0.0) is None
    for t in range(1, 6):  # gaps of 1 s
        admission.started(float(t), admitted_at=0.0)
    assert admission.num_waiting == 3
    # One of them passed its deadline and was dropped: it leaves the queue ...
    admission.started(5.5, admitted_at=0.0, served=False)
    assert admission.num_waiting == 2
    # ... but is no departure: the next served one measures its gap from t=5
    admission.started(7.0, admitted_at=0.0)
    assert admission.expected_wait_s(7.0) == pytest.approx((1 + 1) * (1 + 1 + 1 + 1 + 2) / 5)
    # a dropped request is told when those still waiting will have left
    assert admission.drain_retry_ms(7.0) == 1200


def test_bucket_wait() -> None:
    bucket = TokenBucket(rate=10.0, capacity=5.0, level=0.0, updated=0.0)
    assert bucket.wait_s(2.0) == pytest.approx(0.2)
    bucket.refill(1.0)
    assert bucket.level == 5.0 and bucket.wait_s(50.0) == 0.0


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_waiting=-1"):
        AdmissionConfig(max_waiting=-1)
    with pytest.raises(ValueError, match="burst_s"):
        AdmissionConfig(burst_s=0)


def test_idle_principals_are_evicted_so_the_table_stays_bounded() -> None:
    admission = Admission(
        AdmissionConfig(
            rate_limit_requests=1.0, rate_limit_tokens=100.0, burst_s=1.0, max_active_per_principal=4
        )
    )
    busy = "busy"
    assert admission.check_request(busy, now=0.0) is None  # active: never evicted
    for i in range(20_000):  # a new principal every 10 ms, each idle at once
        now = i * 0.01
        assert admission.check_request(f"p{i}", now=now) is None
        assert admission.charge_tokens(f"p{i}", 10, now=now) is None
        admission.ended(f"p{i}")
        admission.started(now, admitted_at=now)
    # Only principals whose buckets have not refilled yet (the last second's)
    # and the active one are kept, give or take the sweep's doubling.
    assert len(admission._principals) <= 2 * (100 + 1) + 1024
    assert busy in admission._principals
    # An evicted principal starts again with full buckets, as it would have had.
    assert admission.check_request("p0", now=200.0) is None
    # The one still active keeps its count: the cap still applies to it.
    for _ in range(3):
        assert admission.check_request(busy, now=200.0 + _) is None
    assert admission.check_request(busy, now=210.0) is not None
