"""Feature state in Redis as look-ups read it.

Real-time state is kept as raw events in per-entity, per-stream sorted sets
scored by event time (recmesh.features.repository.Stream; written by the one
write path, services/feature/writer.py), and every window is computed at read
time as of the request's logical timestamp, with the aggregations of
recmesh.features.compute that the offline replay uses too. That makes windows
exact, lets late events land where they belong, and makes redelivery harmless.
What is read, and how, comes from the repository's FeatureSet: nothing here
names a feature.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from recmesh.features import keys, tiles
from recmesh.features.compute import StreamEvent, aggregate, count_columns
from recmesh.features.plans import plans
from recmesh.features.repository import Entity, FeatureSet, FeatureValue, Stream
from recmesh.features.tiles import LUA_TILES
from recmesh.features.wire import Column
from recmesh.redis_client import AnyRedis
from services.feature.item_cache import ItemReadCache
from services.feature.offline_cache import DEFAULT, OFFLINE, ItemStatic, OfflineCache

_log = structlog.get_logger("recmesh.feature.store")

# Window counts and newest event times of the items' 'count' streams, and the
# members of their other streams, in one command. ARGV = hi (as-of), the plan
# ('C|<stream>|<lo>,<lo>...' for a count stream, widest window first;
# 'R|<stream>|<lo>' for a stream read whole; ';'-separated), one blob of
# newline-separated item ids, then the key parts (keys.ITEM_SCRIPT_PARTS). The
# reply is flat, per item and stream in plan order: for a count stream one count
# per window and the newest event time in the widest window (-1 none); for
# another stream one nested [member, score, ...] list. The script builds the
# item keys itself (passing 600 key names cost more to pack than the look-up
# itself), so it is for a single Redis only; on a cluster the store reads with
# plain commands. Newest times come from the item's `newest` hash (kept by the
# ingest write) when they lie in the window: one HMGET, where reading an event
# back from each sorted set cost about half the script. A missing or disagreeing
# entry is read from the set.
_ITEM_WINDOWS_LUA = (
    LUA_TILES
    + """
