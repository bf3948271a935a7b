"""Items' real-time reads held in process for a stated bound, evicted by the ingest.

Most of a look-up's 200 items are the same popular items from one request to
the next, and an item's real-time state changes only when an event for it is
written. So the feature service keeps each item's last read (its window
counts and newest event times, or its events, exactly as the look-up script
returned them, with the logical time they were read as of) and serves it
again while both hold:
- no event for the item was written since: the ingest publishes the ids of
  the items each batch wrote on `keys.ITEMS_CHANGED` right after the write,
  and every feature service subscribes and drops them (`follow`);
- it is younger than `bound_ms`, and the look-up's `as_of_ms` is within
  `bound_ms` of the read's: what the bound allows is an event sliding out of a
  window in that time, nothing else. (A look-up in the moment between a write
  and its announcement, about a millisecond, sees the item as just before the
  write, as a look-up a moment earlier would have.)

Ages stay true: what is held is event times, and ages are computed from the
look-up's own `as_of_ms` (services/feature/store.py). Pub/sub delivers at
most once, so the cache serves nothing while it is not subscribed, and
forgets everything each time it (re)subscribes; an eviction that arrives
while a read is in flight keeps that read out of the cache. On Redis Cluster
the look-up reads every item (a cluster client has no asyncio pub/sub).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog
from prometheus_client import Counter, Gauge
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from recmesh.features import keys

_log = structlog.get_logger("item_cache")

LOOKUPS = Counter(
    "recmesh_feature_item_cache_total",
    "Items of look-ups served from the in-process real-time cache (hit) or read from Redis (miss).",
    ("result",),
)
FOLLOWING = Gauge(
    "recmesh_feature_item_cache_following",
    "1 while the item cache is subscribed to the ingest's item changes (it serves nothing otherwise).",
)
EVICTED = Counter("recmesh_feature_item_cache_evicted_total", "Items dropped on the ingest's word.")
SEP = "\n"  # between item ids in a change message (ids never hold one: recmesh.events)


class ItemReadCache:
    """Per item: (read at, as of, the look-up script's values for it)."""

    def __init__(self, bound_ms: int, max_entries: int = 100_000) -> None:
        self.bound_ms = bound_ms
        self._bound_s = bound_ms / 1000
        self._max = max_entries
        self._held: OrderedDict[str, tuple[float, int, Sequence[Any]]] = OrderedDict()
        self._evicted_at: dict[str, float] = {}  # recent evictions, for reads in flight
        self._following_since = float("inf")  # monotonic; inf: not subscribed

    @property
    def serving(self) -> bool:
        return self.bound_ms > 0 and self._following_since != float("inf")

    def get(
        self, item_ids: Sequence[str], as_of_ms: int, now: float
    ) -> tuple[dict[str, Sequence[Any]], list[str]]:
        """(held values by item, the items to read) for a look-up as of `as_of_ms`."""
        if not self.serving:
            if item_ids:
                LOOKUPS.labels("miss").inc(len(item_ids))
            return {}, list(item_ids)
        hits: dict[str, Sequence[Any]] = {}
        missing: list[str] = []
        for iid in item_ids:
            entry = self._held.get(iid)
            if (
                entry is not None
                and now - entry[0] <= self._bound_s
                and abs(as_of_ms - entry[1]) <= self.bound_ms
            ):
                hits[iid] = entry[2]
            else:
                missing.append(iid)
        if hits:
            LOOKUPS.labels("hit").inc(len(hits))
        if missing:
            LOOKUPS.labels("miss").inc(len(missing))
        return hits, missing

    def put(
        self, item_ids: Sequence[str], values: Sequence[Sequence[Any]], as_of_ms: int, read_at: float
    ) -> None:
        """Hold what a read that began at `read_at` returned, except items evicted since."""
        if not self.serving or read_at < self._following_since:
            return
        evicted = self._evicted_at
        for iid, value in zip(item_ids, values, strict=True):
            if evicted.get(iid, float("-inf")) >= read_at:
                continue
            self._held[iid] = (read_at, as_of_ms, value)
            self._held.move_to_end(iid)
        while len(self._held) > self._max:
            self._held.popitem(last=False)

    def evict(self, item_ids: Sequence[str], now: float) -> None:
        for iid in item_ids:
            self._held.pop(iid, None)
            self._evicted_at[iid] = now
        EVICTED.inc(len(item_ids))
        if len(self._evicted_at) > self._max:  # keep only what a read in flight could need
            horizon = now - max(self._bound_s, 1.0) * 10
            self._evicted_at = {i: t for i, t in self._evicted_at.items() if t >= horizon}

    def _start_following(self, now: float) -> None:
        self._held.clear()
        self._evicted_at.clear()
        self._following_since = now
        FOLLOWING.set(1)

    def _stop_following(self) -> None:
        self._following_since = float("inf")
        self._held.clear()
        FOLLOWING.set(0)

    async def follow(self, redis: Any, retry_s: float = 1.0) -> None:
        """Subscribe to the ingest's item changes until cancelled; serve only while subscribed."""
        if self.bound_ms <= 0:
            return
        if isinstance(redis, RedisCluster):
            _log.info("item_cache_off", reason="Redis Cluster: look-ups read every item")
            return
        while True:
            pubsub = redis.pubsub()
            try:
                await pubsub.subscribe(keys.ITEMS_CHANGED)
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=False, timeout=5.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self._start_following(time.monotonic())
                        _log.info("item_cache_following", channel=keys.ITEMS_CHANGED, bound_ms=self.bound_ms)
                    elif message["type"] == "message":
                        data = message["data"]
                        text = data.decode() if isinstance(data, bytes) else str(data)
                        self.evict(text.split(SEP), time.monotonic())
            except (RedisError, OSError) as err:
                self._stop_following()
                _log.warning("item_cache_not_following", error=repr(err), retry_s=retry_s)
                await asyncio.sleep(retry_s)
            finally:
                self._stop_following()
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()


def change_message(item_ids: Sequence[str]) -> str:
    """What the ingest publishes after writing a batch: the ids of the items it wrote."""
    return SEP.join(dict.fromkeys(item_ids))
