"""Per-class admission with an adaptive concurrency limit.

The policy is pure and takes plain values:

- `AimdLimit` is the adaptive limit of Netflix's concurrency-limits (AIMD):
  every finished request is a sample; one slower than the latency target (or
  one that failed) multiplies the limit by `backoff`, a fast one while the
  limit is at least half used adds one. The feedback controller
  (`recmesh.controller`) moves the latency target, once per window.
- `decide` admits, queues or sheds one request from the number in flight,
  the limit and the queue depths. Each class may fill only its share of the
  limit (defaults A 100%, B 80%, C 50%), so as in-flight work rises class C is
  refused first, then B, and A keeps the whole limit (plus a floor of slots
  of its own). A class over its share may wait in its own queue (C has none
  by default) for at most a share of its budget; a freed slot goes to the
  most important waiting class first. A lagging event loop (queueing in front
  of the gate) sheds C, then B.

The queues are bounded by time; their counts only bound what they hold. A
small count turned a client that re-sends as soon as it is refused (a closed
loop, `wrk -c32`) into thousands of refusals a second whose CPU came out of
the answers (docs/architecture.md, *Overload and faults*).

`AdmissionGate` is the thin asyncio wrapper the gateway holds: it applies the
decision, keeps the waiters, feeds samples to the limit, records per-class
latencies for the controller's window and exports the metrics. A refusal is
`ResourceExhausted` carrying `retry_after_s` (HTTP 429 + Retry-After, gRPC
RESOURCE_EXHAUSTED + a `retry-after` trailer).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from opentelemetry import trace
from prometheus_client import Counter, Gauge

from recmesh.errors import ResourceExhausted

PRIORITY = ("A", "B", "C")  # most important first
# Smoothed loop lag at or above which the lag watcher keeps sampling often
# (an idle 100 ms timer on a busy host fires a millisecond or two late).
BUSY_LAG_MS = 5.0

SHED = Counter(
    "recmesh_admission_shed_total",
    "Requests refused by admission control, by class and reason (limit, queue_full, queue_timeout).",
    ("service", "slo_class", "reason"),
)
LIMIT = Gauge("recmesh_admission_limit", "Current adaptive concurrency limit.", ("service",))
LATENCY_TARGET = Gauge(
    "recmesh_admission_latency_target_seconds",
    "Latency above which the limit backs off (moved by the feedback controller).",
    ("service",),
)
IN_FLIGHT = Gauge("recmesh_admission_in_flight", "Requests admitted and not yet finished.", ("service",))
LOOP_LAG = Gauge(
    "recmesh_event_loop_lag_seconds",
    "How late a timer fires in this process's event loop (smoothed; sampled every 10 ms under traffic).",
    ("service",),
)
QUEUED = Gauge("recmesh_admission_queued", "Requests waiting for a slot, by class.", ("service", "slo_class"))


@dataclass(frozen=True)
class AdmissionConfig:
    initial_limit: float = 32
    min_limit: float = 8
    max_limit: float = 256
    latency_target_ms: float = 100.0
    backoff: float = 0.9
    # Share of the limit each class may fill.
    shares: Mapping[str, float] = field(default_factory=lambda: {"A": 1.0, "B": 0.8, "C": 0.5})
    # In-flight slots a class may always use whatever the adaptive limit says:
    # the limit exists to shed the others for A, not to queue A behind itself
    # when latency is high for reasons concurrency does not explain (CPU steal).
    floors: Mapping[str, int] = field(default_factory=lambda: {"A": 16})
    # Waiting room per class once its share is used up (a bound on what it
    # holds: the wait is bounded by queue_wait_fraction); 0 sheds at once.
    queue_caps: Mapping[str, int] = field(default_factory=lambda: {"A": 256, "B": 256, "C": 0})
    # A queued request waits at most this share of its remaining budget.
    queue_wait_fraction: float = 0.5
    retry_after_s: int = 1
    # Event-loop lag of the gateway process itself (work queued in front of the
    # gate, which in-flight counts cannot see): past it class C is shed, past
    # twice it class B too; class A is never shed for lag. 0 turns it off.
    loop_lag_limit_ms: float = 25.0


class AimdLimit:
    """Additive increase, multiplicative decrease on latency samples."""

    def __init__(self, initial: float, lo: float, hi: float, target_ms: float, backoff: float = 0.9) -> None:
        if not 0 < lo <= initial <= hi:
            raise ValueError(f"need 0 < min ({lo}) <= initial ({initial}) <= max ({hi})")
        if not 0 < backoff < 1:
            raise ValueError("backoff must be in (0, 1)")
        self.limit = float(initial)
        self.lo, self.hi = float(lo), float(hi)
        self.target_ms = target_ms
        self.backoff = backoff

    def on_sample(self, latency_ms: float, in_flight: int, dropped: bool = False) -> float:
        if dropped or latency_ms > self.target_ms:
            self.limit = max(self.lo, self.limit * self.backoff)
        elif in_flight * 2 >= self.limit:
            self.limit = min(self.hi, self.limit + 1)
        return self.limit


class Verdict(Enum):
    ADMIT = "admit"
    QUEUE = "queue"
    SHED = "shed"


def class_ceiling(
    limit: float, slo_class: str, shares: Mapping[str, float], floors: Mapping[str, int] | None = None
) -> int:
    """How many requests may be in flight when one of `slo_class` asks to enter."""
    share = math.floor(limit * shares.get(slo_class, min(shares.values())))
    return max(1, share, (floors or {}).get(slo_class, 0))


def decide(
    slo_class: str,
    in_flight: int,
    limit: float,
    queued: Mapping[str, int],
    config: AdmissionConfig,
    loop_lag_ms: float = 0.0,
) -> Verdict:
    """Admit when the class's share of the limit has room and nobody more
    important is waiting; else queue while its waiting room has space; else shed.
    A lagging event loop sheds C (lag past the limit) and B (past twice it) first."""
    rank = PRIORITY.index(slo_class) if slo_class in PRIORITY else len(PRIORITY)
    if (
        config.loop_lag_limit_ms > 0
        and rank > 0
        and loop_lag_ms > config.loop_lag_limit_ms * (3 - min(rank, 2))
    ):
        return Verdict.SHED
    someone_ahead = any(queued.get(c, 0) for c in PRIORITY[: rank + 1])
    if in_flight < class_ceiling(limit, slo_class, config.shares, config.floors) and not someone_ahead:
        return Verdict.ADMIT
    if queued.get(slo_class, 0) < config.queue_caps.get(slo_class, 0):
        return Verdict.QUEUE
    return Verdict.SHED


@dataclass
class ClassWindow:
    """Latencies (ms) and outcomes seen since the controller last looked."""

    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    admitted: dict[str, int] = field(default_factory=dict)
    shed: dict[str, int] = field(default_factory=dict)

    MAX_SAMPLES = 20_000  # per class and window; beyond it samples are dropped evenly

    def add_latency(self, slo_class: str, ms: float) -> None:
        samples = self.latencies_ms.setdefault(slo_class, [])
        n = self.admitted.get(slo_class, 0) + 1
        self.admitted[slo_class] = n
        if len(samples) < self.MAX_SAMPLES:
            samples.append(ms)
        else:  # reservoir sampling keeps the window's distribution
            j = random.randrange(n)
            if j < self.MAX_SAMPLES:
                samples[j] = ms

    def add_shed(self, slo_class: str) -> None:
        self.shed[slo_class] = self.shed.get(slo_class, 0) + 1


class AdmissionGate:
    def __init__(
        self,
        config: AdmissionConfig,
        service: str = "gateway",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.limiter = AimdLimit(
            config.initial_limit, config.min_limit, config.max_limit, config.latency_target_ms, config.backoff
        )
        self.in_flight = 0
        self._service = service
        self._clock = clock
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {c: deque() for c in PRIORITY}
        self.window = ClassWindow()
        self.loop_lag_ms = 0.0
        self._asked = 0  # admission decisions taken (the lag watcher's sign of traffic)
        LIMIT.labels(service).set(self.limiter.limit)
        LATENCY_TARGET.labels(service).set(self.limiter.target_ms / 1000)

    def set_latency_target(self, target_ms: float) -> None:
        self.limiter.target_ms = target_ms
        LATENCY_TARGET.labels(self._service).set(target_ms / 1000)

    def take_window(self) -> ClassWindow:
        window, self.window = self.window, ClassWindow()
        return window

    def _queued(self) -> dict[str, int]:
        return {c: len(q) for c, q in self._waiters.items()}

    def _decide(self, slo_class: str) -> Verdict:
        self._asked += 1
        queued = self._queued()
        return decide(slo_class, self.in_flight, self.limiter.limit, queued, self.config, self.loop_lag_ms)

    def would_shed(self, slo_class: str) -> bool:
        """What `slot` would do right now, without taking anything."""
        return self._decide(slo_class) is Verdict.SHED

    def record_loop_lag(self, lag_ms: float) -> None:
        self.loop_lag_ms = 0.7 * self.loop_lag_ms + 0.3 * max(0.0, lag_ms)
        LOOP_LAG.labels(self._service).set(self.loop_lag_ms / 1000)

    async def watch_loop_lag(self, interval_s: float = 0.01, idle_interval_s: float = 0.1) -> None:
        """Measure this event loop's lag forever (a background task): every
        `interval_s` while the gate sees traffic (requests in flight, requests
        asked about since the last sample, shed ones included) or the loop
        lags, every `idle_interval_s` otherwise: waking 100 times a second cost
        an idle gateway 2.5 % of a core. A burst on an idle gateway is first
        sampled at most `idle_interval_s` later (the sample still measures the
        whole lag: it is how late the timer fired)."""
        seen = -1
        while True:
            busy = self.in_flight > 0 or self._asked != seen or self.loop_lag_ms >= BUSY_LAG_MS
            seen = self._asked
            wait_s = interval_s if busy else idle_interval_s
            started = time.perf_counter()
            await asyncio.sleep(wait_s)
            self.record_loop_lag((time.perf_counter() - started - wait_s) * 1000)

    def refuse(self, slo_class: str) -> ResourceExhausted:
        """Count a refusal decided by `would_shed` and return the error to answer with."""
        return self._shed(slo_class, self._shed_reason(slo_class))

    def _shed_reason(self, slo_class: str) -> str:
        if decide(slo_class, 0, self.limiter.limit, {}, self.config, self.loop_lag_ms) is Verdict.SHED:
            return "loop_lag"  # it would be shed even with nothing in flight
        return "queue_full" if self.config.queue_caps.get(slo_class) else "limit"

    def _shed(self, slo_class: str, reason: str) -> ResourceExhausted:
        SHED.labels(self._service, slo_class, reason).inc()
        trace.get_current_span().set_attribute("recmesh.shed_reason", reason)
        self.window.add_shed(slo_class)
        return ResourceExhausted(
            f"overloaded: class {slo_class} shed ({reason}, limit {self.limiter.limit:.0f}, "
            f"in flight {self.in_flight})",
            retry_after_s=self.config.retry_after_s,
        )

    def _enter(self) -> None:
        self.in_flight += 1
        IN_FLIGHT.labels(self._service).set(self.in_flight)

    def _wake(self) -> None:
        for slo_class in PRIORITY:
            queue = self._waiters[slo_class]
            ceiling = class_ceiling(self.limiter.limit, slo_class, self.config.shares, self.config.floors)
            while queue and self.in_flight < ceiling:
                waiter = queue.popleft()
                if not waiter.done():
                    self._enter()
                    waiter.set_result(None)
            QUEUED.labels(self._service, slo_class).set(len(queue))
            if queue:
                return  # nobody less important overtakes a waiting class

    @contextlib.asynccontextmanager
    async def slot(self, slo_class: str, budget_s: float | None) -> AsyncIterator[None]:
        """Hold one admission slot for the body; raise ResourceExhausted if none is given."""
        arrived = self._clock()
        verdict = self._decide(slo_class)
        if verdict is Verdict.SHED:
            raise self._shed(slo_class, self._shed_reason(slo_class))
        if verdict is Verdict.QUEUE:
            await self._wait(slo_class, budget_s)
        else:
            self._enter()
        started = self._clock()
        dropped = True
        try:
            yield
            dropped = False
        finally:
            self.in_flight -= 1
            IN_FLIGHT.labels(self._service).set(self.in_flight)
            now = self._clock()
            # The limit learns from service time; the controller's window holds
            # what the caller saw, the wait for a slot included.
            self.limiter.on_sample((now - started) * 1000, self.in_flight + 1, dropped)
            LIMIT.labels(self._service).set(self.limiter.limit)
            self.window.add_latency(slo_class, (now - arrived) * 1000)
            self._wake()

    async def _wait(self, slo_class: str, budget_s: float | None) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[slo_class]
        queue.append(waiter)
        QUEUED.labels(self._service, slo_class).set(len(queue))
        wait_s = None if budget_s is None else max(0.0, budget_s * self.config.queue_wait_fraction)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait_s)
        except TimeoutError:
            if waiter.done():  # granted just as the wait ran out: keep the slot
                return
            waiter.cancel()
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            QUEUED.labels(self._service, slo_class).set(len(queue))
            raise self._shed(slo_class, "queue_timeout") from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.in_flight -= 1  # granted, but the caller went away
                IN_FLIGHT.labels(self._service).set(self.in_flight)
                self._wake()
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
            raise
