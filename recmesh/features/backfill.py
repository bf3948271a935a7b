"""Offline replay: the same feature code over an event log, point in time.

Events are replayed in event-time order; for each training example (a view)
the features are computed as of 1 ms before it, from exactly the state the
online store would hold at that moment, with the same window functions as the
online look-up (compute.py). Nothing from an example's future can leak in.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from recmesh.features.compute import (
    VIEWING,
    UserEvent,
    count_in_window,
    item_realtime,
    newest_at_or_before,
    user_realtime,
    window_lo,
)
from recmesh.features.definitions import (
    FEATURE_SET_VERSION,
    LAST_VIEWED_SCAN,
    STATE_RETENTION_MS,
    FeatureValue,
    features_of,
)

LABEL_WINDOW_MS = 10_000  # a view is a positive example if the click follows within 10 s
SWEEP_EVERY = 100_000  # events between sweeps of idle entities


@dataclass(frozen=True)
class Example:
    user_id: str
    item_id: str
    as_of_ms: int
    user: dict[str, FeatureValue]
    item: dict[str, FeatureValue]
    label: int


def offline_values(entity: str, row: Mapping[str, Any] | None) -> dict[str, FeatureValue]:
    row = row or {}
    return {f.name: row.get(f.name, f.default) for f in features_of(entity, "offline")}  # type: ignore[arg-type]


class ReplayState:
    """Per-entity event state as the online store keeps it, held in memory."""

    def __init__(self, item_category: Mapping[str, str]) -> None:
        self._category = item_category
        self.user_events: dict[str, deque[UserEvent]] = defaultdict(deque)
        self.item_clicks: dict[str, list[int]] = defaultdict(list)
        self.item_views: dict[str, list[int]] = defaultdict(list)
        self._applied = 0

    def apply(self, ev: Mapping[str, Any]) -> None:
        t = int(ev["event_time"])
        ue = UserEvent(ev["event_id"], ev["item_id"], ev["behavior"],
                       self._category.get(ev["item_id"], "unknown"), t)  # fmt: skip
        events = self.user_events[ev["user_id"]]
        events.append(ue)
        while events and events[0].event_time_ms < t - STATE_RETENTION_MS:
            events.popleft()
        target = {"click": self.item_clicks, "view": self.item_views}.get(ev["behavior"])
        if target is not None:
            times = target[ev["item_id"]]
            bisect.insort(times, t)
            if times[0] < t - STATE_RETENTION_MS:
                del times[: bisect.bisect_left(times, t - STATE_RETENTION_MS)]
        self._applied += 1
        if self._applied % SWEEP_EVERY == 0:
            self.sweep(t)

    def sweep(self, now_ms: int) -> None:
        """Forget entities whose newest event is older than the state retention,
        as the online store's TTLs do, so replay memory stays bounded."""
        cutoff = now_ms - STATE_RETENTION_MS
        for uid in [u for u, evs in self.user_events.items() if not evs or evs[-1].event_time_ms < cutoff]:
            del self.user_events[uid]
        for table in (self.item_clicks, self.item_views):
            for iid in [i for i, ts in table.items() if not ts or ts[-1] < cutoff]:
                del table[iid]

    def user_features(self, user_id: str, as_of_ms: int) -> dict[str, tuple[FeatureValue, int]]:
        """Walks the user's events newest first (replay applies them in time order)."""
        lo10 = window_lo(as_of_ms, "category_clicks_10m")
        lo1h = window_lo(as_of_ms, "last_viewed_3")
        in10: list[UserEvent] = []
        viewed: list[UserEvent] = []
        for e in reversed(self.user_events.get(user_id, ())):
            t = e.event_time_ms
            if t > as_of_ms:
                continue
            if t <= lo1h:
                break
            if t > lo10:
                in10.append(e)
            if e.behavior in VIEWING:
                if len(viewed) >= LAST_VIEWED_SCAN and t < viewed[-1].event_time_ms:
                    if t <= lo10:
                        break
                    continue
                viewed.append(e)
        # Same order as ZREVRANGEBYSCORE on members 'event_id|item_id'.
        viewed.sort(key=lambda e: (e.event_time_ms, f"{e.event_id}|{e.item_id}"), reverse=True)
        return user_realtime(in10, [(e.item_id, e.event_time_ms) for e in viewed], as_of_ms)

    def item_features(self, item_id: str, as_of_ms: int) -> dict[str, tuple[FeatureValue, int]]:
        lo = window_lo(as_of_ms, "clicks_10m")
        clicks = self.item_clicks.get(item_id, [])
        views = self.item_views.get(item_id, [])
        newest = [newest_at_or_before(clicks, as_of_ms), newest_at_or_before(views, as_of_ms)]
        newest_in = [t for t in newest if t is not None and t > lo]
        return item_realtime(
            count_in_window(clicks, lo, as_of_ms),
            count_in_window(views, lo, as_of_ms),
            max(newest_in) if newest_in else None,
            as_of_ms,
        )


