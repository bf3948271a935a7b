"""The event loop every recmesh service runs on.

asyncio's own loop unless `RECMESH_EVENT_LOOP=uvloop` (libuv; installed as a
dependency). On the request path a service spends much of its CPU in the loop
itself (callbacks, socket reads and writes for HTTP and the gRPC poller's
wake-ups), which uvloop does in C: about 10 % less CPU per recommendation for
the gateway and ranker together, measured back to back. It is not the default
because once, in the joint load test, a gateway on uvloop never finished
starting, with gRPC's own poller reporting `epoll_wait: Bad file descriptor`
(not reproduced in 15 standalone starts and 3 reruns); the standard loop has
shown no such failure.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("uvloop", "asyncio")
DEFAULT = "asyncio"


def loop_kind() -> str:
    kind = os.environ.get("RECMESH_EVENT_LOOP", DEFAULT).strip().lower() or DEFAULT
    if kind not in CHOICES:
        raise ValueError(f"RECMESH_EVENT_LOOP must be one of {', '.join(CHOICES)}, not {kind!r}")
    if kind == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
    return kind


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the chosen loop."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
