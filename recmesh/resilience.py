"""Per-request budget and class, carried in context variables.

The gateway (or a gRPC server interceptor, from the incoming deadline) opens a
request scope; every outbound call derives its timeout from what is left, minus
a margin this hop keeps for itself, so no hop waits longer than its caller.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import structlog

from recmesh.errors import DeadlineExceeded

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
