"""Window logic shared by the online look-up and the offline replay.

Windows are half-open over event time, (as_of - window, as_of]: an event at
exactly `as_of` counts, one at `as_of - window` does not. Redis ZCOUNT and
ZRANGEBYSCORE are called with the same bounds ('(lo', 'hi'), so the two paths
agree exactly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from recmesh.features.definitions import BY_NAME, LAST_VIEWED_SCAN, FeatureValue

CLICK = "click"
VIEWING = frozenset({"view", "click"})


@dataclass(frozen=True, slots=True)
class UserEvent:
    event_id: str
    item_id: str
    behavior: str
    category: str
    event_time_ms: int

    def encode(self) -> str:
        return f"{self.event_id}|{self.item_id}|{self.behavior}|{self.category}"

    @classmethod
    def decode(cls, member: str, event_time_ms: int) -> UserEvent:
        event_id, item_id, behavior, category = member.rsplit("|", 3)
        return cls(event_id, item_id, behavior, category, event_time_ms)


def window_lo(as_of_ms: int, feature: str) -> int:
    """Exclusive lower bound of `feature`'s window at `as_of_ms`."""
    window = BY_NAME[feature].window_ms
    assert window is not None, f"{feature} has no window"
    return as_of_ms - window


def user_realtime(
    events: Sequence[UserEvent], viewed: Sequence[tuple[str, int]], as_of_ms: int
) -> dict[str, tuple[FeatureValue, int]]:
    """User features from the events in the 10-minute window and the latest
    view/click events (newest first), as name -> (value, age_ms).

    `events` must already be restricted to (as_of - 10 min, as_of]; this function
    applies each feature's own narrower window.
    """
    lo5 = window_lo(as_of_ms, "clicks_5m")
    clicks_5m = 0
    newest_click = None
    categories: dict[str, int] = {}
    for ev in events:
        if ev.behavior != CLICK:
            continue
        categories[ev.category] = categories.get(ev.category, 0) + 1
        if ev.event_time_ms > lo5:
            clicks_5m += 1
        if newest_click is None or ev.event_time_ms > newest_click:
            newest_click = ev.event_time_ms
    click_age = -1 if newest_click is None else as_of_ms - newest_click
    last: list[str] = []
    for item_id, _ in viewed[:LAST_VIEWED_SCAN]:
        if item_id not in last:
            last.append(item_id)
        if len(last) == 3:
            break
    viewed_age = -1 if not viewed else as_of_ms - viewed[0][1]
    return {
        "clicks_5m": (clicks_5m, click_age),
        "category_clicks_10m": (categories, click_age),
        "last_viewed_3": (last, viewed_age),
    }


def freshness(age_ms: int, tau_s: float) -> float:
    """2^(-age/tau): 1.0 for an event at the as-of time, 0.5 one tau older;
    0.0 when no event is behind the value (age < 0)."""
    if age_ms < 0:
        return 0.0
    return float(2.0 ** (-age_ms / (tau_s * 1000.0)))


def count_in_window(sorted_times: Sequence[int], lo_exclusive: int, hi_inclusive: int) -> int:
    """Events with lo < t <= hi in an ascending list: the offline twin of ZCOUNT '(lo' 'hi'."""
    return bisect.bisect_right(sorted_times, hi_inclusive) - bisect.bisect_right(sorted_times, lo_exclusive)


def newest_at_or_before(sorted_times: Sequence[int], hi_inclusive: int) -> int | None:
    idx = bisect.bisect_right(sorted_times, hi_inclusive)
    return sorted_times[idx - 1] if idx else None


def item_realtime(
    clicks: int, views: int, newest_ms: int | None, as_of_ms: int
) -> dict[str, tuple[FeatureValue, int]]:
    age = -1 if newest_ms is None else as_of_ms - newest_ms
    return {"clicks_10m": (clicks, age), "views_10m": (views, age)}


def item_realtime_columns(
    clicks: Sequence[int], views: Sequence[int], newest_ms: Sequence[int], as_of_ms: int
) -> dict[str, tuple[list[FeatureValue], list[int]]]:
    """`item_realtime` for many items at once, column-wise (newest_ms < 0: no
    event in the window): name -> (values, ages) in input order. The look-up
    of hundreds of candidates uses it so that no per-item objects are built.
    Both windows share one ages list (read-only downstream).
    """
    ages = [-1 if t < 0 else as_of_ms - t for t in newest_ms]
    return {"clicks_10m": (list(clicks), ages), "views_10m": (list(views), ages)}


def merge_newest(*times: Iterable[int | None]) -> int | None:
    vals = [t for group in times for t in group if t is not None]
    return max(vals) if vals else None
