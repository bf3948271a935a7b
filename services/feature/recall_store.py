"""Recall state in Redis: item-to-item co-visitation and per-category popularity.

Kept apart from the feature look-up path (store.py): these keys serve the
ranker's recall sources, not model inputs. The rules (window, pairing, bounds)
are in recmesh.features.covisit; this module only reads and writes Redis. Every
command is a plain one in a non-transactional pipeline, so it works unchanged on
a Redis Cluster, where a user's marks and each item's counts live in different
slots (redis-py groups the pipeline per node).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from recmesh.cache import TtlCache
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.compute import VIEWING
from recmesh.features.covisit import (
    COVISIT_MAX_PER_ITEM,
    COVISIT_PREVIOUS,
    COVISIT_SCAN,
    COVISIT_TTL_S,
    COVISIT_WINDOW_MS,
    merge_neighbours,
    pair_increments,
    previous_items,
)
from recmesh.features.definitions import MAX_EVENTS_PER_KEY, STATE_RETENTION_MS, STATE_TTL_S
from recmesh.redis_client import AnyRedis

# The same counting as the pipelined path, in one script call per batch on a
# single Redis (the pipeline cost ~7x the feature write itself: 9k events/s).
# Keys are built here from ids, as the item window script in store.py does;
# tests/integration/test_recall_store.py compares both paths' counts.
# ARGV: window_ms, scan, previous, retention_ms, cap, state_ttl_s, covisit_ttl_s,
# events "user\titem\tevent_id\ttime" per line, marks upkeep "user\tnewest" per line.
# Returns {pairs counted, item ids whose counts changed...}.
_COVISIT_LUA = r"""
local window, scan, previous = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local retention, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local state_ttl, covisit_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local counted, touched = 0, {}
for user, item, eid, t in string.gmatch(ARGV[8], '([^\t\n]+)\t([^\t\n]+)\t([^\t\n]+)\t(%d+)') do
  t = tonumber(t)
  if redis.call('ZADD', '{u:' .. user .. '}:covisit_marks', t, eid) == 1 then
    local viewed = redis.call('ZREVRANGEBYSCORE', '{u:' .. user .. '}:viewed',
      string.format('(%d', t), string.format('(%d', t - window), 'LIMIT', 0, scan)
    local seen, n = {}, 0
    for _, member in ipairs(viewed) do
      local other = string.match(member, '([^|]*)$')
      if other ~= item and not seen[other] then
        seen[other] = true
        n = n + 1
        counted = counted + 1
        redis.call('ZINCRBY', '{i:' .. item .. '}:covisits', 1, other)
        redis.call('ZINCRBY', '{i:' .. other .. '}:covisits', 1, item)
        touched[item] = true
        touched[other] = true
        if n == previous then break end
      end
    end
  end
end
for user, newest in string.gmatch(ARGV[9], '([^\t\n]+)\t(%d+)') do
  local marks = '{u:' .. user .. '}:covisit_marks'
  redis.call('ZREMRANGEBYSCORE', marks, '-inf', string.format('(%d', tonumber(newest) - retention))
  redis.call('ZREMRANGEBYRANK', marks, 0, -(cap + 1))
  redis.call('EXPIRE', marks, state_ttl)
end
local out = {counted}
for item, _ in pairs(touched) do
  redis.call('EXPIRE', '{i:' .. item .. '}:covisits', covisit_ttl)
  out[#out + 1] = item
end
return out
"""

# How often one process trims a co-visitation key to its bound.
TRIM_EVERY_S = 60.0


def _pairs(raw: object) -> list[tuple[str, float]]:
    return [(bytes(m).decode(), float(s)) for m, s in cast(list[tuple[bytes, float]], raw)]


class RecallStore:
    def __init__(self, client: AnyRedis, cache_entries: int = 200_000) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._trimmed: TtlCache[bool] = TtlCache(TRIM_EVERY_S, cache_entries)
        self._covisit_sha: str | None = None

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
        if not self._cluster:
            return await self._apply_covisitation_script(viewing)
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

    async def _apply_covisitation_script(self, viewing: Sequence[Event]) -> int:
        newest: dict[str, int] = {}
        for ev in viewing:
            newest[ev.user_id] = max(newest.get(ev.user_id, 0), ev.event_time)
        args = [
            COVISIT_WINDOW_MS, COVISIT_SCAN, COVISIT_PREVIOUS, STATE_RETENTION_MS, MAX_EVENTS_PER_KEY,
            STATE_TTL_S, COVISIT_TTL_S,
            "\n".join(f"{e.user_id}\t{e.item_id}\t{e.event_id}\t{e.event_time}" for e in viewing),
            "\n".join(f"{u}\t{t}" for u, t in newest.items()),
        ]  # fmt: skip
        if self._covisit_sha is None:
            self._covisit_sha = await self._redis.script_load(_COVISIT_LUA)
        try:
            out = await self._redis.evalsha(self._covisit_sha, 0, *args)  # type: ignore[arg-type]
        except NoScriptError:
            self._covisit_sha = await self._redis.script_load(_COVISIT_LUA)
            out = await self._redis.evalsha(self._covisit_sha, 0, *args)  # type: ignore[arg-type]
        counted, touched = int(out[0]), [bytes(i).decode() for i in out[1:]]
        pipe = self._redis.pipeline(transaction=False)
        if self._queue_trims(pipe, touched):
            await pipe.execute()
        return counted

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