local call = redis.call
local hi = ARGV[1]
local hi_n = tonumber(hi)
local item_prefix, stream_part, newest_suffix = ARGV[4], ARGV[5], ARGV[6]
local specs = {}
for spec in string.gmatch(ARGV[2], '[^;]+') do
  local kind, sid, los = string.match(spec, '^(%a)|([^|]+)|(.*)$')
  local s = {kind = kind, count = kind == 'C', sid = sid, suffix = stream_part .. sid, los = {}}
  if kind == 'T' then
    -- tiles: the as-of tile, then each window's length in tiles
    local q, ns = string.match(los, '^(%-?%d+)|(.*)$')
    s.q, s.ns = tonumber(q), {}
    for n in string.gmatch(ns, '%d+') do s.ns[#s.ns + 1] = tonumber(n) end
  elseif kind == 'D' then
    local lo, cap = string.match(los, '^(%-?%d+)|(%d+)$')
    s.widest, s.cap = '(' .. lo, tonumber(cap)
  else
    for lo in string.gmatch(los, '[^,]+') do s.los[#s.los + 1] = '(' .. lo end
    s.lo_n = tonumber(string.sub(s.los[1], 2))
    s.widest = s.los[1]
    s.windows = #s.los
  end
  specs[#specs + 1] = s
end
-- A tiled stream's windows as of tile q: the totals (fields c, t, w of the tiles hash)
-- when its newest tile is q, else summed from the tiles. Reply: {'t', newest time,
-- '<w>@', newest non-empty tile of window w, '<w>:<component>', total, ...}.
local function tiled(key, s)
  local held = call('HMGET', key, NEWEST_TILE, NEWEST_TIME, TOTALS)
  local c, t = tonumber(held[1]), held[2]
  if c == nil then return {} end
  local out = {'t', t}
  if c == s.q then
    for f, v in pairs(decode_totals(held[3])) do out[#out + 1] = f; out[#out + 1] = v end
    for w = 1, #s.ns do out[#out + 1] = (w - 1) .. '@'; out[#out + 1] = c end
    return out
  end
  if c < s.q and s.q - c >= s.ns[1] then return out end
  local flat = call('HGETALL', key)
  for w, n in ipairs(s.ns) do
    local totals, newest = sum_tiles(flat, s.q - n + 1, s.q)
    for comp, v in pairs(totals) do out[#out + 1] = (w - 1) .. ':' .. comp; out[#out + 1] = v end
    out[#out + 1] = (w - 1) .. '@'; out[#out + 1] = newest
  end
  return out
end
local nspec = #specs
local out, n = {}, 0
-- No table is made per item (a look-up of hundreds of items would feed Lua's
-- collector for nothing), and one GET per item answers every count stream's
-- newest time: an HMGET (a reply table per item) and an HGET per stream were
-- measured slower, 1,102 and 1,013 us a call against this script's.
for id in string.gmatch(ARGV[3], '[^\\n]+') do
  local prefix = item_prefix .. id
  local newest_key = nil
  for j = 1, nspec do
    local s = specs[j]
    local key = prefix .. s.suffix
    if s.kind == 'T' then
      n = n + 1
      out[n] = tiled(key, s)
    elseif s.kind == 'D' then
      n = n + 1
      out[n] = call('ZREVRANGEBYSCORE', key, hi, s.widest, 'WITHSCORES', 'LIMIT', 0, s.cap)
    elseif s.count then
      local widest = call('ZCOUNT', key, s.widest, hi)
      n = n + 1
      out[n] = widest
      for w = 2, s.windows do
        n = n + 1
        out[n] = widest > 0 and call('ZCOUNT', key, s.los[w], hi) or 0
      end
      local t = -1
      if widest > 0 then
        if newest_key == nil then newest_key = prefix .. newest_suffix end
        t = tonumber(call('HGET', newest_key, s.sid))
        -- Events in the window imply a newest one inside it; an entry that says
        -- otherwise is not trusted.
        if t == nil or t > hi_n or t <= s.lo_n then
          t = tonumber(call('ZREVRANGEBYSCORE', key, hi, s.widest, 'WITHSCORES', 'LIMIT', 0, 1)[2])
        end
      end
      n = n + 1
      out[n] = t
    else
      n = n + 1
      out[n] = call('ZRANGEBYSCORE', key, s.widest, hi, 'WITHSCORES')
    end
  end
end
return out
"""
)

Values = dict[str, tuple[FeatureValue, str, int]]  # name -> (value, source, age_ms)


@dataclass(slots=True)
class StreamRead:
    """One item stream read for many items: a count stream's counts per window
    (widest first) and newest event time (-1 none) per item; another stream's
    events per item."""

    counts: list[list[int]] = field(default_factory=list)
    newest: list[int] = field(default_factory=list)
    events: list[list[StreamEvent]] = field(default_factory=list)
    # a tiled stream's values per item: feature -> (value, age)
    values: list[dict[str, tuple[FeatureValue, int]]] = field(default_factory=list)

    def reorder(self, order: list[int]) -> StreamRead:
        return StreamRead(
            [[c[i] for i in order] for c in self.counts],
            [self.newest[i] for i in order] if self.newest else [],
            [self.events[i] for i in order] if self.events else [],
            [self.values[i] for i in order] if self.values else [],
        )


ItemWindows = list[StreamRead]  # per item stream, in read order

REALTIME = "realtime"  # a value computed from the streams (OFFLINE, DEFAULT: offline_cache)


@dataclass
class Lookup:
    user: Values
    item_columns: dict[str, Column]  # feature -> values for the items, in request order
    degraded: list[str] = field(default_factory=list)

    @property
    def items(self) -> list[Values]:
        """The items row by row (tests, tools); the server sends `item_columns`."""
        cols = self.item_columns.items()
        n = len(next(iter(self.item_columns.values())).values) if self.item_columns else 0
        return [{name: (c.values[i], c.sources[i], c.ages[i]) for name, c in cols} for i in range(n)]


def _events(raw: Sequence[tuple[bytes, float]], newest_first: bool) -> list[StreamEvent]:
    events = [(int(t), m.decode()) for m, t in raw]
    if newest_first:
        events.reverse()
    return events


class FeatureStore:
    """Look-ups of one user and many items as of one logical time. Offline
    features come through `offline` (its cache, vouched for by the statics
    version the look-up reads in the same round trip), which also answers the
    write path's enrichment."""

    def __init__(
        self,
        client: AnyRedis,
        feature_set: FeatureSet,
        *,
        offline: OfflineCache | None = None,
        item_reads: ItemReadCache | None = None,
    ) -> None:
        """`offline`: the offline-feature cache (default: one on `client` with its default TTLs);
        `item_reads`: items' held real-time reads (default: none held)."""
        self._redis = client
        self._feature_set = feature_set
        self._plan = plans(feature_set).read
        self._cluster = isinstance(client, RedisCluster)
        self.offline = offline or OfflineCache(client, feature_set)
        self._item_sha: str | None = None
        # Items' real-time reads, held while the ingest says nothing changed (off: bound 0).
        self._item_reads = item_reads or ItemReadCache(0)

    @property
    def item_reads(self) -> ItemReadCache:
        return self._item_reads

    @property
    def client(self) -> AnyRedis:
        return self._redis

    @property
    def feature_set(self) -> FeatureSet:
        return self._feature_set

    async def applied(self, topic: str, timeout_s: float) -> dict[int, tuple[int, int]] | None:
        """How far the ingest had applied `topic` (keys.applied), or None when it
        cannot be read in `timeout_s` (the served row then goes without it)."""
        try:
            async with asyncio.timeout(timeout_s):
                raw = await self._redis.hgetall(keys.applied(topic))
        except (RedisError, OSError, TimeoutError):
            return None
        return keys.parse_applied(raw)

    async def prepare(self) -> None:
        if not self._cluster:
            self._item_sha = await self._redis.script_load(_ITEM_WINDOWS_LUA)
        await self.offline.prepare()

    async def aclose(self) -> None:
        """Stop the store's background work; before its Redis client closes."""
        await self.offline.aclose()

    def _with_defaults(
        self,
        entity: Entity,
        realtime: dict[str, tuple[FeatureValue, int]] | None,
        offline: dict[str, Any] | None,
    ) -> Values:
        rt_defs, off_defs = self._plan.realtime_defaults[entity], self._plan.offline_defaults[entity]
        out: Values = {}
        for name, default in rt_defs:
            if realtime is not None and name in realtime:
                value, age = realtime[name]
                out[name] = (value, REALTIME, age)
            else:
                out[name] = (default, DEFAULT, -1)
        for name, default in off_defs:
            if offline is not None and name in offline:
                out[name] = (offline[name], OFFLINE, -1)
            else:
                out[name] = (default, DEFAULT, -1)
        return out

    def _item_columns(
        self, windows: ItemWindows | None, statics: Sequence[ItemStatic | None], as_of_ms: int
    ) -> dict[str, Column]:
        """Item features column by column, in declaration order; `windows` None
        means the real-time store was not reached (defaults). A default can be
        shared between rows (columns are read-only downstream)."""
        plan = self._plan
        rt_defs, off_defs = plan.realtime_defaults["item"], plan.offline_defaults["item"]
        n = len(statics)
        cols: dict[str, Column] = {}
        if windows is None:
            for name, default in rt_defs:
                cols[name] = Column([default] * n, [DEFAULT] * n, [-1] * n)
        else:
            computed: dict[str, Column] = {}
            realtime = [REALTIME] * n
            for s, data in zip(plan.item_streams, windows, strict=True):
                if s.read == "count":
                    for name, (vals, ages) in count_columns(s, data.counts, data.newest, as_of_ms).items():
                        computed[name] = Column(vals, realtime, ages)
                    continue
                if s.tiled:
                    for f in s.features:
                        pairs = [row[f.name] for row in data.values]
                        computed[f.name] = Column([v for v, _ in pairs], realtime, [a for _, a in pairs])
                    continue
                layout = plan.layouts[("item", s.id)]
                for f in s.features:
                    pairs = [aggregate(f, layout, evs, as_of_ms) for evs in data.events]
                    computed[f.name] = Column([v for v, _ in pairs], realtime, [a for _, a in pairs])
            for name, _ in rt_defs:
                cols[name] = computed[name]
        no_age = [-1] * n
        no_static = self.offline.no_item_static
        rows = [no_static if s is None else s for s in statics]
        # Transpose the cached rows: one zip for all offline features.
        values: Iterable[tuple[Any, ...]] = (
            zip(*[r.values for r in rows], strict=True) if n else [()] * len(off_defs)
        )
        sources: Iterable[tuple[Any, ...]] = (
            zip(*[r.sources for r in rows], strict=True) if n else [()] * len(off_defs)
        )
        for (name, _), column, srcs in zip(off_defs, values, sources, strict=True):
            cols[name] = Column(list(column), list(srcs), no_age)
        return cols

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    # --- reads --------------------------------------------------------------

    async def popular(self, limit: int) -> list[tuple[str, float]]:
        raw = await self._redis.zrevrange(keys.POPULARITY, 0, limit - 1, withscores=True)
        return [(bytes(m).decode(), float(sc)) for m, sc in cast(list[tuple[bytes, float]], raw)]

    async def lookup(
        self, user_id: str, item_ids: Sequence[str], as_of_ms: int, timeout_s: float, with_user: bool = True
    ) -> Lookup:
        """Features of one user and the items, as of `as_of_ms`, in one Redis round trip.

        When the round trip fails or exceeds `timeout_s`, real-time features take
        their defaults and offline features come from the in-process cache (stale
        if need be); the reason is in `degraded`. `with_user=False` reads the
        items only (the caller has the user's features): `user` is empty.
        """
        now = time.monotonic()
        offline = self.offline
        profile, statics_held, static_missing = offline.held(user_id, item_ids, with_user, now)
        try:
            async with asyncio.timeout(timeout_s):
                results = await self._read(
                    user_id, item_ids, static_missing, with_user, with_user and profile is None, as_of_ms
                )
        except (TimeoutError, RedisError, OSError) as err:
            reason = (
                "realtime_store_timeout" if isinstance(err, TimeoutError) else "realtime_store_unavailable"
            )
            _log.warning("feature_fallback", reason=reason, error=repr(err))
            user = self._with_defaults("user", None, offline.stale_profile(user_id)) if with_user else {}
            stale = offline.stale_items(item_ids)
            return Lookup(user, self._item_columns(None, stale, as_of_ms), [reason])
        version, user_raw, profile_raw, item_windows, statics = results
        offline.observe_version(version, now)
        if profile_raw is not None:
            profile = offline.put_profile(user_id, profile_raw, now)
        if static_missing:
            statics_held = offline.put_items(item_ids, statics_held, static_missing, statics, now)
        items = self._item_columns(item_windows, statics_held, as_of_ms)
        if not with_user:
            return Lookup({}, items)
        return Lookup(self._with_defaults("user", self._user_realtime(user_raw, as_of_ms), profile), items)

    def _user_realtime(self, user_raw: list[Any], as_of_ms: int) -> dict[str, tuple[FeatureValue, int]]:
        out: dict[str, tuple[FeatureValue, int]] = {}
        plan = self._plan
        exact_raw, tiled_raw = user_raw
        for s, raw in zip(plan.user_exact, exact_raw, strict=True):
            events = _events(raw, newest_first=s.read == "latest")
            layout = plan.layouts[("user", s.id)]
            for f in s.features:
                out[f.name] = aggregate(f, layout, events, as_of_ms)
        for s, raw in zip(plan.user_tiled, tiled_raw, strict=True):
            out.update(_tiled_values(s, raw, as_of_ms, self._cluster))
        return out

    async def read_raw(self, user_id: str, item_ids: Sequence[str], as_of_ms: int) -> None:
        """The look-up's Redis round trip alone, without decoding or held item reads (a
        benchmark baseline)."""
        await self._read(user_id, item_ids, [], True, False, as_of_ms, held=False)

    async def _read(
        self,
        user_id: str,
        item_ids: Sequence[str],
        static_missing: list[str],
        want_user: bool,
        want_profile: bool,
        as_of_ms: int,
        held: bool = True,
    ) -> tuple[bytes | None, list[Any], Any, ItemWindows, list[Any]]:
        if self._item_sha is None and not self._cluster:
            await self.prepare()
        plan = self._plan
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(keys.STATICS_VERSION)
        user_exact = plan.user_exact if want_user else ()
        user_tiled = plan.user_tiled if want_user else ()
        self._queue_user(pipe, user_id, user_exact, user_tiled, as_of_ms)
        if want_profile:
            pipe.hgetall(keys.user_profile(user_id))
        unique = list(dict.fromkeys(item_ids))
        streams = plan.item_streams
        if self._cluster:
            # redis-py refuses scripts in cluster pipelines; plain commands are
            # grouped per node, one round trip per node in parallel.
            _queue_cluster_item_reads(pipe, unique, streams, as_of_ms)
        to_read = unique
        if not self._cluster and unique and streams:
            read_at = time.monotonic()
            hits, to_read = self._item_reads.get(unique, as_of_ms, read_at) if held else ({}, unique)
            if to_read:
                script = self._item_sha
                assert script is not None  # loaded by prepare() (lookup checks it above)
                pipe.evalsha(
                    script, 0, as_of_ms, plan.item_spec(as_of_ms), "\n".join(to_read),
                    *keys.ITEM_SCRIPT_PARTS,
                )  # fmt: skip
        for iid in static_missing:
            pipe.hgetall(keys.item_static(iid))
        try:
            out = await pipe.execute()
        except NoScriptError:
            # The server lost its script cache (restart, failover): load and retry once.
            await self.prepare()
            return await self._read(
                user_id, item_ids, static_missing, want_user, want_profile, as_of_ms, held
            )
        version, rest = out[0], out[1:]
        exact_raw = [rest.pop(0) for _ in user_exact]
        # the script's reply holds every tiled stream; a cluster reads each with a command
        tiled_raw = [rest.pop(0) for _ in user_tiled] if self._cluster else rest.pop(0) if user_tiled else []
        user_raw: list[Any] = [exact_raw, tiled_raw]
        profile_raw = rest.pop(0) if want_profile else None
        if not self._cluster and unique and streams:
            rest.insert(
                0, self._with_held(unique, to_read, hits, rest.pop(0) if to_read else [], as_of_ms, read_at)
            )
        windows = self._item_windows(unique, item_ids, rest, as_of_ms)
        return version, user_raw, profile_raw, windows, rest

    def _queue_user(
        self, pipe: Any, user_id: str, exact: Sequence[Stream], tiled: Sequence[Stream], as_of_ms: int
    ) -> None:
        """The user's stream reads: exact streams with plain commands, tiled ones with the
        item script under the user's prefix (on a cluster, with plain commands too)."""
        _queue_user_reads(pipe, user_id, exact, as_of_ms)
        if not tiled:
            return
        if self._cluster:
            _queue_cluster_tiled_reads(pipe, "user", user_id, tiled, as_of_ms)
            return
        assert self._item_sha is not None  # loaded by prepare() (_read checks it first)
        pipe.evalsha(
            self._item_sha, 0, as_of_ms, self._plan.user_spec(as_of_ms), user_id, keys.PREFIX["user"],
            *keys.ITEM_SCRIPT_PARTS[1:],
        )  # fmt: skip

    def _with_held(
        self,
        unique: list[str],
        read: list[str],
        hits: dict[str, Sequence[Any]],
        flat: list[Any],
        as_of_ms: int,
        read_at: float,
    ) -> list[Any]:
        """The script's reply for all of `unique`: what it read for `read` (held for
        later look-ups) and the held values of the others, item by item."""
        stride = self._plan.item_stride
        fetched = [flat[i : i + stride] for i in range(0, len(flat), stride)]
        self._item_reads.put(read, fetched, as_of_ms, read_at)
        if not hits:
            return flat
        by_id = dict(zip(read, fetched, strict=True))
        out: list[Any] = []
        for iid in unique:
            out.extend(hits[iid] if iid in hits else by_id[iid])
        return out

    def _item_windows(
        self, unique: list[str], item_ids: Sequence[str], rest: list[Any], as_of_ms: int
    ) -> ItemWindows:
        """The items' stream reads, per stream in plan order, in `item_ids` order
        (consumed from the front of `rest`)."""
        streams = self._plan.item_streams
        if not streams:
            return []
        if not unique:
            return [
                StreamRead([[] for _ in s.windows]) if s.read == "count" else StreamRead() for s in streams
            ]
        per_item, stride = self._plan.item_widths, self._plan.item_stride
        flat = _cluster_flat(len(unique), streams, rest) if self._cluster else rest.pop(0)
        out: ItemWindows = []
        offset = 0
        for s, width in zip(streams, per_item, strict=True):
            if s.read == "count":
                counts = [flat[offset + w :: stride] for w in range(len(s.windows))]
                newest = [int(t) for t in flat[offset + len(s.windows) :: stride]]
                out.append(StreamRead(counts, newest))
            elif s.tiled:
                out.append(
                    StreamRead(
                        values=[_tiled_values(s, r, as_of_ms, self._cluster) for r in flat[offset::stride]]
                    )
                )
            else:
                out.append(StreamRead(events=[_pairs_to_events(m) for m in flat[offset::stride]]))
            offset += width
        if len(unique) != len(item_ids):  # repeated ids: spread the unique answers back
            at = {iid: n for n, iid in enumerate(unique)}
            order = [at[i] for i in item_ids]
            out = [read.reorder(order) for read in out]
        return out


def _queue_user_reads(pipe: Any, user_id: str, user_streams: Sequence[Stream], as_of_ms: int) -> None:
    """The user's stream reads: the newest `scan` events or the whole widest window."""
    for s in user_streams:
        key = keys.stream("user", user_id, s.id)
        lo = f"({as_of_ms - s.widest_ms}"
        if s.read == "latest":
            pipe.zrevrangebyscore(key, as_of_ms, lo, start=0, num=s.scan, withscores=True)
        else:
            pipe.zrangebyscore(key, lo, as_of_ms, withscores=True)


def _cluster_flat(n_items: int, streams: Sequence[Stream], rest: list[Any]) -> list[Any]:
    """A cluster's per-command replies (consumed from the front of `rest`) in the item
    script's flat reply form."""
    flat: list[Any] = []
    for _ in range(n_items):
        for s in streams:
            if s.read == "count":
                flat.extend(int(c) for c in rest[: len(s.windows)])
                top = rest[len(s.windows)]
                flat.append(int(top[0][1]) if top else -1)
                del rest[: len(s.windows) + 1]
            elif s.tiled:
                flat.append(rest.pop(0))
            else:
                flat.append([x for m, sc in rest.pop(0) for x in (m, sc)])
    return flat


def _tiled_values(s: Stream, raw: Any, as_of_ms: int, cluster: bool) -> dict[str, tuple[FeatureValue, int]]:
    """A tiled stream's features from what was read: the read script's reply, or on a
    cluster the tiles hash (summed here) / the distinct list."""
    if s.read == "distinct":
        if cluster:
            pairs = [(bytes(m).decode(), int(sc)) for m, sc in raw]
        else:
            pairs = [(bytes(raw[i]).decode(), int(float(raw[i + 1]))) for i in range(0, len(raw), 2)]
        return tiles.distinct_values(s, pairs, as_of_ms)
    if cluster:
        state = tiles.tiles_from_hash(raw)
        sums = [state.sums(*tiles.window_tiles(as_of_ms, w, s.slide_ms)) for w in s.windows]
    else:
        sums = tiles.decode_reply(raw, len(s.windows))
    return tiles.stream_values(s, sums, as_of_ms)


def _queue_cluster_tiled_reads(
    pipe: Any, entity: Entity, entity_id: str, streams: Sequence[Stream], as_of_ms: int
) -> None:
    """A tiled stream's read as a plain command: the tiles hash, or the distinct list."""
    for s in streams:
        key = keys.stream(entity, entity_id, s.id)
        if s.read == "tiles":
            pipe.hgetall(key)
        else:
            pipe.zrevrangebyscore(
                key, as_of_ms, f"({as_of_ms - s.widest_ms}", start=0, num=s.scan, withscores=True
            )


def _queue_cluster_item_reads(pipe: Any, unique: list[str], streams: Sequence[Stream], as_of_ms: int) -> None:
    """The items' stream reads as plain commands (a cluster pipeline runs no script):
    per item and stream, the window counts and newest event, or the widest window's events."""
    for iid in unique:
        for s in streams:
            key = keys.stream("item", iid, s.id)
            if s.tiled:
                _queue_cluster_tiled_reads(pipe, "item", iid, (s,), as_of_ms)
            elif s.read == "count":
                for w in s.windows:
                    pipe.zcount(key, f"({as_of_ms - w}", as_of_ms)
                pipe.zrevrangebyscore(
                    key, as_of_ms, f"({as_of_ms - s.windows[0]}", start=0, num=1, withscores=True
                )
            else:
                pipe.zrangebyscore(key, f"({as_of_ms - s.widest_ms}", as_of_ms, withscores=True)


def _pairs_to_events(flat: list[Any]) -> list[StreamEvent]:
    """[member, score, member, score, ...] (a script reply) as ascending events."""
    return [(int(float(flat[i + 1])), bytes(flat[i]).decode()) for i in range(0, len(flat), 2)]
