"""The one write path for events: a batch into Redis, feature state and co-visitation together.

What is written comes from the repository (recmesh.features.repository): each
event goes into every stream of its user and item whose behaviours include
its own, with the member its stream's features need (compute.encode_member).
Nothing here is written per feature.

Event identity: an event id is written once per user. The first write of an
id adds it to `{u:<id>}:ids` (ZADD); an event whose id is already there
(a redelivery, or another event reusing the id) is dropped and counted
(`duplicates`), so a changed item or time cannot count twice either. The ids
set is kept as long as the longest state retention, so the rule holds while
the first event can still be read.

On a single Redis the whole batch is one script call: event identity, the
stream ZADDs, upkeep (trim to retention behind the key's newest event, cap,
TTL; at most once a minute per key per process), the `newest` index of item
'count' streams (look-ups read it instead of reading an event back), live
popularity when declared, and co-visitation counting for the events that were
new. Increments are summed per (item, neighbour) within the batch and sent
grouped by item key: one ZINCRBY per distinct pair.

Tiled streams (recmesh/features/tiles.py) keep per-tile integer components,
which a second write would add twice: the script skips the events at offsets
its topic's partitions have already applied and no newer than the newest event
applied there (`keys.applied`, written by the same call), so a batch delivered
again adds nothing at any age, while a newer event at a reused offset (a topic
deleted and made again) counts; event ids, kept `[state] dedup`, catch an app
sending the same event twice. A topic made again and refilled with *older*
events needs its `{ingest}:applied:<topic>` hash deleted first.

On a Redis Cluster a user's keys and each item's keys live in different
slots, so the same plan runs as pipelines of plain commands grouped per node:
(1) which ids are known, with the users' co-visit lists, (2) the stream writes
and upkeep of the new events (idempotent: identical members, ZADD GT), each
tiles key's increments in a single-key script that records the offsets it
applied per partition (in the same hash) and skips those already applied,
(3) their ids, (4) co-visitation and popularity counts. A crash between (2)
and (3) rewrites the same members and adds no tile twice on redelivery; one
between (3) and (4) loses that batch's counts rather than counting them twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from recmesh.cache import TtlCache
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.compute import encode_member
from recmesh.features.covisit import COVISIT_MAX_PER_ITEM, COVISIT_TTL_S, batch_pairs, pair_increments
from recmesh.features.plans import plans
from recmesh.features.repository import FIELD_SEP, VALUE_SEP, Entity, FeatureSet, Stream
from recmesh.features.tiles import LUA_TILES, components, retention_tiles, tile_field, tile_of
from recmesh.redis_client import AnyRedis
from services.feature.item_cache import change_message

_log = structlog.get_logger("writer")
ANNOUNCE_FAILED = Counter(
    "recmesh_ingest_items_changed_unpublished_total",
    "Batches whose changed item ids could not be published to the feature services.",
)

# How often one process trims and re-expires a key it keeps writing to.
MAINTAIN_EVERY_S = 60.0
# A cluster batch's per-key tile calls in flight at once (well under the pool of
# RECMESH_REDIS_MAX_CONNECTIONS per node, default 32).
TILE_CALLS_IN_FLIGHT = 8

# keys.applied's rule, for the write script and mark_applied: per partition the larger
# offset wins, and the newest event time applied only grows (-1: no event applied).
LUA_MARK_APPLIED = r"""
local function mark_applied(key, part, offset, newest)
  local cur = redis.call('HGET', key, part)
  local cur_offset, cur_newest = -1, -1
  if cur then
    local a, b = string.match(cur, '^(%d+):(%-?%d+)$')
    cur_offset, cur_newest = tonumber(a), tonumber(b)
  end
  if offset > cur_offset then
    if cur_newest > newest then newest = cur_newest end
    redis.call('HSET', key, part, string.format('%d:%d', offset, newest))
  end
end
"""

# ARGV: cap, covisit window_ms, scan, previous, ttl_s, covisit stream suffix
# ('' = none), events, upkeep, then the key parts (keys.WRITE_SCRIPT_PARTS: user
# and item prefix, ids and co-visits suffix).
# events: per event an 'E\t<user>\t<event id>\t<time>\t<item>\t<covisit 0|1>' line,
# then its writes: 'Z\t<key>\t<member>' (ZADD at the event's time), 'H\t<key>\t<item>'
# (ZADD GT: the user's history, the item's newest time),
# 'N\t<hash>\t<field>' (the newest index of the Z before it), 'P\t<key>\t<member>'
# (ZINCRBY 1), applied only when the event's id was new.
# upkeep: 'U\t<key>\t<newest>\t<retention_ms>\t<ttl_s>' (trim, cap, expire) or
# 'X\t<key>\t<ttl_s>' (expire) or 'C\t<key>\t<keep>\t<ttl_s>' (keep the newest, expire) or
# 'I\t<key>\t<newest>\t<retention_ms>' (trim an ids set).
# Returns {pairs counted, duplicates, redelivered}.
_APPLY_LUA = (
    LUA_TILES
    + LUA_MARK_APPLIED
    + r"""
