"""The cold-dependency policy (services/gateway/cold.py) with plain values."""

from __future__ import annotations

import time

import pydantic
import pytest

from recmesh.resilience import request_scope
from recmesh.settings import GatewaySettings
from services.gateway.cold import (
    ColdDecision,
    ColdGuard,
    DependencyState,
    DependencyWatch,
    build_cold_guard,
    decide_cold,
)

WARM, COLD = DependencyState.WARM, DependencyState.PRESUMED_COLD
NO_WAIT = "does not wait for cold dependencies"


@pytest.mark.parametrize(
    ("slo_class", "state", "remaining_s", "max_wait_s", "expected"),
    [
        # warm: every class calls it
        ("A", WARM, 0.3, 0.0, ColdDecision("call")),
        ("C", WARM, None, 2.5, ColdDecision("call")),
        # class A never waits, whatever it is configured or has left
        ("A", COLD, 0.3, 0.0, ColdDecision("fallback", reason="class A never routes to a cold dependency")),
        ("A", COLD, 10.0, 5.0, ColdDecision("fallback", reason="class A never routes to a cold dependency")),
        # B and C wait up to their configured time, bounded by the budget left minus the reserve
        ("C", COLD, 3.0, 2.5, ColdDecision("wait", wait_s=2.5)),
        ("C", COLD, 1.0, 2.5, ColdDecision("wait", wait_s=pytest.approx(0.85))),  # type: ignore[arg-type]
        ("B", COLD, 0.85, 0.5, ColdDecision("wait", wait_s=0.5)),
        ("B", COLD, 0.6, 0.5, ColdDecision("wait", wait_s=pytest.approx(0.45))),  # type: ignore[arg-type]
        ("C", COLD, None, 2.5, ColdDecision("wait", wait_s=2.5)),
        # no tolerance configured, or no budget left after the reserve
        ("B", COLD, 0.85, 0.0, ColdDecision("fallback", reason=f"class B {NO_WAIT}")),
        ("C", COLD, 0.15, 2.5, ColdDecision("fallback", reason="no budget left to wait for a cold start")),
        ("C", COLD, -0.1, 2.5, ColdDecision("fallback", reason="no budget left to wait for a cold start")),
    ],
)
def test_decide_cold(
    slo_class: str,
    state: DependencyState,
    remaining_s: float | None,
    max_wait_s: float,
    expected: ColdDecision,
) -> None:
    assert decide_cold(slo_class, state, remaining_s, max_wait_s, reserve_s=0.15) == expected


class Health:
    """A health answer that turns SERVING after `serving_after` probes."""

    def __init__(self, serving_after: int) -> None:
        self.serving_after = serving_after
        self.probes = 0

    async def __call__(self, timeout_s: float) -> bool:
        assert timeout_s > 0
        self.probes += 1
        return self.probes > self.serving_after


def test_state_follows_what_was_seen() -> None:
    watch = DependencyWatch("inference", Health(0), cold_after_s=60)
    assert watch.state() is COLD, "never seen serving: presumed cold"
    watch.mark_serving()
    assert watch.state() is WARM
    assert watch.state(now=time.monotonic() + 61) is COLD, "not seen for cold_after_s"
    watch.mark_presumed_cold()
    assert watch.state() is COLD


async def test_wait_polls_until_serving_and_is_bounded() -> None:
    health = Health(serving_after=3)
    watch = DependencyWatch("inference", health, cold_after_s=60)
    assert await watch.wait(5.0)
    assert health.probes == 4 and watch.state() is WARM

    never = DependencyWatch("inference", Health(serving_after=10**9), cold_after_s=60)
    started = time.monotonic()
    assert not await never.wait(0.3)
    assert time.monotonic() - started < 1.0
    assert never.state() is COLD


async def test_guard_per_class() -> None:
    health = Health(serving_after=2)
    guard = ColdGuard(
        {"inference": DependencyWatch("inference", health, 60)}, {"B": 0.0, "C": 2.5}, 0.15, 5.0
    )
    with request_scope("A", 0.3):
        a = await guard.prepare("A")
    assert a.skip == {"inference"} and a.notes == ["inference_cold"]
    with request_scope("B", 0.85):
        b = await guard.prepare("B")
    assert b.skip == {"inference"}
    await guard.close()

    health = Health(serving_after=2)
    guard = ColdGuard({"inference": DependencyWatch("inference", health, 60)}, {"C": 2.5}, 0.15, 5.0)
    with request_scope("C", 3.0):
        c = await guard.prepare("C")
    assert c.skip == frozenset() and c.notes == [] and health.probes == 3
    with request_scope("A", 0.3):
        a = await guard.prepare("A")
    assert a.skip == frozenset(), "seen serving by the class-C wait: warm for class A too"
    guard.observed("inference", False)
    with request_scope("A", 0.3):
        assert (await guard.prepare("A")).skip == {"inference"}
    await guard.close()


def test_settings_keep_class_a_out_and_names_known() -> None:
    with pytest.raises(pydantic.ValidationError, match="RECMESH_COLD_WAIT_S_BY_CLASS"):
        GatewaySettings.model_validate({"RECMESH_COLD_WAIT_S_BY_CLASS": {"A": 1.0}})
    with pytest.raises(ValueError, match="feature"):
        build_cold_guard(GatewaySettings.model_validate({"RECMESH_MAY_BE_COLD": ["feature"]}), {})
    assert build_cold_guard(GatewaySettings(), {}) is None
