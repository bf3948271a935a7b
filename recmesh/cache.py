"""A small in-process TTL cache with stale reads for fallbacks.

Used for item/user profile features (design notes: a hot item key pinned one
Redis shard; a 5 s local cache fixed it) and candidate lists. `get_fresh`
answers within the TTL; `get_stale` answers whatever is held, for serving a
fallback when the store is down.

A caller that can tell when its source last changed passes `Vouched` instead
of relying on age alone: an entry stored since the change is fresh (up to a
much longer `max_age_s`, a safety net), and one stored before it counts its
age from the last moment the source was known unchanged
(services/feature/store.py learns both from the version that every offline
load writes and every look-up reads).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Vouched:
    """What a caller knows of its source's changes (times are time.monotonic()):
    none since `since`; the change before that was seen at `prev_since`, and
    the source was last known unchanged at `until` (prev_since <= until <= since).

    So an entry stored since `since` is current; one stored from `prev_since`
    on was current at `until` (or when stored, if later); an older one only
    when it was stored. Entries
    vouched for are still re-read once older than `max_age_s`.
    """

    since: float
    until: float
    prev_since: float
    max_age_s: float

    def current_at(self, stored: float) -> float:
        """The last moment an entry stored at `stored` (before `since`) is known current."""
        return max(stored, self.until) if stored >= self.prev_since else stored


class TtlCache(Generic[V]):
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._data: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_fresh(self, key: str, now: float | None = None, vouched: Vouched | None = None) -> V | None:
        """The entry if fresh: stored within the TTL, or with `vouched`, stored
        since the source last changed and within `vouched.max_age_s`."""
        entry = self._data.get(key)
        now = time.monotonic() if now is None else now
        if entry is None or (
            entry[0] < vouched.since or now - entry[0] > vouched.max_age_s
            if vouched
            else now - entry[0] > self._ttl
        ):
            self.misses += 1
            return None
        self.hits += 1
        self._data.move_to_end(key)
        return entry[1]

    def get_stale(self, key: str) -> V | None:
        entry = self._data.get(key)
        return None if entry is None else entry[1]

    def get_many(
        self,
        keys: Sequence[str],
        now: float | None = None,
        refresh_after_s: float | None = None,
        vouched: Vouched | None = None,
    ) -> tuple[list[V | None], list[str], list[str]]:
        """What is held for each key (fresh or stale, None if nothing), the
        distinct keys that are not fresh at `now`, and the distinct fresh keys
        older than `refresh_after_s` (due for a refresh ahead of expiry), in
        first-seen order. With `vouched`, an entry stored since the change is
        fresh (due past `vouched.max_age_s`), and an older one is due at once
        and served while within the TTL of the last moment it is known current.
        One pass for a batch of hundreds of keys, counted like `get_fresh`."""
        now = time.monotonic() if now is None else now
        data, ttl = self._data, self._ttl
        due_age = ttl if refresh_after_s is None else refresh_after_s
        since, max_age = float("inf"), float("inf")
        if vouched is not None:
            since, max_age, due_age = vouched.since, vouched.max_age_s, -1.0
        held: list[V | None] = []
        stale: dict[str, None] = {}
        due: dict[str, None] = {}
        misses = 0  # per key given, like get_fresh: a repeated id counts each time
        for key in keys:
            entry = data.get(key)
            if entry is None:
                held.append(None)
                stale[key] = None
                misses += 1
                continue
            held.append(entry[1])
            stored = entry[0]
            if stored >= since:
                if now - stored > max_age:
                    due[key] = None
                data.move_to_end(key)
                continue
            age = now - (stored if vouched is None else vouched.current_at(stored))
            if age > ttl:
                stale[key] = None
                misses += 1
            else:
                if age > due_age:
                    due[key] = None
                data.move_to_end(key)
        self.misses += misses
        self.hits += len(keys) - misses
        return held, list(stale), list(due)

    def put(self, key: str, value: V, now: float | None = None) -> None:
        self._data[key] = (time.monotonic() if now is None else now, value)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