local call = redis.call
local cap = tonumber(ARGV[1])
local window, scan, previous = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local covisit_ttl, covisit_suffix, covisit_cap = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[16])
local user_prefix, item_prefix, ids_suffix, covisits_suffix = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local newest, tiled, distinct = {}, {}, {}
-- Co-visitation: when an event is written, its item is paired with the user's earlier
-- distinct items in the window, read from the co-visit list (a distinct list: item ->
-- its latest time) before the event's own write to it (recmesh/features/covisit.py).
local counted, by = 0, {}
local function covisit(key, item, te)
  local members = call('ZREVRANGEBYSCORE', key, string.format('(%d', te), string.format('(%d', te - window),
                       'LIMIT', 0, previous + 1)
  local n = 0
  for _, other in ipairs(members) do
    if other ~= item and n < previous then
      n = n + 1
      local a = by[item]
      if a == nil then a = {}; by[item] = a end
      a[other] = (a[other] or 0) + 1
      local b = by[other]
      if b == nil then b = {}; by[other] = b end
      b[item] = (b[item] or 0) + 1
    end
  end
  counted = counted + n
end
-- ARGV[14]: the applied-offsets hash of the batch's topic ('' none), "<next offset>:<newest
-- event time>" per partition (which events were written before: see the 'E' lines);
-- ARGV[15]: the batch's marks, per line
-- '<partition>\t<next offset>\t<newest event time, -1 none>', set at the end
-- (keys.applied: the larger offset wins, the newest time only grows).
local applied_key, done, done_t, redelivered = ARGV[14], {}, {}, 0
if applied_key ~= '' then
  local held = call('HGETALL', applied_key)
  for i = 1, #held, 2 do
    local off, newest = string.match(held[i + 1], '^(%d+):(%-?%d+)$')
    done[held[i]], done_t[held[i]] = tonumber(off), tonumber(newest)
  end
