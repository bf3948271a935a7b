"""The event loop every recmesh service runs on.

asyncio's own loop unless `RECMESH_EVENT_LOOP=uvloop` (libuv; installed as a
dependency). uvloop once measured about 10 % less CPU for the gateway and
ranker, but a later A/B (alternated meshes, CPU per recommendation from /proc)
found no difference above the machine's drift, so asyncio stays the default
(docs/architecture.md, *Performance*). A start-up hang once blamed on uvloop
was gRPC's fork handlers (grpc/grpc#43055, see recmesh/__init__.py).
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