def training_examples(
    events: Iterable[Mapping[str, Any]],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> Iterator[Example]:
    """One example per view, labelled by a click on the same item within 10 s.

    `events` must be sorted by event time. Labels look ahead (that is what a
    label is); features never do. Memory holds only the state retention window
    and the views still waiting for their label.
    """
    state = ReplayState({iid: str(f.get("category", "unknown")) for iid, f in items.items()})
    pending: deque[_Pending] = deque()
    waiting: dict[tuple[str, str], list[_Pending]] = defaultdict(list)
    users_off = {u: offline_values("user", r) for u, r in users.items()}
    items_off = {i: offline_values("item", r) for i, r in items.items()}
    no_user, no_item = offline_values("user", None), offline_values("item", None)

    def flush(now_ms: int | None) -> Iterator[Example]:
        while pending and (now_ms is None or pending[0].t + LABEL_WINDOW_MS < now_ms):
            p = pending.popleft()
            key = (p.user_id, p.item_id)
            queue = waiting[key]
            queue.remove(p)
            if not queue:
                del waiting[key]
            yield Example(p.user_id, p.item_id, p.t - 1, p.user, p.item, p.label)

    for ev in events:
        t = int(ev["event_time"])
        yield from flush(t)
        if ev["behavior"] == "view":
            as_of = t - 1
            uf = {k: v for k, (v, _) in state.user_features(ev["user_id"], as_of).items()}
            itf = {k: v for k, (v, _) in state.item_features(ev["item_id"], as_of).items()}
            uf.update(users_off.get(ev["user_id"], no_user))
            itf.update(items_off.get(ev["item_id"], no_item))
            p = _Pending(ev["user_id"], ev["item_id"], t, uf, itf)
            pending.append(p)
            waiting[(p.user_id, p.item_id)].append(p)
        elif ev["behavior"] == "click":
            for p in waiting.get((ev["user_id"], ev["item_id"]), ()):
                if p.t < t <= p.t + LABEL_WINDOW_MS:
                    p.label = 1
        state.apply(ev)
    yield from flush(None)


@dataclass(eq=False)
class _Pending:
    user_id: str
    item_id: str
    t: int
    user: dict[str, FeatureValue]
    item: dict[str, FeatureValue]
    label: int = 0


def backfill(
    events_path: Path,
    out_path: Path,
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    progress: Callable[[str], None] | None = None,
    run_size: int = 200_000,
) -> dict[str, Any]:
    """Point-in-time training rows for an event log, as JSON lines:
    {"user_id", "item_id", "as_of_ms", "label", "feature_version", "user": {...}, "item": {...}}."""
    from recmesh.features.eventlog import sorted_events

    started = time.perf_counter()
    rows = positives = 0
    with out_path.open("wb") as fh:
        for ex in training_examples(sorted_events(events_path, run_size), users, items):
            fh.write(
                orjson.dumps(
                    {
                        "user_id": ex.user_id,
                        "item_id": ex.item_id,
                        "as_of_ms": ex.as_of_ms,
                        "label": ex.label,
                        "feature_version": FEATURE_SET_VERSION,
                        "user": ex.user,
                        "item": ex.item,
                    }
                )
                + b"\n"
            )
            rows += 1
            positives += ex.label
            if progress is not None and rows % 20_000 == 0:
                progress(f"{rows} rows ({rows / (time.perf_counter() - started):.0f} rows/s)")
    return {
        "rows": rows,
        "positives": positives,
        "seconds": round(time.perf_counter() - started, 2),
        "feature_version": FEATURE_SET_VERSION,
    }