end
-- ARGV[13]: the tiled streams' specs, one per line: '<windows in tiles, widest first,
-- comma-separated>|<retention in tiles>|<ttl s>|<cap of a distinct list>'.
local specs = {}
for line in string.gmatch(ARGV[13], '[^\n]+') do
  local ws, retention, ttl, cap = string.match(line, '^([^|]*)|(%d+)|(%d+)|(%d+)$')
  local windows = {}
  for n in string.gmatch(ws, '%d+') do windows[#windows + 1] = tonumber(n) end
  specs[#specs + 1] = {windows = windows, retention = tonumber(retention), ttl = tonumber(ttl),
                       cap = tonumber(cap)}
end
local dups, live, t, last_key = 0, false, 0, nil
for line in string.gmatch(ARGV[7], '[^\n]+') do
  local tag = string.sub(line, 1, 1)
  if tag == 'E' then
    local user, eid, time_, item, cv, part, off = string.match(
      line, '^E\t([^\t]+)\t([^\t]+)\t(%d+)\t([^\t]+)\t(%d)\t(%-?%d+)\t(%-?%d+)$')
    t = tonumber(time_)
    -- Below its partition's applied offset and no newer than what was applied there: written
    -- before. A newer event at such an offset means the offsets were reused (a topic
    -- deleted and created again, a broker without storage restarted): it is new.
    local prior = done[part]
    local ids = user_prefix .. user .. ids_suffix
    if prior ~= nil and tonumber(off) < prior and t <= done_t[part] then
      live = false
      redelivered = redelivered + 1
    else
      live = call('ZADD', ids, time_, eid) == 1
      if live then
        if cv == '1' then covisit(user_prefix .. user .. covisit_suffix, item, t) end
      else
        dups = dups + 1
      end
    end
  elseif live and tag == 'Z' then
    local key, member = string.match(line, '^Z\t([^\t]+)\t(.*)$')
    call('ZADD', key, t, member)
    last_key = key
  elseif live and tag == 'H' then
    local key, member = string.match(line, '^H\t([^\t]+)\t(.*)$')
    call('ZADD', key, 'GT', t, member)
  elseif live and tag == 'N' then
    local hash, fld = string.match(line, '^N\t([^\t]+)\t([^\t]+)$')
    local id = hash .. '\t' .. fld
    local held = newest[id]
    if held == nil then newest[id] = {hash, fld, last_key, t}
    elseif held[4] < t then held[4] = t end
  elseif live and tag == 'P' then
    local key, member = string.match(line, '^P\t([^\t]+)\t(.*)$')
    call('ZINCRBY', key, 1, member)
  elseif live and tag == 'T' then
    local key, spec, tile, parts = string.match(line, '^T\t([^\t]+)\t(%d+)\t(%-?%d+)\t(.*)$')
    local a = tiled[key]
    if a == nil then a = {spec = tonumber(spec), tiles = {}, top = nil, t = t}; tiled[key] = a end
    tile = tonumber(tile)
    local comps = a.tiles[tile]
    if comps == nil then comps = {}; a.tiles[tile] = comps end
    for comp, d in string.gmatch(parts, '([^\31\30]+)\31(%-?%d+)') do
      comps[comp] = (comps[comp] or 0) + tonumber(d)
    end
    if a.top == nil or tile > a.top then a.top = tile end
    if t > a.t then a.t = t end
  elseif live and tag == 'D' then
    local key, spec, member = string.match(line, '^D\t([^\t]+)\t(%d+)\t(.*)$')
    call('ZADD', key, 'GT', t, member)
    distinct[key] = tonumber(spec)
  end
end
-- Tiles: the batch's sums per tile and component added once per key; the window
-- totals (fields c, t, w of the same hash) moved forward and recomputed from the
-- tiles when the key's newest tile advances (old tiles trimmed then), else the
-- batch's tiles added to the windows that hold them (recmesh/features/tiles.py).
for key, a in pairs(tiled) do
  local spec = specs[a.spec]
  local cur = call('HMGET', key, NEWEST_TILE, NEWEST_TIME, TOTALS)
  local c, held_t = tonumber(cur[1]), tonumber(cur[2])
  for tile, comps in pairs(a.tiles) do
    for comp, d in pairs(comps) do call('HINCRBY', key, tile .. ':' .. comp, d) end
  end
  local newest_t = a.t
  if held_t ~= nil and held_t > newest_t then newest_t = held_t end
  if c == nil or a.top > c then
    local top = a.top
    local flat = call('HGETALL', key)
    local keep_from, old = top - spec.retention, {}
    for i = 1, #flat, 2 do
      local k = tonumber(string.match(flat[i], '^(%-?%d+):'))
      if k ~= nil and k < keep_from then old[#old + 1] = flat[i] end
    end
    for i = 1, #old, 1000 do call('HDEL', key, unpack(old, i, math.min(i + 999, #old))) end
    local totals = {}
    for w, n in ipairs(spec.windows) do
      local sums = sum_tiles(flat, top - n + 1, top)
      for comp, v in pairs(sums) do
        if v ~= 0 then totals[(w - 1) .. ':' .. comp] = v end
      end
    end
    call('HSET', key, NEWEST_TILE, top, NEWEST_TIME, newest_t, TOTALS, encode_totals(totals))
  else
    local totals, changed = decode_totals(cur[3]), false
    for tile, comps in pairs(a.tiles) do
      for w, n in ipairs(spec.windows) do
        if tile > c - n and tile <= c then
          for comp, d in pairs(comps) do
            local f = (w - 1) .. ':' .. comp
            totals[f] = (totals[f] or 0) + d
            changed = true
          end
        end
      end
    end
    local args = {}
    if changed then args = {TOTALS, encode_totals(totals)} end
    if held_t == nil or newest_t > held_t then args[#args + 1] = NEWEST_TIME; args[#args + 1] = newest_t end
    if #args > 0 then call('HSET', key, unpack(args)) end
  end
end
-- (their expiry is upkeep: 'X' lines when due)
for key, spec in pairs(distinct) do
  call('ZREMRANGEBYRANK', key, 0, -(specs[spec].cap + 1))
end
for line in string.gmatch(ARGV[8], '[^\n]+') do
  local tag = string.sub(line, 1, 1)
  if tag == 'U' then
    local key, t_max, retention, ttl = string.match(line, '^U\t([^\t]+)\t(%d+)\t(%d+)\t(%d+)$')
    call('ZREMRANGEBYSCORE', key, '-inf', string.format('(%d', tonumber(t_max) - tonumber(retention)))
    call('ZREMRANGEBYRANK', key, 0, -(cap + 1))
    call('EXPIRE', key, ttl)
  elseif tag == 'I' then
    local key, t_max, retention = string.match(line, '^I\t([^\t]+)\t(%d+)\t(%d+)$')
    call('ZREMRANGEBYSCORE', key, '-inf', string.format('(%d', tonumber(t_max) - tonumber(retention)))
  elseif tag == 'C' then
    local key, keep, ttl = string.match(line, '^C\t([^\t]+)\t(%d+)\t(%d+)$')
    call('ZREMRANGEBYRANK', key, 0, -(tonumber(keep) + 1))
    call('EXPIRE', key, ttl)
  else
    local key, ttl = string.match(line, '^X\t([^\t]+)\t(%d+)$')
    call('EXPIRE', key, ttl)
  end
end
-- The newest index of item 'count' streams. A missing field (new item,
-- evicted, state older than the index) is seeded from the sorted set this
-- batch wrote to, so it starts from the set's true newest event; a new hash
-- takes the set's expiry.
for _, n in pairs(newest) do
  local hash, fld, set, t_new = n[1], n[2], n[3], n[4]
  local held = tonumber(call('HGET', hash, fld))
  if held == nil then
    local top = call('ZREVRANGE', set, 0, 0, 'WITHSCORES')[2]
    if top ~= nil and tonumber(top) > t_new then t_new = tonumber(top) end
    local fresh_hash = call('EXISTS', hash) == 0
    call('HSET', hash, fld, string.format('%d', t_new))
    if fresh_hash then
      local pttl = call('PTTL', set)
      if pttl > 0 then call('PEXPIRE', hash, pttl) end
    end
  elseif t_new > held then
    call('HSET', hash, fld, string.format('%d', t_new))
  end
end
if applied_key ~= '' then
  for line in string.gmatch(ARGV[15], '[^\n]+') do
    local part, off, t_new = string.match(line, '^(%d+)\t(%d+)\t(%-?%d+)$')
    mark_applied(applied_key, part, tonumber(off), tonumber(t_new))
  end
end
local out = {counted, dups, redelivered}
for item, incs in pairs(by) do
  local key = item_prefix .. item .. covisits_suffix
  for other, k in pairs(incs) do call('ZINCRBY', key, k, other) end
  call('EXPIRE', key, covisit_ttl)
  -- kept to its strongest neighbours every batch: it stays small enough for Redis's compact encoding
  if call('ZCARD', key) > covisit_cap then call('ZREMRANGEBYRANK', key, 0, -(covisit_cap + 1)) end
end
return out
"""
)


def _applied_args(source: Source | None) -> tuple[str, str]:
    """The write script's ARGV[14] and ARGV[15]: the applied-offsets key and the batch's marks."""
    if source is None:
        return "", ""
    marks = "\n".join(f"{p}\t{o}\t{t}" for p, (o, t) in sorted(source.marks.items()))
    return keys.applied(source.topic), marks


Attributes = Callable[[Entity, Iterable[str]], Awaitable[dict[str, dict[str, str]]]]


# An event with its stream writes (key, member) and popularity increments (key, member).
_EventWrites = tuple[Event, list[tuple[str, str, Stream]], list[tuple[str, str]]]


@dataclass(frozen=True)
class Source:
    """Where a batch's events were read: its topic, each event's (partition, offset) in
    the batch's order, and per partition the next offset and newest event time
    (keys.applied's marks)."""

    topic: str
    positions: Sequence[tuple[int, int]]
    marks: Mapping[int, tuple[int, int]]


@dataclass
class PreparedBatch:
    """A batch ready to write: its events and, on a single Redis, the script's arguments."""

    events: Sequence[Event]
    args: tuple[int | str, ...] | None = None
    # where the events came from: (topic, each event's (partition, offset), the batch's
    # marks: partition -> (next offset, newest event time)); None: not from a topic
    source: Source | None = None
    # cluster path: per event, its writes
    writes: list[_EventWrites] = field(default_factory=list)
    upkeep: list[tuple[str, int, int, int]] = field(default_factory=list)
    # history keys (learnt retrieval's seeds) due a trim
    history_upkeep: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WriteResult:
    written: int  # events whose id was new
    duplicates: int  # dropped: their id was already written for the user
    covisit_pairs: int
    redelivered: int = 0  # dropped: their offset was already applied (an earlier write of their batch)


# keys.applied for a batch the write did not record (a cluster's, one without events):
# ARGV per partition: partition, next offset, newest event time (-1: none applied).
_MARK_APPLIED_LUA = (
    LUA_MARK_APPLIED
    + r"""
for i = 1, #ARGV, 3 do
  mark_applied(KEYS[1], ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
end
return 0
"""
)


# Cluster: one tiles key's increments (KEYS[1], which on a cluster also holds
# 'o:<partition>' -> '<next offset applied to this key>:<newest event time applied>'
# instead of the window totals). ARGV[1]: lines '<partition>\t<offset>\t<event time>\t<tile>\t<component>
# \x1f<delta>\x1e...' (-1 -1: not from a topic).
_TILE_ADD_LUA = r"""
local done, done_t, top, top_t = {}, {}, {}, {}
for line in string.gmatch(ARGV[1], '[^\n]+') do
  local part, off, t, tile, parts = string.match(line, '^(%-?%d+)\t(%-?%d+)\t(%d+)\t(%-?%d+)\t(.*)$')
  off, t = tonumber(off), tonumber(t)
  if done[part] == nil then
    local held = redis.call('HGET', KEYS[1], 'o:' .. part)
    local a, b = -1, -1
    if held then a, b = string.match(held, '^(%d+):(%-?%d+)$') end
    done[part], done_t[part] = tonumber(a), tonumber(b)
  end
  -- as the write script: below the offset applied and no newer than what was applied
  if off < 0 or off >= done[part] or t > done_t[part] then
    for comp, d in string.gmatch(parts, '([^\31\30]+)\31(%-?%d+)') do
      redis.call('HINCRBY', KEYS[1], tile .. ':' .. comp, d)
    end
    if off >= 0 then
      if top[part] == nil or off >= top[part] then top[part] = off + 1 end
      if top_t[part] == nil or t > top_t[part] then top_t[part] = t end
    end
  end
end
for part, next_off in pairs(top) do
  local t = math.max(top_t[part], done_t[part])
  redis.call('HSET', KEYS[1], 'o:' .. part, string.format('%d:%d', math.max(next_off, done[part]), t))
end
return 0
"""


class EventWriter:
    """Writes batches of events; idempotent under redelivery, one id counted once.

    `prepare` does the client-side work (attributes for enrichment, members,
    the script's argument), which does not depend on earlier batches being
    written, so the consumer runs it while the previous batch's write is in
    Redis; `write` sends it.
    """

    def __init__(
        self,
        client: AnyRedis,
        feature_set: FeatureSet,
        attributes: Attributes,
        cache_entries: int = 200_000,
        pipelined: bool | None = None,
    ) -> None:
        """`pipelined`: write with plain-command pipelines (default: on a Redis
        Cluster only; tests hold the two ways equal on a single Redis)."""
        self._redis = client
        self._feature_set = feature_set
        self._attributes = attributes
        self._cluster = isinstance(client, RedisCluster) if pipelined is None else pipelined
        # keys this process trimmed and re-expired in the last MAINTAIN_EVERY_S
        self._maintained: TtlCache[bool] = TtlCache(MAINTAIN_EVERY_S, cache_entries)
        self._trimmed: TtlCache[bool] = TtlCache(MAINTAIN_EVERY_S, cache_entries)
        self._apply = client.register_script(_APPLY_LUA)  # reloads it if the server lost it
        self._mark = client.register_script(_MARK_APPLIED_LUA)
        self._tile_add = client.register_script(_TILE_ADD_LUA)
        write = plans(feature_set).write
        self._covisit = write.covisit_stream
        self._ids = write.ids
        self._history = write.history_behaviors
        self._streams = write.streams
        self._need = write.attributes_needed
        # The tiled streams' specs in the script (ARGV[13]), numbered from 1.
        tiled = [s for e in ("user", "item") for s in write.streams[e] if s.tiled]
        self._spec = {(s.entity, s.id): n for n, s in enumerate(tiled, 1)}
        self._specs = "\n".join(
            ",".join(str(w // s.slide_ms) for w in s.windows) + f"|{retention_tiles(s)}|{s.ttl_s}|{s.scan}"
            if s.read == "tiles" else f"|0|{s.ttl_s}|{s.scan}"
            for s in tiled
        )  # fmt: skip

    async def mark_applied(self, topic: str, marks: Mapping[int, tuple[int, int]]) -> None:
        """Record how far the ingest has applied `topic` (keys.applied): per partition,
        the next offset and the newest event time written. Call after the batch's
        write and before committing its offsets."""
        argv = [str(x) for p, (offset, newest) in sorted(marks.items()) for x in (p, offset, newest)]
        if argv:
            await self._mark(keys=[keys.applied(topic)], args=argv)

    @property
    def marks_in_write(self) -> bool:
        """A batch prepared with its Source records its applied offsets in the same script
        call as its state (single Redis); on a cluster the caller marks them after."""
        return not self._cluster

    async def apply(self, events: Sequence[Event], source: Source | None = None) -> WriteResult:
        """Write `events` (sorted by event time)."""
        return await self.write(await self.prepare(events, source))

    async def _enrich(self, events: Sequence[Event]) -> dict[Entity, dict[str, dict[str, str]]]:
        out: dict[Entity, dict[str, dict[str, str]]] = {"user": {}, "item": {}}
        if self._need["user"]:
            out["user"] = await self._attributes("user", {e.user_id for e in events})
        if self._need["item"]:
            out["item"] = await self._attributes("item", {e.item_id for e in events})
        return out

    def _writes(
        self, ev: Event, attrs: dict[Entity, dict[str, dict[str, str]]]
    ) -> tuple[list[tuple[str, str, Stream]], list[tuple[str, str]]]:
        """The event's stream writes (key, member, stream) and its live popularity
        increments (key, member)."""
        zadds: list[tuple[str, str, Stream]] = []
        for entity, own, other, other_entity in (
            ("user", ev.user_id, ev.item_id, "item"), ("item", ev.item_id, ev.user_id, "user"),
        ):  # fmt: skip
            for s in self._streams[entity]:  # type: ignore[index]
                if ev.behavior in s.behaviors:
                    held = attrs[other_entity].get(other, {})  # type: ignore[index]
                    if s.read == "tiles":
                        parts = components(s, held, ev.values)
                        member = f"{tile_of(ev.event_time, s.slide_ms)}\t" + VALUE_SEP.join(
                            f"{c}{FIELD_SEP}{d}" for c, d in parts
                        )
                    elif s.read == "distinct":
                        member = other
                    else:
                        member = encode_member(s, ev.event_id, other, held, ev.values)
                    zadds.append((keys.stream(entity, own, s.id), member, s))
        pops: list[tuple[str, str]] = []
        roles = self._feature_set.roles
        if ev.behavior in roles.popularity_behaviors:
            pops.append((keys.POPULARITY, ev.item_id))
            if roles.category is not None:
                for cat in attrs["item"].get(ev.item_id, {}).get(roles.category, "").split(VALUE_SEP):
                    if cat:
                        pops.append((keys.category_popularity(cat), ev.item_id))
        return zadds, pops

    async def prepare(self, events: Sequence[Event], source: Source | None = None) -> PreparedBatch:
        """`source`: where `events` were read (the script then skips what an earlier write of
        the batch applied, and records the batch's offsets with its state)."""
        if not events:
            return PreparedBatch(events, source=source)
        attrs = await self._enrich(events)
        plan = PreparedBatch(events, source=source)
        lines: list[str] = []
        newest_of, stream_of = self._plan_events(events, attrs, plan, lines)
        plan.upkeep = self._due(newest_of, stream_of)
        if self._cluster:
            return plan
        # A user's event ids are trimmed to identity_ms behind the batch's newest every batch
        # (their bound is the dedup time, not a minute of traffic); the rest of their upkeep
        # (cap, expiry) once a minute like every key.
        ids_trims = [(k, t) for k, t in newest_of.items() if stream_of[k][0] is self._ids]
        plan.args = self._script_args(plan, lines, stream_of, ids_trims)
        return plan

    def _plan_events(
        self,
        events: Sequence[Event],
        attrs: dict[Entity, dict[str, dict[str, str]]],
        plan: PreparedBatch,
        lines: list[str],
    ) -> tuple[dict[str, int], dict[str, tuple[Stream, str]]]:
        """Each event's writes, into `plan.writes` (cluster) or the script's `lines`, and
        its history key's upkeep; (key -> newest event time written to it in this batch,
        key -> (stream, entity id))."""
        newest_of: dict[str, int] = {}
        stream_of: dict[str, tuple[Stream, str]] = {}
        cv_behaviors = self._feature_set.roles.covisit_behaviors
        positions = plan.source.positions if plan.source is not None else [(-1, -1)] * len(events)
        for ev, (part, offset) in zip(events, positions, strict=True):
            zadds, pops = self._writes(ev, attrs)
            t = ev.event_time
            if self._cluster:
                plan.writes.append((ev, zadds, pops))
            else:
                cv = "1" if self._covisit and ev.behavior in cv_behaviors else "0"
                lines.append(f"E\t{ev.user_id}\t{ev.event_id}\t{t}\t{ev.item_id}\t{cv}\t{part}\t{offset}")
                self._script_lines(ev, zadds, pops, lines)
            if ev.behavior in self._history:
                hkey = keys.user_history(ev.user_id)
                if not self._cluster:
                    lines.append(f"H\t{hkey}\t{ev.item_id}")
                if self._maintained.get_fresh(hkey) is None:
                    self._maintained.put(hkey, True)
                    plan.history_upkeep.append(hkey)
            for key, _, s in zadds:
                if newest_of.get(key, -1) < t:
                    newest_of[key] = t
                    stream_of[key] = (s, ev.user_id if s.entity == "user" else ev.item_id)
            ids = keys.user_ids(ev.user_id)
            if newest_of.get(ids, -1) < t:
                newest_of[ids] = t
                stream_of[ids] = (self._ids, ev.user_id)
        return newest_of, stream_of

    def _script_lines(
        self, ev: Event, zadds: list[tuple[str, str, Stream]], pops: list[tuple[str, str]], lines: list[str]
    ) -> None:
        """The script's lines for one event's writes (after its 'E' line)."""
        for key, member, s in zadds:
            if s.tiled:
                tag = "T" if s.read == "tiles" else "D"
                lines.append(f"{tag}\t{key}\t{self._spec[s.entity, s.id]}\t{member}")
                continue
            lines.append(f"Z\t{key}\t{member}")
            if s.read == "count":
                lines.append(f"N\t{keys.newest('item', ev.item_id)}\t{s.id}")
        lines.extend(f"P\t{key}\t{member}" for key, member in pops)

    def _script_args(
        self,
        plan: PreparedBatch,
        lines: list[str],
        stream_of: dict[str, tuple[Stream, str]],
        ids_trims: list[tuple[str, int]],
    ) -> tuple[int | str, ...]:
        """The write script's arguments: the event lines and the upkeep lines."""
        up_lines: list[str] = []
        for k, t, ret, ttl in plan.upkeep:
            read = stream_of[k][0].read
            if read in ("tiles", "distinct"):  # trimmed (tiles) or capped (lists) by the script; expires
                up_lines.append(f"X\t{k}\t{ttl}")
            else:
                up_lines.append(f"U\t{k}\t{t}\t{ret}\t{ttl}")
        up_lines.extend(f"I\t{k}\t{t}\t{self._ids.retention_ms}" for k, t in ids_trims)
        count_hashes: dict[str, int] = {}  # item newest hash -> the ttl of its count streams
        for key, _, _, ttl in plan.upkeep:
            s, entity_id = stream_of[key]
            if s.read == "count":
                h = keys.newest(s.entity, entity_id)
                count_hashes[h] = max(count_hashes.get(h, 0), ttl)
        up_lines.extend(f"X\t{h}\t{ttl}" for h, ttl in count_hashes.items())
        roles = self._feature_set.roles
        up_lines.extend(f"C\t{k}\t{roles.history_cap}\t{roles.history_ttl_s}" for k in plan.history_upkeep)
        r = self._feature_set.roles
        return (
            self._feature_set.max_events_per_key,
            r.covisit_window_ms, r.covisit_scan, r.covisit_previous, COVISIT_TTL_S,
            keys.stream_suffix(self._covisit) if self._covisit else "",
            "\n".join(lines), "\n".join(up_lines), *keys.WRITE_SCRIPT_PARTS, self._specs,
            *_applied_args(plan.source), COVISIT_MAX_PER_ITEM,
        )  # fmt: skip

    def _due(
        self, newest_of: dict[str, int], stream_of: dict[str, tuple[Stream, str]]
    ) -> list[tuple[str, int, int, int]]:
        """(key, newest, retention_ms, ttl_s) for each written key not maintained by
        this process in the last MAINTAIN_EVERY_S (so always on a key's first write)."""
        now = time.monotonic()
        out = []
        for key, t in newest_of.items():
            s, _ = stream_of[key]
            # keys that expire within two upkeep periods are re-expired every batch
            if self._maintained.get_fresh(key, now) is None or s.ttl_s < 2 * MAINTAIN_EVERY_S:
                self._maintained.put(key, True, now)
                out.append((key, t, s.retention_ms, s.ttl_s))
        return out

    async def write(self, plan: PreparedBatch) -> WriteResult:
        """Write a prepared batch."""
        if not plan.events:
            return WriteResult(0, 0, 0)
        if plan.args is None:
            result = await self._write_cluster(plan)
        else:
            out = await self._apply(args=plan.args)
            dups, again = int(out[1]), int(out[2])
            result = WriteResult(len(plan.events) - dups - again, dups, int(out[0]), again)
        await self._announce(plan.events)
        return result

    async def _announce(self, events: Sequence[Event]) -> None:
        """Tell feature services which items changed, after the write (their held
        reads of those items are dropped). Not delivered: they serve what they
        hold for at most their bound (services/feature/item_cache.py)."""
        try:
            await self._redis.publish(keys.ITEMS_CHANGED, change_message([e.item_id for e in events]))
        except (RedisError, OSError) as err:
            ANNOUNCE_FAILED.inc()
            _log.warning("items_changed_not_published", error=repr(err), events=len(events))

    async def _write_cluster(self, plan: PreparedBatch) -> WriteResult:
        fresh, held = await self._fresh_writes(plan)
        dups = len(plan.writes) - len(fresh)
        if not fresh:
            return WriteResult(0, dups, 0)
        await self._write_streams(plan, fresh)
        await self._write_ids(plan, fresh)
        pairs = await self._write_counts(fresh, held)
        return WriteResult(len(fresh), dups, pairs)

    async def _fresh_writes(
        self, plan: PreparedBatch
    ) -> tuple[list[_EventWrites], dict[str, dict[str, int]]]:
        """(1) The writes of the events whose id is not known (the first of a repeated id
        in the batch wins), and the co-visit lists of their users as they were (user ->
        item -> latest time) for co-visitation to read as the script does."""
        r = self._feature_set.roles
        pipe = self._redis.pipeline(transaction=False)
        for ev, _, _ in plan.writes:
            pipe.zscore(keys.user_ids(ev.user_id), ev.event_id)
        cv_users = (
            sorted({ev.user_id for ev, _, _ in plan.writes if ev.behavior in r.covisit_behaviors})
            if r.covisit_stream
            else []
        )
        for user in cv_users:
            pipe.zrange(keys.stream("user", user, r.covisit_stream or ""), 0, -1, withscores=True)
        out = await pipe.execute()
        known = out[: len(plan.writes)]
        held = {
            user: {bytes(m).decode(): int(sc) for m, sc in lst}
            for user, lst in zip(cv_users, out[len(plan.writes) :], strict=True)
        }
        fresh: list[_EventWrites] = []
        seen: set[tuple[str, str]] = set()
        for (ev, zadds, pops), score in zip(plan.writes, known, strict=True):
            ident = (ev.user_id, ev.event_id)
            if score is None and ident not in seen:
                fresh.append((ev, zadds, pops))
            seen.add(ident)
        return fresh, held

    async def _write_streams(self, plan: PreparedBatch, fresh: list[_EventWrites]) -> None:
        """(2) Stream writes and upkeep (the ids sets' upkeep once they are written)."""
        feature_set = self._feature_set
        pipe = self._redis.pipeline(transaction=False)
        tiled: dict[str, Stream] = {}
        tile_lines: dict[str, list[str]] = {}
        source = plan.source
        at = {id(ev): pos for ev, pos in zip(plan.events, source.positions, strict=True)} if source else {}
        for ev, zadds, _ in fresh:
            for key, member, s in zadds:
                if s.read == "tiles":  # a cluster reads tiles from the tiles hash alone (no totals)
                    part, offset = at.get(id(ev), (-1, -1))
                    tile_lines.setdefault(key, []).append(f"{part}\t{offset}\t{ev.event_time}\t{member}")
                    tiled[key] = s
                elif s.read == "distinct":
                    pipe.zadd(key, {member: ev.event_time}, gt=True)
                    tiled[key] = s
                else:
                    pipe.zadd(key, {member: ev.event_time})
            if ev.behavior in self._history:
                pipe.zadd(keys.user_history(ev.user_id), {ev.item_id: ev.event_time}, gt=True)
        for hkey in plan.history_upkeep:
            pipe.zremrangebyrank(hkey, 0, -(feature_set.roles.history_cap + 1))
            pipe.expire(hkey, feature_set.roles.history_ttl_s)
        self._queue_upkeep(pipe, [u for u in plan.upkeep if not keys.is_user_ids(u[0]) and u[0] not in tiled])
        for key, s in tiled.items():
            if s.read == "distinct":
                pipe.zremrangebyrank(key, 0, -(s.scan + 1))
            pipe.expire(key, s.ttl_s)
        # Each tiles key's increments in one call of its own (its slot), skipping the events
        # at offsets it already applied: a crash before the ids are written adds nothing twice.
        # Before the pipeline, whose expiries then reach the keys they create. At most
        # TILE_CALLS_IN_FLIGHT at once: a cluster client refuses a call beyond its pool
        # (MaxConnectionsError) rather than queue it, and a batch touches hundreds of keys.
        gate = asyncio.Semaphore(TILE_CALLS_IN_FLIGHT)

        async def add(key: str, lines: list[str]) -> None:
            async with gate:
                await self._tile_add(keys=[key], args=["\n".join(lines)])

        await asyncio.gather(*(add(k, lines) for k, lines in tile_lines.items()))
        await pipe.execute()
        await self._trim_tiles({k: s for k, s in tiled.items() if s.read == "tiles"})

    async def _trim_tiles(self, tiled: Mapping[str, Stream]) -> None:
        """Cluster: drop tiles older than their stream's retention behind the key's newest
        tile, at most once a minute per key and process (the script does it as it goes)."""
        now = time.monotonic()
        due = [k for k in tiled if self._trimmed.get_fresh(k, now) is None]
        if not due:
            return
        for k in due:
            self._trimmed.put(k, True, now)
        pipe = self._redis.pipeline(transaction=False)
        for k in due:
            pipe.hkeys(k)
        held = await pipe.execute()
        pipe = self._redis.pipeline(transaction=False)
        for k, fields in zip(due, held, strict=True):
            # the tile fields ('<k>:<component>'), not the offsets applied ('o:<partition>')
            tiles = [(f, t) for f in fields if (t := tile_field(bytes(f))) is not None]
            if tiles:
                keep_from = max(t for _, t in tiles) - retention_tiles(tiled[k])
                old = [f for f, t in tiles if t < keep_from]
                if old:
                    pipe.hdel(k, *old)
        if len(pipe):
            await pipe.execute()

    async def _write_ids(self, plan: PreparedBatch, fresh: list[_EventWrites]) -> None:
        """(3) The ids."""
        ids_upkeep = [u for u in plan.upkeep if keys.is_user_ids(u[0])]
        pipe = self._redis.pipeline(transaction=False)
        for ev, _, _ in fresh:
            pipe.zadd(keys.user_ids(ev.user_id), {ev.event_id: ev.event_time})
        self._queue_upkeep(pipe, ids_upkeep)
        await pipe.execute()

    async def _write_counts(self, fresh: list[_EventWrites], held: dict[str, dict[str, int]]) -> int:
        """(4) Co-visit and popularity counts; the number of co-visit pairs."""
        r = self._feature_set.roles
        visits = [
            (ev.user_id, ev.item_id, ev.event_time)
            for ev, _, _ in fresh
            if ev.behavior in r.covisit_behaviors
        ]
        pairs = batch_pairs(visits, held, r.covisit_window_ms, r.covisit_previous) if r.covisit_stream else []
        increments = pair_increments(pairs)
        pipe = self._redis.pipeline(transaction=False)
        for item_id, counts in increments.items():
            key = keys.item_covisits(item_id)
            for other, by in counts.items():
                pipe.zincrby(key, by, other)
            pipe.expire(key, COVISIT_TTL_S)
        for _, _, pops in fresh:
            for key, member in pops:
                pipe.zincrby(key, 1, member)
        self._queue_trims(pipe, increments)
        if len(pipe):
            await pipe.execute()
        return len(pairs)

    def _queue_upkeep(self, pipe: Any, upkeep: Iterable[tuple[str, int, int, int]]) -> None:
        for key, t, retention, ttl in upkeep:
            pipe.zremrangebyscore(key, "-inf", f"({t - retention}")
            pipe.zremrangebyrank(key, 0, -(self._feature_set.max_events_per_key + 1))
            pipe.expire(key, ttl)

    def _queue_trims(self, pipe: Any, item_ids: Iterable[str]) -> int:
        """Trim each co-visit count key to its bound at most once a minute per process."""
        now = time.monotonic()
        queued = 0
        for item_id in item_ids:
            key = keys.item_covisits(item_id)
            if self._trimmed.get_fresh(key, now) is None:
                self._trimmed.put(key, True, now)
                pipe.zremrangebyrank(key, 0, -(COVISIT_MAX_PER_ITEM + 1))
                queued += 1
        return queued
