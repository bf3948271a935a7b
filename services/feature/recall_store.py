"""Recall state in Redis: item-to-item co-visitation and per-category popularity.

Kept apart from the feature look-up path (store.py): these keys serve the
ranker's recall sources, not model inputs. The rules (window, pairing, bounds)
are in recmesh.features.covisit; this module only reads and writes Redis.

`apply_covisitation` counts with plain commands in non-transactional pipelines
and a marks set per user, so it works unchanged on a Redis Cluster, where a
user's marks and each item's counts live in different slots (redis-py groups
the pipeline per node). The ingest consumer uses it there; on a single Redis it
counts inside its one-script batch write instead (services/feature/writer.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

from recmesh.cache import TtlCache
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.compute import VIEWING
from recmesh.features.covisit import (
    COVISIT_MAX_PER_ITEM,
    COVISIT_SCAN,
    COVISIT_TTL_S,
    COVISIT_WINDOW_MS,
    merge_neighbours,
    pair_increments,
    previous_items,
)
from recmesh.features.definitions import MAX_EVENTS_PER_KEY, STATE_RETENTION_MS, STATE_TTL_S
from recmesh.redis_client import AnyRedis

# How often one process trims a co-visitation key to its bound.
TRIM_EVERY_S = 60.0


def _pairs(raw: object) -> list[tuple[str, float]]:
    return [(bytes(m).decode(), float(s)) for m, s in cast(list[tuple[bytes, float]], raw)]


class RecallStore:
    def __init__(self, client: AnyRedis, cache_entries: int = 200_000) -> None:
        self._redis = client
        self._trimmed: TtlCache[bool] = TtlCache(TRIM_EVERY_S, cache_entries)

    # --- writes (ingest) -------------------------------------------------

    async def apply_covisitation(self, events: Sequence[Event]) -> int:
        """Count the co-visits of a batch; returns the pairs counted.

        Call after the batch's events are in `{u:<id>}:viewed` (FeatureStore.apply_events):
        the previous items of an event are read from there, strictly before its
        event time. Redelivered events find their mark and count nothing.
        """
        viewing = [e for e in events if e.behavior in VIEWING]
        if not viewing:
            return 0
        pipe = self._redis.pipeline(transaction=False)
        newest: dict[str, int] = {}
        for ev in viewing:
            pipe.zadd(keys.user_covisit_marks(ev.user_id), {ev.event_id: ev.event_time})
            pipe.zrevrangebyscore(
                keys.user_viewed(ev.user_id), f"({ev.event_time}",
                f"({ev.event_time - COVISIT_WINDOW_MS}", start=0, num=COVISIT_SCAN,
            )  # fmt: skip
            newest[ev.user_id] = max(newest.get(ev.user_id, 0), ev.event_time)
        for user_id, t in newest.items():
            marks = keys.user_covisit_marks(user_id)
            pipe.zremrangebyscore(marks, "-inf", f"({t - STATE_RETENTION_MS}")
            pipe.zremrangebyrank(marks, 0, -(MAX_EVENTS_PER_KEY + 1))
            pipe.expire(marks, STATE_TTL_S)
        out = await pipe.execute()
        pairs: list[tuple[str, str]] = []
        for n, ev in enumerate(viewing):
            added, previous = out[2 * n], out[2 * n + 1]
            if int(added):
                pairs.extend((ev.item_id, other) for other in previous_items(ev.item_id, previous))
        increments = pair_increments(pairs)
        if not increments:
            return 0
        pipe = self._redis.pipeline(transaction=False)
        for item_id, counts in increments.items():
            key = keys.item_covisits(item_id)
            for other, by in counts.items():
                pipe.zincrby(key, by, other)
            pipe.expire(key, COVISIT_TTL_S)
        self._queue_trims(pipe, increments)
        await pipe.execute()
        return len(pairs)

    def _queue_trims(self, pipe: Any, item_ids: Iterable[str]) -> int:
        """Trim each count key to its bound at most once a minute per process."""
        now = time.monotonic()
        queued = 0
        for item_id in item_ids:
            key = keys.item_covisits(item_id)
            if self._trimmed.get_fresh(key, now) is None:
                self._trimmed.put(key, True, now)
                pipe.zremrangebyrank(key, 0, -(COVISIT_MAX_PER_ITEM + 1))
                queued += 1
        return queued

    async def trim(self, item_ids: Iterable[str]) -> None:
        """Trim the count keys of items whose counts just changed (at most once a
        minute per key per process)."""
        pipe = self._redis.pipeline(transaction=False)
        if self._queue_trims(pipe, item_ids):
            await pipe.execute()

    # --- reads (recall) ----------------------------------------------------

    async def related(self, item_ids: Sequence[str], per_item: int, limit: int) -> list[tuple[str, float]]:
        """Co-visited neighbours of the seeds, counts summed, seeds excluded, best first."""
        seeds = list(dict.fromkeys(item_ids))
        if not seeds or limit <= 0:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for iid in seeds:
            pipe.zrevrange(keys.item_covisits(iid), 0, per_item - 1, withscores=True)
        rows = [_pairs(raw) for raw in await pipe.execute()]
        return merge_neighbours(rows, seeds, limit)

    async def category_popular(
        self, categories: Sequence[str], limit: int
    ) -> list[tuple[str, list[tuple[str, float]]]]:
        """The `limit` most popular items of each category, in the given order."""
        wanted = list(dict.fromkeys(categories))
        if not wanted or limit <= 0:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for cat in wanted:
            pipe.zrevrange(keys.category_popularity(cat), 0, limit - 1, withscores=True)
        return [(cat, _pairs(raw)) for cat, raw in zip(wanted, await pipe.execute(), strict=True)]
