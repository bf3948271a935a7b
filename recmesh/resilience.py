"""Per-request budget and class, carried in context variables; the pure
resilience policies every client applies (circuit breaker, retry budget,
hedging delay).

The gateway (or a gRPC server interceptor, from the incoming deadline) opens a
request scope; every outbound call derives its timeout from what is left, minus
a margin this hop keeps for itself, so no hop waits longer than its caller.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import TypeVar

import structlog

from recmesh.errors import DeadlineExceeded
from recmesh.stats import percentile

T = TypeVar("T")
_log = structlog.get_logger("recmesh.resilience")

UNKNOWN_CLASS = "unknown"

_deadline: ContextVar[float | None] = ContextVar("recmesh_deadline", default=None)
_slo_class: ContextVar[str] = ContextVar("recmesh_slo_class", default=UNKNOWN_CLASS)


@contextmanager
def request_scope(slo_class: str, timeout_s: float | None) -> Iterator[None]:
    """Run the body with this class and a deadline `timeout_s` from now (None: no deadline)."""
    expires = None if timeout_s is None else time.monotonic() + timeout_s
    t1 = _deadline.set(expires)
    t2 = _slo_class.set(slo_class)
    try:
        yield
    finally:
        _deadline.reset(t1)
        _slo_class.reset(t2)


def current_slo_class() -> str:
    return _slo_class.get()


def remaining_s() -> float | None:
    """Seconds left in the current request's budget; None when it has none."""
    expires = _deadline.get()
    return None if expires is None else expires - time.monotonic()


def call_timeout(margin_s: float, cap_s: float | None = None) -> float | None:
    """Timeout for one outbound call: what is left minus `margin_s`, at most `cap_s`.

    Raises DeadlineExceeded when nothing usable is left, so callers take their
    fallback without spending a round trip that cannot succeed.
    """
    left = remaining_s()
    if left is None:
        return cap_s
    budget = left - margin_s
    if budget <= 0:
        raise DeadlineExceeded(f"request budget spent ({left * 1000:.1f} ms left)")
    return budget if cap_s is None else min(budget, cap_s)


async def retry_until(
    attempt: Callable[[], Awaitable[T]],
    what: str,
    *,
    retry_on: tuple[type[BaseException], ...],
    initial_s: float = 0.1,
    max_s: float = 5.0,
    stop: asyncio.Event | None = None,
) -> T:
    """Call `attempt` until it succeeds, backing off exponentially (with jitter).

    For start-up dependencies and for pausing a consumer while its store is
    down: the caller simply does not move on until the dependency is back.
    """
    delay = initial_s
    failures = 0
    while True:
        try:
            return await attempt()
        except retry_on as err:
            failures += 1
            _log.warning("retrying", what=what, failures=failures, delay_s=round(delay, 3), error=repr(err))
            if stop is not None and stop.is_set():
                raise
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(max_s, delay * 2)


# --- circuit breaker, retry budget, hedging delay (pure, clock passed in) ----


def load_band(load: float) -> int:
    """The design notes' degradation bands for a load ratio (in use / capacity):
    >= 0.95 -> 3, >= 0.85 -> 2, >= 0.7 -> 1, else 0. The inference service
    suggests levels by them, the ranker steps its ladder by them."""
    if load >= 0.95:
        return 3
    if load >= 0.85:
        return 2
    return 1 if load >= 0.7 else 0


class BreakerState(Enum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Consecutive failures open it; after `open_s` one probe is let through
    (half-open): its success closes the breaker, its failure opens it again.
    A probe that never reports (cancelled) is replaced after another `open_s`.
    """

    def __init__(
        self, failure_threshold: int = 5, open_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failure_threshold < 1 or open_s <= 0:
            raise ValueError("failure_threshold >= 1 and open_s > 0")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self._clock = clock
        self.state = BreakerState.CLOSED
        self.failures = 0
        self._since = 0.0  # when it opened, or when the probe went out

    def allow(self) -> bool:
        now = self._clock()
        if self.state is BreakerState.CLOSED:
            return True
        if now - self._since < self.open_s:
            return False
        self.state, self._since = BreakerState.HALF_OPEN, now  # this call is the probe
        return True

    def record_success(self) -> None:
        self.state, self.failures = BreakerState.CLOSED, 0

    def record_failure(self) -> None:
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN or self.failures >= self.failure_threshold:
            self.state, self._since = BreakerState.OPEN, self._clock()


class RetryBudget:
    """Retries (and hedges) may spend at most `ratio` of the requests made.

    A token bucket: each request deposits `ratio` tokens, each retry takes one;
    the bucket starts with `initial` tokens and holds at most `cap`. Over any
    run, retries <= ratio * requests + initial.
    """

    def __init__(self, ratio: float = 0.1, initial: float = 2.0, cap: float = 20.0) -> None:
        if not 0 <= ratio <= 1:
            raise ValueError("ratio must be in [0, 1]")
        self.ratio = ratio
        self.tokens = initial
        self.cap = cap

    def on_request(self) -> None:
        self.tokens = min(self.cap, self.tokens + self.ratio)

    def has_room(self) -> bool:
        return self.tokens >= 1

    def try_spend(self) -> bool:
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class LatencyTracker:
    """The last `size` latencies of one call; `quantile` once `min_samples` are in.

    Every hedged call asks for a quantile, so the sorted copy is reused until
    `resort_every` new samples have come in (sorting 256 floats per call cost
    more than the rest of the hedge decision)."""

    def __init__(self, size: int = 256, min_samples: int = 20, resort_every: int = 16) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._min = min_samples
        self._resort_every = resort_every
        self._ordered: list[float] | None = None
        self._added = 0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self._added += 1

    def quantile(self, q: float) -> float | None:
        if len(self._samples) < self._min:
            return None
        if self._ordered is None or self._added >= self._resort_every:
            self._ordered, self._added = sorted(self._samples), 0
        return percentile(self._ordered, q * 100, ordered=True)  # nearest rank
