"""The event loop every recmesh service runs on.

uvloop (libuv) when `RECMESH_EVENT_LOOP` is `uvloop` (the default) and it is
installed, else asyncio's own loop. On the request path a service spends much
of its CPU in the loop itself (callbacks, socket reads and writes for HTTP and
the gRPC poller's wake-ups), which uvloop does in C.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("uvloop", "asyncio")


def loop_kind() -> str:
    kind = os.environ.get("RECMESH_EVENT_LOOP", "uvloop").strip().lower() or "uvloop"
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
