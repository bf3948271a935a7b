from __future__ import annotations

import pytest

from recmesh.errors import DeadlineExceeded
from recmesh.resilience import (
    BreakerState,
    CircuitBreaker,
    LatencyTracker,
    RetryBudget,
    call_timeout,
    current_slo_class,
    remaining_s,
    request_scope,
)


def test_no_scope_means_no_deadline_and_the_cap() -> None:
    assert remaining_s() is None
    assert call_timeout(0.005, cap_s=0.5) == 0.5
    assert call_timeout(0.005) is None


def test_timeout_is_what_is_left_minus_the_margin_capped() -> None:
    with request_scope("A", 0.3):
        assert current_slo_class() == "A"
        t = call_timeout(0.05)
        assert t is not None and 0.2 < t <= 0.25
        assert call_timeout(0.05, cap_s=0.1) == 0.1
    assert current_slo_class() == "unknown"


def test_spent_budget_refuses_the_call() -> None:
    with request_scope("A", 0.004), pytest.raises(DeadlineExceeded):
        call_timeout(0.005)


def state(breaker: CircuitBreaker) -> BreakerState:
    return breaker.state  # a call, so the checker does not narrow the state between steps


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(failure_threshold=3, open_s=2.0, clock=Clock())
    for _ in range(2):
        breaker.record_failure()
    breaker.record_success()  # a success in between resets the count
    for _ in range(2):
        breaker.record_failure()
    assert state(breaker) is BreakerState.CLOSED and breaker.allow()
    breaker.record_failure()
    assert state(breaker) is BreakerState.OPEN
    assert not breaker.allow()


def test_half_open_probe_closes_or_reopens() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, open_s=2.0, clock=clock)
    breaker.record_failure()
    clock.now = 1.9
    assert not breaker.allow()
    clock.now = 2.0
    assert breaker.allow(), "the probe goes through"
    assert state(breaker) is BreakerState.HALF_OPEN
    assert not breaker.allow(), "only one probe at a time"
    breaker.record_failure()
    assert state(breaker) is BreakerState.OPEN
    clock.now = 3.0
    assert not breaker.allow(), "a failed probe opens it for another open_s"
    clock.now = 4.0
    assert breaker.allow()
    breaker.record_success()
    assert state(breaker) is BreakerState.CLOSED and breaker.allow() and breaker.failures == 0


def test_a_probe_that_never_reports_is_replaced() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, open_s=1.0, clock=clock)
    breaker.record_failure()
    clock.now = 1.0
    assert breaker.allow()
    clock.now = 1.5
    assert not breaker.allow()
    clock.now = 2.0
    assert breaker.allow(), "the lost probe does not wedge the breaker half-open"


def test_retry_budget_caps_retries_at_ten_percent_of_requests() -> None:
    budget = RetryBudget(ratio=0.1, initial=2.0, cap=20.0)
    retries = 0
    for _ in range(1000):
        budget.on_request()
        if budget.try_spend():  # a caller that would retry every single request
            retries += 1
    assert retries <= 0.1 * 1000 + 2
    assert retries >= 0.1 * 1000 - 1, "the budget is spendable, not just a refusal"


def test_retry_budget_saves_up_to_its_cap() -> None:
    budget = RetryBudget(ratio=0.1, initial=0.0, cap=3.0)
    for _ in range(1000):
        budget.on_request()
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]


def test_latency_tracker_quantile_needs_enough_samples() -> None:
    tracker = LatencyTracker(size=100, min_samples=20)
    for i in range(19):
        tracker.add(i / 1000)
    assert tracker.quantile(0.95) is None
    for i in range(19, 100):
        tracker.add(i / 1000)
    assert tracker.quantile(0.95) == pytest.approx(0.094)  # nearest rank (recmesh.stats): the 95th of 100
    for _ in range(100):
        tracker.add(0.5)  # old samples roll out
    assert tracker.quantile(0.5) == 0.5


def test_latency_tracker_quantile_follows_new_samples() -> None:
    tracker = LatencyTracker(size=64, min_samples=4, resort_every=8)
    for _ in range(64):
        tracker.add(0.01)
    assert tracker.quantile(0.5) == 0.01
    for _ in range(64):
        tracker.add(0.2)  # the whole window changes; the sorted copy must too
    assert tracker.quantile(0.5) == 0.2


def test_retry_budget_has_room_without_spending() -> None:
    budget = RetryBudget(ratio=0.0, initial=1.0)
    assert budget.has_room() and budget.has_room()
    assert budget.try_spend()
    assert not budget.has_room()
