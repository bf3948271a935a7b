"""Downstreams that may be scaled to zero, and what each SLO class does about it.

A dependency named in RECMESH_MAY_BE_COLD (in a cluster: the Knative inference
Service, `minScale 0`) is presumed cold when the gateway has not seen it serve
for `RECMESH_COLD_AFTER_S`. The gateway does not probe it in the background,
since a probe is traffic and would keep it warm forever. Per request:

- `decide_cold` (pure) turns (class, dependency state, remaining budget, the
  class's tolerated wait) into call / wait / fallback. Class A never waits:
  it takes the fallback at once and says so in `degraded`;
- `wait` polls `grpc.health.v1` until SERVING, bounded by the decision (never
  past the request's deadline). Through Knative the first probe is also what
  wakes the service: the activator holds it and scales the revision from zero;
- a fallback for class A still starts one bounded background wake-up, so the
  next class-A request finds the dependency warm instead of staying unscored
  while nobody else asks for it.

State is learned from traffic: a ranker answer scored by the model marks
inference warm, a `scoring_unavailable` answer marks it presumed cold again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import structlog
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from recmesh.resilience import remaining_s
from recmesh.settings import GatewaySettings
from recmesh.telemetry import FALLBACKS

_log = structlog.get_logger("recmesh.gateway.cold")

HealthCheck = Callable[[float], Awaitable[bool]]

COLD_DECISIONS = Counter(
    "recmesh_gateway_cold_decisions_total",
    "Requests that met a presumed-cold dependency, by what the gateway did.",
    ("dependency", "action", "slo_class"),
)

COLD_WAIT = Histogram(
    "recmesh_gateway_cold_wait_seconds",
    "Time a request waited for a presumed-cold dependency, by how the wait ended.",
    ("dependency", "outcome", "slo_class"),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 10.0),
)
_tracer = trace.get_tracer("recmesh.gateway.cold")

# The longest a single health probe waits; a wait polls again until its bound.
PROBE_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.05
MAX_POLL_INTERVAL_S = 0.25


class DependencyState(Enum):
    WARM = "warm"  # seen serving within the last `cold_after_s`
    PRESUMED_COLD = "presumed_cold"  # not seen serving lately: may be scaled to zero


@dataclass(frozen=True)
class ColdDecision:
    action: Literal["call", "wait", "fallback"]
    wait_s: float = 0.0
    reason: str = ""


def decide_cold(
    slo_class: str,
    state: DependencyState,
    remaining_s: float | None,
    max_wait_s: float,
    reserve_s: float,
) -> ColdDecision:
    """What a request of `slo_class` does about one dependency in `state`.

    `max_wait_s` is what the class tolerates (config), `remaining_s` the
    request's budget left (None: no deadline), `reserve_s` what the request
    still needs once the dependency is up. Class A never waits.
    """
    if state is DependencyState.WARM:
        return ColdDecision("call")
    if slo_class == "A":
        return ColdDecision("fallback", reason="class A never routes to a cold dependency")
    if max_wait_s <= 0:
        return ColdDecision("fallback", reason=f"class {slo_class} does not wait for cold dependencies")
    wait_s = max_wait_s if remaining_s is None else min(max_wait_s, remaining_s - reserve_s)
    if wait_s <= 0:
        return ColdDecision("fallback", reason="no budget left to wait for a cold start")
    return ColdDecision("wait", wait_s=wait_s)


class DependencyWatch:
    """What the gateway knows about one may-be-cold dependency."""

    def __init__(self, name: str, health: HealthCheck, cold_after_s: float) -> None:
        self.name = name
        self._health = health
        self._cold_after_s = cold_after_s
        self._last_serving: float | None = None
        self._wake_task: asyncio.Task[bool] | None = None

    def state(self, now: float | None = None) -> DependencyState:
        now = time.monotonic() if now is None else now
        if self._last_serving is not None and now - self._last_serving < self._cold_after_s:
            return DependencyState.WARM
        return DependencyState.PRESUMED_COLD

    def mark_serving(self) -> None:
        self._last_serving = time.monotonic()

    def mark_presumed_cold(self) -> None:
        self._last_serving = None

    async def wait(self, timeout_s: float) -> bool:
        """Poll health until SERVING or `timeout_s` is spent; True when it serves."""
        deadline = time.monotonic() + timeout_s
        interval = POLL_INTERVAL_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if await self._health(min(PROBE_TIMEOUT_S, left)):
                self.mark_serving()
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(interval, left))
            interval = min(interval * 2, MAX_POLL_INTERVAL_S)

    def wake_in_background(self, timeout_s: float) -> None:
        """Start one bounded wake-up (no-op while one runs)."""
        if self._wake_task is None or self._wake_task.done():
            self._wake_task = asyncio.create_task(self.wait(timeout_s))

    async def close(self) -> None:
        if self._wake_task is not None and not self._wake_task.done():
            self._wake_task.cancel()


@dataclass(frozen=True)
class ColdOutcome:
    """What `ColdGuard.prepare` decided for one request."""

    skip: frozenset[str]  # dependencies this request must not call
    notes: list[str]  # for the response's `degraded`


class ColdGuard:
    """Applies `decide_cold` to every may-be-cold dependency of a request."""

    def __init__(
        self,
        watches: Mapping[str, DependencyWatch],
        max_wait_s_by_class: Mapping[str, float],
        reserve_s: float,
        wake_timeout_s: float,
    ) -> None:
        self.watches = dict(watches)
        self._max_wait = dict(max_wait_s_by_class)
        self._reserve_s = reserve_s
        self._wake_timeout_s = wake_timeout_s

    async def prepare(self, slo_class: str) -> ColdOutcome:
        """Run inside the request's scope: budgets come from `remaining_s()`."""
        skip: set[str] = set()
        notes: list[str] = []
        for name, watch in self.watches.items():
            state = watch.state()
            if state is DependencyState.WARM:
                continue
            decision = decide_cold(
                slo_class, state, remaining_s(), self._max_wait.get(slo_class, 0.0), self._reserve_s
            )
            span = trace.get_current_span()
            if decision.action == "wait":
                started = time.monotonic()
                with _tracer.start_as_current_span("cold_wait") as wait_span:
                    wait_span.set_attribute("recmesh.dependency", name)
                    wait_span.set_attribute("recmesh.slo_class", slo_class)
                    wait_span.set_attribute("recmesh.cold_wait_bound_s", decision.wait_s)
                    serving = await watch.wait(decision.wait_s)
                    wait_span.set_attribute("recmesh.serving", serving)
                waited = time.monotonic() - started
                COLD_WAIT.labels(name, "serving" if serving else "gave_up", slo_class).observe(waited)
                _log.info("cold_wait", dependency=name, waited_s=round(waited, 3), serving=serving)
                if serving:
                    COLD_DECISIONS.labels(name, "waited", slo_class).inc()
                    continue
                decision = ColdDecision("fallback", reason=f"not serving after {waited:.3f} s")
            COLD_DECISIONS.labels(name, "fallback", slo_class).inc()
            FALLBACKS.labels("gateway", f"{name}_cold", slo_class).inc()
            span.add_event("fallback", {"reason": f"{name}_cold", "why": decision.reason})
            _log.warning("fallback", reason=f"{name}_cold", why=decision.reason)
            skip.add(name)
            notes.append(f"{name}_cold")
            watch.wake_in_background(self._wake_timeout_s)
        return ColdOutcome(frozenset(skip), notes)

    def observed(self, name: str, serving: bool) -> None:
        """What a response showed about `name` (no-op for dependencies not watched)."""
        watch = self.watches.get(name)
        if watch is None:
            return
        if serving:
            watch.mark_serving()
        else:
            watch.mark_presumed_cold()

    async def close(self) -> None:
        for watch in self.watches.values():
            await watch.close()


# What skipping each dependency means: the gateway serves its held popular
# items instead of calling the ranker; the ranker keeps the popularity order
# instead of calling inference. The feature service has no such path.
SKIPPABLE = ("ranker", "inference")


def build_cold_guard(settings: GatewaySettings, health: Mapping[str, HealthCheck]) -> ColdGuard | None:
    """The guard for settings.may_be_cold (None when nothing may be cold)."""
    unknown = sorted(set(settings.may_be_cold) - set(SKIPPABLE))
    if unknown:
        raise ValueError(
            f"RECMESH_MAY_BE_COLD: {unknown} cannot be scaled to zero; only {list(SKIPPABLE)} have a fallback"
        )
    if not settings.may_be_cold:
        return None
    watches = {
        name: DependencyWatch(name, health[name], settings.cold_after_s) for name in settings.may_be_cold
    }
    return ColdGuard(
        watches,
        {str(k): v for k, v in settings.cold_wait_s_by_class.items()},
        settings.cold_reserve_ms / 1000,
        settings.cold_wake_timeout_s,
    )
