"""Offline replay: the same feature code over an event log, point in time.

Events are replayed in event-time order; for each training example (a view)
the features are computed as of 1 ms before it, from exactly the state the
online store would hold at that moment, with the same window functions as the
online look-up (compute.py). Nothing from an example's future can leak in.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

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
    LAST_VIEWED_SCAN,
    STATE_RETENTION_MS,
    FeatureValue,
    features_of,
)

LABEL_WINDOW_MS = 10_000  # a view is a positive example if the click follows within 10 s


@dataclass(frozen=True)
class Example:
    user_id: str
    item_id: str
    as_of_ms: int
    user: dict[str, FeatureValue]
    item: dict[str, FeatureValue]
    label: int


def _offline(entity: str, row: Mapping[str, Any] | None) -> dict[str, FeatureValue]:
    row = row or {}
    return {f.name: row.get(f.name, f.default) for f in features_of(entity, "offline")}  # type: ignore[arg-type]


class ReplayState:
    """Per-entity event state as the online store keeps it, held in memory."""

    def __init__(self, item_category: Mapping[str, str]) -> None:
        self._category = item_category
        self.user_events: dict[str, deque[UserEvent]] = defaultdict(deque)
        self.item_clicks: dict[str, list[int]] = defaultdict(list)
        self.item_views: dict[str, list[int]] = defaultdict(list)

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
            bisect.insort(target[ev["item_id"]], t)

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
    label is); features never do.
    """
    state = ReplayState({iid: str(f.get("category", "unknown")) for iid, f in items.items()})
    pending: deque[tuple[Mapping[str, Any], dict[str, FeatureValue], dict[str, FeatureValue]]] = deque()
    clicks_after: dict[tuple[str, str], list[int]] = defaultdict(list)
    users_off = {u: _offline("user", r) for u, r in users.items()}
    items_off = {i: _offline("item", r) for i, r in items.items()}
    no_user, no_item = _offline("user", None), _offline("item", None)

    def flush(now_ms: int | None) -> Iterator[Example]:
        while pending and (now_ms is None or pending[0][0]["event_time"] + LABEL_WINDOW_MS < now_ms):
            ev, uf, itf = pending.popleft()
            t = int(ev["event_time"])
            key = (ev["user_id"], ev["item_id"])
            label = int(any(t < c <= t + LABEL_WINDOW_MS for c in clicks_after.get(key, ())))
            yield Example(ev["user_id"], ev["item_id"], t - 1, uf, itf, label)

    for ev in events:
        t = int(ev["event_time"])
        yield from flush(t)
        if ev["behavior"] == "view":
            as_of = t - 1
            uf = {k: v for k, (v, _) in state.user_features(ev["user_id"], as_of).items()}
            itf = {k: v for k, (v, _) in state.item_features(ev["item_id"], as_of).items()}
            uf.update(users_off.get(ev["user_id"], no_user))
            itf.update(items_off.get(ev["item_id"], no_item))
            pending.append((ev, uf, itf))
        elif ev["behavior"] == "click":
            clicks_after[(ev["user_id"], ev["item_id"])].append(t)
        state.apply(ev)
    yield from flush(None)
