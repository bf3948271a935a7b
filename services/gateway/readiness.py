"""Whether this gateway can answer, and how the parts behind it are.

Readiness is about this process, not the mesh: the gateway can answer a
recommendation while the ranker serves, and also while it does not, from the
popular items it holds (recommend.py, flagged in `degraded`). Were its
readiness to follow the ranker, an outage of the ranker would take every
gateway pod out of its Service, and callers would get the load balancer's 503
instead of the degraded answers the fallback exists for. So:

- ready: the ranker reports SERVING, or a popular list is held;
- not ready: neither (a gateway that has never reached the feature service
  for its list while the ranker is down: it could only answer 503).

The event broker is not part of it: without one, `POST /v1/events` answers
503 naming it, and recommendations go on. Every downstream's health is in the
answer's body and in `recmesh_dependency_up{service="gateway",dependency}`,
kept fresh by `watch` whether or not anything probes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Gauge

from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender

HealthCheck = Callable[[], Awaitable[bool]]

DEPENDENCY_UP = Gauge(
    "recmesh_dependency_up",
    "1 while a dependency answers (a downstream SERVING, the broker connected), else 0.",
    ("service", "dependency"),
)
READY = Gauge("recmesh_ready", "1 while this process reports ready, else 0.", ("service",))

# A probe within this many seconds of the last evaluation reads it again.
CACHE_S = 1.0

_log = structlog.get_logger("recmesh.gateway.readiness")


@dataclass(frozen=True)
class ReadyState:
    ready: bool
    checks: dict[str, bool]
    fallback_items: int
    fallback_age_s: float | None

    def body(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "checks": self.checks,
            "fallback": {"items": self.fallback_items, "age_s": self.fallback_age_s},
        }


class Readiness:
    """The gateway's readiness (module docstring), evaluated at most once a second."""

    def __init__(
        self, checks: Mapping[str, HealthCheck], publisher: EventPublisher, recommender: Recommender
    ) -> None:
        # Downstreams that may be scaled to zero are left out by the caller:
        # a probe would wake them (services/gateway/cold.py).
        self._checks = dict(checks)
        self._publisher = publisher
        self._recommender = recommender
        self._state: ReadyState | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def state(self) -> ReadyState:
        async with self._lock:
            now = time.monotonic()
            if self._state is None or now - self._at > CACHE_S:
                self._state = await self._evaluate()
                self._at = time.monotonic()
            return self._state

    async def _evaluate(self) -> ReadyState:
        names = list(self._checks)
        results = await asyncio.gather(*(self._checks[n]() for n in names))
        checks = dict(zip(names, results, strict=True))
        checks["event_broker"] = self._publisher.ready
        held, age = self._recommender.fallback_held()
        ready = checks.get("ranker", False) or held > 0
        for name, up in checks.items():
            DEPENDENCY_UP.labels("gateway", name).set(1 if up else 0)
        READY.labels("gateway").set(1 if ready else 0)
        if self._state is not None and self._state.ready != ready:
            _log.warning("readiness_changed", ready=ready, checks=checks, fallback_items=held)
        return ReadyState(ready, checks, held, None if age is None else round(age, 1))

    async def watch(self, interval_s: float = 5.0) -> None:
        """Evaluate every `interval_s`, so the gauges and the log say it unprobed; and
        reconnect the event producer here, never on a probe: against an unreachable
        broker its start can take seconds, past a kubelet probe's timeout."""
        while True:
            if not self._publisher.ready:
                await self._publisher.start()
            await self.state()
            await asyncio.sleep(interval_s)
