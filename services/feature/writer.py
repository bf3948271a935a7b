"""The ingest write: one batch of events into Redis, feature state and co-visitation together.

On a single Redis the whole batch is one script call that writes the feature
state (as FeatureStore.apply_events does) and counts co-visits (the rules of
recmesh.features.covisit). The ZADD of an event into the user's viewed set is
the co-visit mark: only an event that ZADD actually added is counted, so a
redelivered event counts nothing, atomically with its write. That spares the
separate marks set and a second script per batch (Redis CPU per event, measured
during `recmesh bench features`: 59-63 µs before, 47-53 µs after, with the
anchored member pattern below).

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster

from recmesh.cache import TtlCache
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.compute import VIEWING
from recmesh.features.covisit import COVISIT_PREVIOUS, COVISIT_SCAN, COVISIT_TTL_S, COVISIT_WINDOW_MS
from recmesh.features.definitions import MAX_EVENTS_PER_KEY, STATE_RETENTION_MS, STATE_TTL_S
from services.feature.recall_store import RecallStore
from services.feature.store import MAINTAIN_EVERY_S, FeatureStore

# ARGV: retention_ms, cap, state_ttl_s, window_ms, scan, previous, covisit_ttl_s,
# events "user\titem\tevent_id\tbehavior\tcategory\ttime" per line (sorted by
# time), upkeep "key\tnewest" per line, items "item\tnewest" per line (the
# batch's newest click or view per item). Returns {pairs counted, touched item ids...}.
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
  local item = string.match(key, '^({i:.*}):[a-z]+$')
  if item then
    -- An item's clicks, views and newest keys share one expiry: maintaining
    -- either set re-expires all three, so none outlives the others.
    redis.call('EXPIRE', item .. ':clicks', ttl)
    redis.call('EXPIRE', item .. ':views', ttl)
    redis.call('EXPIRE', item .. ':newest', ttl)
  else
    redis.call('EXPIRE', key, ttl)
  end
end
-- Each item's newest event time, for look-ups (keys.item_newest). A missing
-- key (new item, evicted, dropped by apply_events, state older than the key)
-- is seeded from the sets this batch has written to, with their expiry, so it
-- starts from the item's true newest event, not the batch's.
for item, t in string.gmatch(ARGV[10], '([^\t\n]+)\t(%d+)') do
  local k = '{i:' .. item .. '}:'
  local held = tonumber(redis.call('GET', k .. 'newest'))
  if held == nil then
    local newest, expire_ms = tonumber(t), -1
    for _, set in ipairs({k .. 'clicks', k .. 'views'}) do
      local top = redis.call('ZREVRANGE', set, 0, 0, 'WITHSCORES')[2]
      if top ~= nil and tonumber(top) > newest then newest = tonumber(top) end
      expire_ms = math.max(expire_ms, redis.call('PTTL', set))
    end
    if expire_ms > 0 then
      redis.call('SET', k .. 'newest', string.format('%d', newest), 'PX', expire_ms)
    else
      redis.call('SET', k .. 'newest', string.format('%d', newest), 'EX', ttl)
    end
  elseif tonumber(t) > held then
    redis.call('SET', k .. 'newest', t, 'KEEPTTL')
  end
end
local function distinct_others(viewed, item)
  local seen, others = {}, {}
  for _, member in ipairs(viewed) do
    local other = string.match(member, '^.*|(.*)$') or member
    if other ~= item and not seen[other] then
      seen[other] = true
      others[#others + 1] = other
      if #others == previous then break end
    end
  end
  return others
end
local counted, by = 0, {}
for _, f in ipairs(fresh) do
  local key, item, t = f[1], f[2], f[3]
  local hi, lo = string.format('(%d', t), string.format('(%d', t - window)
  -- The newest `previous` members usually hold `previous` distinct items; read
  -- up to `scan` only when they do not (same answer, half the reply).
  local viewed = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, previous)
  local others = distinct_others(viewed, item)
  if #others < previous and #viewed == previous then
    others = distinct_others(redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, scan), item)
  end
  for _, other in ipairs(others) do
    local a = by[item]
    if a == nil then a = {}; by[item] = a end
    a[other] = (a[other] or 0) + 1
    local b = by[other]
    if b == nil then b = {}; by[other] = b end
    b[item] = (b[item] or 0) + 1
  end
  counted = counted + #others
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


@dataclass(frozen=True)
class WritePlan:
    """A batch ready to write: the events, and on a single Redis the script's arguments."""

    events: Sequence[Event]
    args: tuple[int | str, ...] | None


