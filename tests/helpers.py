"""Test helpers: free ports (re-exported from recmesh.embedded) and polling (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from recmesh.embedded import free_port

__all__ = ["free_port", "poll_until"]

T = TypeVar("T")


async def poll_until(
    fn: Callable[[], Awaitable[T]],
    description: str,
    timeout: float = 10.0,  # noqa: ASYNC109 (a polling deadline, not a cancellation scope)
    interval: float = 0.05,
) -> T:
    """Call `fn` until it returns a truthy value; fail with `description` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for: {description} (last: {last!r})")
