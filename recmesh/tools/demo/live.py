"""Demo events stamped in the last minutes, so real-time features are live."""

from __future__ import annotations

import time

from recmesh.events import Event
from recmesh.tools.demo.generate import generate_events, make_catalog

LIVE_WINDOW_MS = 8 * 60 * 1000


def demo_events(count: int, seed: int, end_ms: int | None = None) -> list[Event]:
    """About `count` events from the demo generator, ending at `end_ms` (default now)."""
    end = end_ms or int(time.time() * 1000)
    start = end - LIVE_WINDOW_MS
    catalog = make_catalog()
    sessions = max(1, count // 8)
    events = [
        Event.model_validate(e) for e in generate_events(catalog, start, LIVE_WINDOW_MS, sessions, seed)
    ]
    return events[:count]