class EventWriter:
    """Writes a batch's feature state and co-visits; idempotent under redelivery.

    `prepare` does the client-side work (categories, the script's arguments),
    which does not depend on earlier batches being written, so the consumer runs
    it while the previous batch's write is in Redis; `write` sends it.
    """

    def __init__(self, store: FeatureStore, recall: RecallStore, cache_entries: int = 200_000) -> None:
        self._store = store
        self._recall = recall
        self._redis = store.client
        self._cluster = isinstance(self._redis, RedisCluster)
        # keys this process trimmed and re-expired in the last MAINTAIN_EVERY_S
        self._maintained: TtlCache[bool] = TtlCache(MAINTAIN_EVERY_S, cache_entries)
        self._apply = self._redis.register_script(_APPLY_LUA)  # reloads it if the server lost it

    async def apply(self, events: Sequence[Event]) -> int:
        """Write `events` (sorted by event time); returns the co-visit pairs counted."""
        return await self.write(await self.prepare(events))

    async def prepare(self, events: Sequence[Event]) -> WritePlan:
        if self._cluster or not events:
            return WritePlan(events, None)
        categories = await self._store.item_categories(e.item_id for e in events)
        lines: list[str] = []
        # newest event time per written key, by key family, keyed by entity id
        users: dict[str, int] = {}
        viewers: dict[str, int] = {}
        viewed_items: dict[str, int] = {}
        clicked_items: dict[str, int] = {}
        for ev in events:
            user, item, t, behavior = ev.user_id, ev.item_id, ev.event_time, ev.behavior
            lines.append(f"{user}\t{item}\t{ev.event_id}\t{behavior}\t{_field(categories[item])}\t{t}")
            if users.get(user, -1) < t:
                users[user] = t
            if behavior in VIEWING:
                if viewers.get(user, -1) < t:
                    viewers[user] = t
                per_item = viewed_items if behavior == "view" else clicked_items
                if per_item.get(item, -1) < t:
                    per_item[item] = t
        upkeep = self._due_upkeep(
            ((keys.user_events, users), (keys.user_viewed, viewers),
             (keys.item_views, viewed_items), (keys.item_clicks, clicked_items))
        )  # fmt: skip
        newest_by_item = dict(viewed_items)
        for item, t in clicked_items.items():
            if newest_by_item.get(item, -1) < t:
                newest_by_item[item] = t
        args = (
            STATE_RETENTION_MS, MAX_EVENTS_PER_KEY, STATE_TTL_S,
            COVISIT_WINDOW_MS, COVISIT_SCAN, COVISIT_PREVIOUS, COVISIT_TTL_S,
            "\n".join(lines), "\n".join(upkeep),
            "\n".join(f"{item}\t{t}" for item, t in newest_by_item.items()),
        )  # fmt: skip
        return WritePlan(events, args)

    def _due_upkeep(self, families: Iterable[tuple[Callable[[str], str], dict[str, int]]]) -> list[str]:
        """'key\tnewest' for each written key not maintained by this process in the
        last MAINTAIN_EVERY_S (so always on a key's first write in a process)."""
        now = time.monotonic()
        maintained = self._maintained
        upkeep: list[str] = []
        for key_of, newest in families:
            for entity, t in newest.items():
                key = key_of(entity)
                if maintained.get_fresh(key, now) is None:
                    maintained.put(key, True, now)
                    upkeep.append(f"{key}\t{t}")
        return upkeep

    async def write(self, plan: WritePlan) -> int:
        """Write a prepared batch; returns the co-visit pairs counted."""
        if not plan.events:
            return 0
        if plan.args is None:
            await self._store.apply_events(plan.events)
            return await self._recall.apply_covisitation(plan.events)
        out = await self._apply(args=plan.args)
        await self._recall.trim([bytes(i).decode() for i in out[1:]])
        return int(out[0])
