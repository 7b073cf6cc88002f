"""Admission control on a fake clock: rate limits, per-principal cap, queue bound, queue-time estimate."""

from __future__ import annotations

import pytest

from protocol import events as pe
from session.admission import Admission, AdmissionConfig, TokenBucket


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


def test_cap_on_active_responses_per_principal() -> None:
    admission = Admission(AdmissionConfig(max_active_per_principal=2))
    assert admission.check_request("alice", 0.0) is None
    assert admission.check_request("alice", 0.0) is None
    refusal = admission.check_request("alice", 0.0)
    assert refusal is not None and refusal.code is pe.ErrorCode.RATE_LIMITED
    assert "at once" in refusal.message and refusal.retry_after_ms > 0
    admission.started(0.1)
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
    for i in range(4):  # four requests left the queue in 4 s: 1 per second
        assert admission.check_request("a", float(i)) is None
        admission.started(float(i + 1))
    # nobody waits: a new request leaves the queue with the next departure, in 1 s
    assert admission.expected_wait_s(5.0) == pytest.approx(1.0)
    for _ in range(2):
        assert admission.check_request("a", 5.0) is None
    # 2 waiting ahead at 1/s: the third departure, 3 s away, is the new one's
    assert admission.expected_wait_s(5.0) == pytest.approx(3 / (4 / 4.0))
    refusal = admission.check_request("a", 5.0)  # 3 s > 2 s
    assert refusal is not None and refusal.code is pe.ErrorCode.OVERLOADED
    assert refusal.retry_after_ms == 1000
    # The history ages out of the window: no estimate, no refusal by time.
    assert admission.check_request("a", 60.0) is None


def test_dropped_requests_leave_the_queue_without_raising_the_rate() -> None:
    admission = Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=5.0, window_s=10.0))
    for i in range(4):  # 1 per second left the queue
        assert admission.check_request("a", float(i)) is None
        admission.started(float(i + 1))
    for _ in range(3):
        assert admission.check_request("a", 4.0) is None
    assert admission.num_waiting == 3
    # One of them passed its deadline and was dropped: it leaves the queue ...
    admission.started(4.5, served=False)
    assert admission.num_waiting == 2
    # ... but is no departure: the rate is still 4 in 3.5 s (since the first), not 5
    assert admission.expected_wait_s(4.5) == pytest.approx(3 / (4 / 3.5))
    # the dropped request is told when the two still waiting will have left
    assert admission.drain_retry_ms(4.5) == 1750


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
