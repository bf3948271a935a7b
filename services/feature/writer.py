"""The ingest write: one batch of events into Redis, feature state and co-visitation together.

On a single Redis the whole batch is one script call that writes the feature
state (as FeatureStore.apply_events does) and counts co-visits (the rules of
recmesh.features.covisit). The ZADD of an event into the user's viewed set is
the co-visit mark: only an event that ZADD actually added is counted, so a
redelivered event counts nothing, atomically with its write. That spares the
separate marks set and a second script per batch (Redis CPU per event: about
79 -> 59 µs in the write alone, tests/perf figures in docs/architecture.md).

Increments are summed per (item, neighbour) within the batch and sent grouped
by item key: one ZINCRBY per distinct pair, and each count key touched in one
burst (cache-friendly on the Redis side; -12 % Redis CPU on uniform traffic,
far more on skewed traffic where pairs repeat within a batch).

On a Redis Cluster a user's viewed set and an item's counts live in different
slots, so the write is FeatureStore.apply_events then
RecallStore.apply_covisitation (pipelines grouped per node, with the marks set).
Do not count the same events with both paths on a single Redis: each has its
own mark, so the second would count them again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from recmesh.cache import TtlCache
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.covisit import COVISIT_PREVIOUS, COVISIT_SCAN, COVISIT_TTL_S, COVISIT_WINDOW_MS
from recmesh.features.definitions import MAX_EVENTS_PER_KEY, STATE_RETENTION_MS, STATE_TTL_S
from services.feature.recall_store import RecallStore
from services.feature.store import MAINTAIN_EVERY_S, FeatureStore

# ARGV: retention_ms, cap, state_ttl_s, window_ms, scan, previous, covisit_ttl_s,
# events "user\titem\tevent_id\tbehavior\tcategory\ttime" per line (sorted by
# time), upkeep "key\tnewest" per line. Returns {pairs counted, touched item ids...}.
# Keys are built here from ids (as the item window script in store.py does):
# packing thousands of key arguments cost the client more than the write.
# Order as in the two-step write: every ZADD, then upkeep, then co-visit reads.
_APPLY_LUA = r"""
local retention, cap, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window, scan, previous = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local covisit_ttl = tonumber(ARGV[7])
local fresh = {}
for user, item, eid, beh, cat, t in string.gmatch(ARGV[8],
    '([^\t\n]+)\t([^\t\n]+)\t([^\t\n]+)\t([^\t\n]+)\t([^\t\n]*)\t(%d+)') do
  local u = '{u:' .. user .. '}'
  redis.call('ZADD', u .. ':events', t, eid .. '|' .. item .. '|' .. beh .. '|' .. cat)
  if beh == 'view' or beh == 'click' then
    redis.call('ZADD', '{i:' .. item .. (beh == 'view' and '}:views' or '}:clicks'), t, eid)
    if redis.call('ZADD', u .. ':viewed', t, eid .. '|' .. item) == 1 then
      fresh[#fresh + 1] = {u .. ':viewed', item, tonumber(t)}
    end
  end
end
for key, newest in string.gmatch(ARGV[9], '([^\t\n]+)\t(%d+)') do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('(%d', tonumber(newest) - retention))
  redis.call('ZREMRANGEBYRANK', key, 0, -(cap + 1))
  redis.call('EXPIRE', key, ttl)
end
local counted, by = 0, {}
for _, f in ipairs(fresh) do
  local item, t = f[2], f[3]
  local viewed = redis.call('ZREVRANGEBYSCORE', f[1],
    string.format('(%d', t), string.format('(%d', t - window), 'LIMIT', 0, scan)
  local seen, n = {}, 0
  for _, member in ipairs(viewed) do
    local other = string.match(member, '^.*|(.*)$') or member
    if other ~= item and not seen[other] then
      seen[other] = true
      n = n + 1
      local a = by[item]
      if a == nil then a = {}; by[item] = a end
      a[other] = (a[other] or 0) + 1
      local b = by[other]
      if b == nil then b = {}; by[other] = b end
      b[item] = (b[item] or 0) + 1
      if n == previous then break end
    end
  end
  counted = counted + n
end
local out = {counted}
for item, incs in pairs(by) do
  local key = '{i:' .. item .. '}:covisits'
  for other, k in pairs(incs) do redis.call('ZINCRBY', key, k, other) end
  redis.call('EXPIRE', key, covisit_ttl)
  out[#out + 1] = item
end
return out
"""


def _field(text: str) -> str:
    """A category as one tab-separated field (ids are validated free of whitespace)."""
    return text.replace("\t", " ").replace("\n", " ") if "\t" in text or "\n" in text else text


class EventWriter:
    """Writes a batch's feature state and co-visits; idempotent under redelivery."""

    def __init__(self, store: FeatureStore, recall: RecallStore, cache_entries: int = 200_000) -> None:
        self._store = store
        self._recall = recall
        self._redis = store.client
        self._cluster = isinstance(self._redis, RedisCluster)
        self._maintained: TtlCache[bool] = TtlCache(MAINTAIN_EVERY_S, cache_entries)
        self._sha: str | None = None

    async def apply(self, events: Sequence[Event]) -> int:
        """Write `events` (sorted by event time); returns the co-visit pairs counted."""
        if not events:
            return 0
        if self._cluster:
            await self._store.apply_events(events)
            return await self._recall.apply_covisitation(events)
        categories = await self._store.item_categories(e.item_id for e in events)
        lines: list[str] = []
        newest: dict[str, int] = {}  # key -> newest event time in the batch
        for ev in events:
            user, item, t, behavior = ev.user_id, ev.item_id, ev.event_time, ev.behavior
            lines.append(f"{user}\t{item}\t{ev.event_id}\t{behavior}\t{_field(categories[item])}\t{t}")
            written = [keys.user_events(user)]
            if behavior == "view":
                written += (keys.user_viewed(user), keys.item_views(item))
            elif behavior == "click":
                written += (keys.user_viewed(user), keys.item_clicks(item))
            for key in written:
                if newest.get(key, -1) < t:
                    newest[key] = t
        now = time.monotonic()
        upkeep: list[str] = []
        for key, t in newest.items():
            if self._maintained.get_fresh(key, now) is None:
                self._maintained.put(key, True, now)
                upkeep.append(f"{key}\t{t}")
        args = (
            STATE_RETENTION_MS, MAX_EVENTS_PER_KEY, STATE_TTL_S,
            COVISIT_WINDOW_MS, COVISIT_SCAN, COVISIT_PREVIOUS, COVISIT_TTL_S,
            "\n".join(lines), "\n".join(upkeep),
        )  # fmt: skip
        if self._sha is None:
            self._sha = await self._redis.script_load(_APPLY_LUA)
        try:
            out = await self._redis.evalsha(self._sha, 0, *args)
        except NoScriptError:  # the server restarted: load it again
            self._sha = await self._redis.script_load(_APPLY_LUA)
            out = await self._redis.evalsha(self._sha, 0, *args)
        await self._recall.trim([bytes(i).decode() for i in out[1:]])
        return int(out[0])
