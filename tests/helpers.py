"""Test helpers: free ports and polling (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def free_port(below: int = 65536) -> int:
    """A free loopback port under `below` (a Redis Cluster node also needs port + 10000)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below:
            return port


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
