from __future__ import annotations

import pytest

from recmesh.errors import DeadlineExceeded
from recmesh.resilience import call_timeout, current_slo_class, remaining_s, request_scope


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
