"""The feedback controller that holds class-A P95 under its target.

Design notes: an online scheduling policy with P95 latency as the reward,
reward = clip((200 - p95_ms) / 200, 0, 1), re-tuned every window. Here the
policy is a small, deterministic, reward-driven rule (no learnt weights): once
per window it reads class A's P95 and the shed count, computes the reward
against the target, and moves one knob, the admission limit's latency target
(`AimdLimit.target_ms`): the lower it is, the sooner the concurrency limit
backs off and the more class C, then B, is shed.

- reward 0 (P95 at or over target): cut the knob hard (x `cut`);
- reward below `hold_below` (P95 close to target): hold;
- reward above it and requests were shed: the admission limit is costing
  goodput with latency to spare, so raise the knob (x `raise_`);
- nothing shed: no pressure; drift back towards the configured default.

Windows with fewer than `min_samples` class-A requests change nothing. The
knob stays within [lo_ms, hi_ms]. `ControllerLoop` is the thin periodic task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from prometheus_client import Gauge

from recmesh.admission import AdmissionConfig, AdmissionGate, ClassWindow
from recmesh.settings import AdmissionSettings
from recmesh.stats import percentile

_log = structlog.get_logger("recmesh.controller")

REWARD = Gauge("recmesh_controller_reward", "The controller's last reward (design notes' formula).", ())
WINDOW_P95 = Gauge(
    "recmesh_controller_window_p95_seconds", "Class P95 over the controller's last window.", ("slo_class",)
)


def reward(p95_ms: float, target_ms: float = 200.0) -> float:
    """clip((target - p95) / target, 0, 1); 1 is instant, 0 at or over the target."""
    return min(1.0, max(0.0, (target_ms - p95_ms) / target_ms))


def p95(samples: Sequence[float]) -> float | None:
    """The window's p95 (recmesh.stats: nearest rank); None without samples."""
    return percentile(samples, 95) if samples else None


@dataclass(frozen=True)
class WindowStats:
    p95_ms: float | None  # of the protected class
    samples: int
    shed: int  # requests of any class refused in the window


@dataclass
class LatencyTargetController:
    knob_ms: float
    target_p95_ms: float = 200.0
    lo_ms: float = 10.0
    hi_ms: float = 1000.0
    cut: float = 0.7
    raise_: float = 1.15
    hold_below: float = 0.25
    min_samples: int = 20
    last_reward: float | None = None

    def __post_init__(self) -> None:
        self.default_ms = self.knob_ms

    def update(self, stats: WindowStats) -> float:
        if stats.p95_ms is None or stats.samples < self.min_samples:
            return self.knob_ms
        r = reward(stats.p95_ms, self.target_p95_ms)
        self.last_reward = r
        if r <= 0.0:
            knob = self.knob_ms * self.cut
        elif r < self.hold_below:
            knob = self.knob_ms
        elif stats.shed > 0:
            knob = self.knob_ms * self.raise_
        else:
            knob = self.knob_ms + (self.default_ms - self.knob_ms) * 0.5
        self.knob_ms = min(self.hi_ms, max(self.lo_ms, knob))
        return self.knob_ms


def window_stats(window: ClassWindow, protected: str = "A") -> WindowStats:
    samples = window.latencies_ms.get(protected, [])
    return WindowStats(p95(samples), len(samples), sum(window.shed.values()))


class ControllerLoop:
    """Every `window_s`: read the gate's window, update the controller, apply the knob."""

    def __init__(self, gate: AdmissionGate, controller: LatencyTargetController, window_s: float) -> None:
        self._gate = gate
        self._controller = controller
        self._window_s = window_s

    def step(self) -> float:
        window = self._gate.take_window()
        for slo_class, samples in window.latencies_ms.items():
            value = p95(samples)
            if value is not None:
                WINDOW_P95.labels(slo_class).set(value / 1000)
        stats = window_stats(window)
        before = self._controller.knob_ms
        knob = self._controller.update(stats)
        if self._controller.last_reward is not None:
            REWARD.set(self._controller.last_reward)
        self._gate.set_latency_target(knob)
        if knob != before:
            _log.info("controller_step", p95_ms=stats.p95_ms, shed=stats.shed,
                      reward=self._controller.last_reward, latency_target_ms=round(knob, 1))  # fmt: skip
        return knob

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._window_s)
            self.step()


def build_overload(settings: AdmissionSettings) -> tuple[AdmissionGate | None, ControllerLoop | None]:
    """The gateway's admission gate and its controller loop, from settings (None when off)."""
    if not settings.enabled:
        return None, None
    gate = AdmissionGate(
        AdmissionConfig(
            initial_limit=settings.initial_limit,
            min_limit=settings.min_limit,
            max_limit=settings.max_limit,
            latency_target_ms=settings.latency_target_ms,
            shares={str(k): v for k, v in settings.shares.items()},
            queue_caps={str(k): v for k, v in settings.queue.items()},
            floors={str(k): v for k, v in settings.floors.items()},
            retry_after_s=settings.retry_after_s,
            queue_wait_fraction=settings.queue_wait_fraction,
            loop_lag_limit_ms=settings.loop_lag_limit_ms,
        )
    )
    if settings.controller_window_s <= 0:
        return gate, None
    controller = LatencyTargetController(
        settings.latency_target_ms,
        target_p95_ms=settings.target_p95_ms,
        lo_ms=settings.controller_min_ms,
        hi_ms=settings.controller_max_ms,
    )
    return gate, ControllerLoop(gate, controller, settings.controller_window_s)
