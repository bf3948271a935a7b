"""Feature state in Redis: how events are written and how look-ups read them.

Real-time state is kept as raw events in per-entity sorted sets scored by event
time, and every window is computed at read time as of the request's logical
timestamp. That makes windows exact, lets late events land where they belong,
and makes applying an event idempotent (ZADD of the same event id is a no-op),
so redelivery never double counts. Trimming and TTLs bound the state.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import structlog
from prometheus_client import Counter
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from recmesh.cache import TtlCache, Vouched
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.compute import (
    VIEWING,
    UserEvent,
    item_realtime_columns,
    user_realtime,
    window_lo,
)
from recmesh.features.definitions import (
    MAX_EVENTS_PER_KEY,
    STATE_RETENTION_MS,
    STATE_TTL_S,
    FeatureValue,
    features_of,
)
from recmesh.features.wire import Column
from recmesh.redis_client import AnyRedis

_log = structlog.get_logger("recmesh.feature.store")

STATIC_READS = Counter(
    "recmesh_feature_static_reads_total",
    "Offline item features read from Redis: in-line by a look-up that missed the cache, "
    "or in the background ahead of expiry or after an offline load.",
    ("path",),
)

# Window counts and the newest event time for many items in one command:
# ARGV = lo (exclusive, "(<ms>"), hi, then one blob of newline-separated item ids; the reply is flat:
# clicks_1, views_1, newest_1, clicks_2, ... The script builds the item keys
# itself (passing 600 key names cost more to pack than the look-up itself), so
# it is for a single Redis only; on a cluster the store reads the windows with
# plain commands. The newest event comes from the item's `newest` key (kept by
# the ingest write) when it is at or before `hi`: a GET, where reading an event
# back from each sorted set (ZREVRANGEBYSCORE ... LIMIT 0 1) cost about half
# the script. When the key is missing (state written by `apply_events`, or
# expired) or after `hi` (an as-of in the past), the sorted sets answer.
_ITEM_WINDOWS_LUA = """
local call = redis.call
local out, n = {}, 0
local lo, hi = ARGV[1], ARGV[2]
local lo_n, hi_n = tonumber(string.sub(lo, 2)), tonumber(hi)
for id in string.gmatch(ARGV[3], '[^\\n]+') do
  local k = '{i:' .. id .. '}:'
  local c = call('ZCOUNT', k .. 'clicks', lo, hi)
  local v = call('ZCOUNT', k .. 'views', lo, hi)
  local newest = -1
  if c + v > 0 then
    newest = tonumber(call('GET', k .. 'newest'))
    -- Events in the window imply a newest one inside it; a key that says
    -- otherwise is not trusted.
    if newest == nil or newest > hi_n or newest <= lo_n then
      newest = -1
      for _, key in ipairs({k .. 'clicks', k .. 'views'}) do
        local top = call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, 1)[2]
        if top ~= nil and tonumber(top) > newest then newest = tonumber(top) end
      end
    end
  end
  out[n + 1] = c
  out[n + 2] = v
  out[n + 3] = newest
  n = n + 3
end
return out
"""

# Cached offline features that the statics version vouches for are still
# re-read once this old: a bound for writes that bypass `load_offline`.
VOUCHED_MAX_AGE_S = 300.0

# Most item statics one background refresh reads in one pipeline.
REFRESH_BATCH = 500

# How often one process trims and re-expires a key it keeps writing to.
MAINTAIN_EVERY_S = 60.0

_ITEM_KEY_BY_BEHAVIOR = {"click": keys.item_clicks, "view": keys.item_views}

Values = dict[str, tuple[FeatureValue, str, int]]  # name -> (value, source, age_ms)
ItemWindows = tuple[list[int], list[int], list[int]]  # clicks, views, newest event (-1 none), per item

REALTIME, OFFLINE, DEFAULT = "realtime", "offline", "default"


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


def _decode_hash(raw: dict[bytes, bytes]) -> dict[str, FeatureValue]:
    return {k.decode(): orjson.loads(v) for k, v in raw.items()}


# (name, default) of each entity's real-time and offline features, in registry order.
_DEFS = {
    entity: tuple(
        tuple((f.name, f.default) for f in features_of(entity, kind)) for kind in ("realtime", "offline")
    )
    for entity in ("user", "item")
}


@dataclass(frozen=True, slots=True)
class ItemStatic:
    """An item's offline features as read from Redis, and the same laid out in
    registry order (defaults filled in) with their sources: built once when the
    hash is read, so a look-up transposes cached rows instead of testing every
    feature of every item."""

    features: dict[str, Any]
    values: tuple[FeatureValue, ...]
    sources: tuple[str, ...]


def _parse_item_static(raw: dict[bytes, bytes], previous: ItemStatic | None = None) -> ItemStatic:
    """`previous` is returned when the hash has not changed: a refresh then
    allocates nothing that outlives it, so re-reading thousands of statics a
    second does not feed the collector's oldest generation (full collections
    were the look-up's worst pauses)."""
    features = _decode_hash(raw)
    if previous is not None and previous.features == features:
        return previous
    _, off_defs = _DEFS["item"]
    return ItemStatic(
        features,
        tuple(features.get(name, default) for name, default in off_defs),
        tuple(OFFLINE if name in features else DEFAULT for name, _ in off_defs),
    )


def _with_defaults(
    entity: str,
    realtime: dict[str, tuple[FeatureValue, int]] | None,
    offline: dict[str, Any] | None,
) -> Values:
    rt_defs, off_defs = _DEFS[entity]
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
    windows: ItemWindows | None, statics: Sequence[ItemStatic | None], as_of_ms: int
) -> dict[str, Column]:
    """Item features column by column, in registry order; `windows` None means
    the real-time store was not reached (defaults). Item features are scalars,
    so a default can be shared between rows."""
    rt_defs, off_defs = _DEFS["item"]
    n = len(statics)
    cols: dict[str, Column] = {}
    if windows is None:
        for name, default in rt_defs:
            cols[name] = Column([default] * n, [DEFAULT] * n, [-1] * n)
    else:
        for name, (rt_values, ages) in item_realtime_columns(*windows, as_of_ms).items():
            cols[name] = Column(rt_values, [REALTIME] * n, ages)
    no_age = [-1] * n
    rows = [_NO_ITEM_STATIC if s is None else s for s in statics]
    # Transpose the cached rows: one zip for all offline features.
    values = zip(*[r.values for r in rows], strict=True) if n else [()] * len(off_defs)
    sources = zip(*[r.sources for r in rows], strict=True) if n else [()] * len(off_defs)
    for (name, _), vals, srcs in zip(off_defs, values, sources, strict=True):
        cols[name] = Column(list(vals), list(srcs), no_age)
    return cols


_NO_ITEM_STATIC = _parse_item_static({})


class FeatureStore:
    def __init__(
        self,
        client: AnyRedis,
        *,
        static_ttl_s: float = 5.0,
        profile_ttl_s: float = 60.0,
        cache_entries: int = 200_000,
    ) -> None:
        self._redis = client
        self._cluster = isinstance(client, RedisCluster)
        self._item_static: TtlCache[ItemStatic] = TtlCache(static_ttl_s, cache_entries)
        self._static_ttl_s = static_ttl_s
        # Item statics older than this are still served but refreshed in the
        # background, so a wave of entries loaded together does not expire
        # together into one slow look-up (in-line HGETALLs cost ~15 µs each).
        self._static_refresh_after_s = static_ttl_s * 0.6
        # Offline features change only by an offline load, which writes a new
        # keys.STATICS_VERSION after each batch of its data. Every look-up
        # reads it in its own round trip: while it is unchanged, cached statics
        # and profiles read since it last changed are current (re-read only
        # past VOUCHED_MAX_AGE_S), where TTLs re-read a thousand hashes a
        # second in the background, which cost the look-up ~1 ms at p99. After
        # a change, older item statics are served and re-read in the background
        # at once; older profiles are re-read in-line (one HGETALL in the
        # look-up's pipeline). Without a version, or without a read of it in
        # the last `static_ttl_s` (no look-ups, e.g. the ingest consumer), the
        # TTLs bound staleness.
        self._statics_version: bytes | None = None
        never = float("-inf")  # no change seen yet (and nothing vouched: see confirmed_at)
        self._statics_vouched = Vouched(never, never, never, VOUCHED_MAX_AGE_S)
        self._statics_confirmed_at = float("-inf")
        self._refreshing: set[str] = set()  # queued or being re-read
        self._refresh_queue: dict[str, None] = {}
        self._refresher: asyncio.Task[None] | None = None
        self._user_profile: TtlCache[dict[str, Any]] = TtlCache(profile_ttl_s, cache_entries)
        self._maintained: TtlCache[bool] = TtlCache(MAINTAIN_EVERY_S, cache_entries)
        self._item_sha: str | None = None

    @property
    def item_cache(self) -> TtlCache[ItemStatic]:
        return self._item_static

    @property
    def client(self) -> AnyRedis:
        return self._redis

    async def prepare(self) -> None:
        self._item_sha = await self._redis.script_load(_ITEM_WINDOWS_LUA)
        # State loaded before versions existed (or a version lost): name what
        # is there, so look-ups can vouch for it until the next load.
        await self._redis.set(keys.STATICS_VERSION, uuid.uuid4().hex, nx=True)

    def _refresh_statics_later(self, item_ids: list[str]) -> None:
        """Queue statics for a re-read off the request path. One refresher runs
        at a time and takes what was queued meanwhile as its next batch, so
        concurrent look-ups share a pipeline (and a pool connection) instead
        of starting a task each."""
        for iid in item_ids:
            if iid not in self._refreshing:
                self._refreshing.add(iid)
                self._refresh_queue[iid] = None
        if self._refresher is None and self._refresh_queue:
            self._refresher = asyncio.create_task(self._refresh_queued())

    async def _refresh_queued(self) -> None:
        try:
            while self._refresh_queue:  # ends when look-ups stop queueing
                batch = list(self._refresh_queue)[:REFRESH_BATCH]
                for iid in batch:
                    del self._refresh_queue[iid]
                await self._refresh_statics(batch)
        finally:
            self._refresher = None

    async def _refresh_statics(self, item_ids: list[str]) -> None:
        """Re-read item statics off the request path; a failure leaves the
        entries to expire and be read in-line (within the staleness bound)."""
        try:
            pipe = self._redis.pipeline(transaction=False)
            for iid in item_ids:
                pipe.hgetall(keys.item_static(iid))
            read_at = time.monotonic()  # staleness counts from before the read
            raws = await pipe.execute()
            STATIC_READS.labels("background").inc(len(item_ids))
            for iid, raw in zip(item_ids, raws, strict=True):
                previous = self._item_static.get_stale(iid)
                self._item_static.put(iid, _parse_item_static(raw, previous), read_at)
        except (RedisError, OSError) as err:
            _log.warning("static_refresh_failed", error=repr(err), items=len(item_ids))
        finally:
            self._refreshing.difference_update(item_ids)

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    # --- writes (ingest, offline load) ------------------------------------

    async def item_categories(self, item_ids: Iterable[str]) -> dict[str, str]:
        """Category per item (from the in-process cache or Redis), for enriching events."""
        wanted = sorted(set(item_ids))
        out: dict[str, str] = {}
        missing = []
        for iid in wanted:
            static = self._item_static.get_fresh(iid)
            if static is None:
                missing.append(iid)
            else:
                out[iid] = str(static.features.get("category", "unknown"))
        if missing:
            pipe = self._redis.pipeline(transaction=False)
            for iid in missing:
                pipe.hgetall(keys.item_static(iid))
            for iid, raw in zip(missing, await pipe.execute(), strict=True):
                static = _parse_item_static(raw, self._item_static.get_stale(iid))
                self._item_static.put(iid, static)
                out[iid] = str(static.features.get("category", "unknown"))
        return out

    async def apply_events(self, events: Sequence[Event]) -> None:
        """Write a batch of events. Idempotent: applying it twice changes nothing.

        Each touched key gets its ZADDs. A key this store has not maintained in
        the last MAINTAIN_EVERY_S is also trimmed to STATE_RETENTION_MS behind
        the batch's newest event for it (not the wall clock, so replays of old
        logs stay queryable at their own time), capped at MAX_EVENTS_PER_KEY
        and given a fresh TTL. Maintaining every key on every batch tripled the
        script's cost; once a minute keeps state bounded (the TTL is an hour)
        and a key's first write in a process is always maintained, so no key is
        ever left without a TTL. One pipeline (grouped per node on a cluster).
        The consumer writes through `EventWriter` instead, which on a single
        Redis does this and the co-visit counting in one script call.
        """
        if not events:
            return
        categories = await self.item_categories(e.item_id for e in events)
        members: dict[str, list[tuple[int, str]]] = {}
        for ev in events:
            ue = UserEvent(ev.event_id, ev.item_id, ev.behavior, categories[ev.item_id], ev.event_time)
            members.setdefault(keys.user_events(ev.user_id), []).append((ev.event_time, ue.encode()))
            if ev.behavior in VIEWING:
                members.setdefault(keys.user_viewed(ev.user_id), []).append(
                    (ev.event_time, f"{ev.event_id}|{ev.item_id}")
                )
            item_key = _ITEM_KEY_BY_BEHAVIOR.get(ev.behavior)
            if item_key is not None:
                members.setdefault(item_key(ev.item_id), []).append((ev.event_time, ev.event_id))
        now = time.monotonic()
        maintain = {k for k in members if self._maintained.get_fresh(k, now) is None}
        for key in maintain:
            self._maintained.put(key, True, now)
        # This path does not keep the items' `newest` index (that needs a
        # read-then-write): on a single Redis it drops the keys, so look-ups
        # read the sorted sets, which stay exact. Cluster look-ups never use it.
        stale_newest = set()
        if not self._cluster:
            stale_newest = {
                keys.item_newest(e.item_id) for e in events if e.behavior in _ITEM_KEY_BY_BEHAVIOR
            }
        await self._apply_pipelined(members, maintain, stale_newest)

    async def _apply_pipelined(
        self, members: dict[str, list[tuple[int, str]]], maintain: set[str], stale_newest: set[str]
    ) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for key in stale_newest:
            pipe.delete(key)
        for key, pairs in members.items():
            pipe.zadd(key, {m: t for t, m in pairs})
            if key not in maintain:
                continue
            pipe.zremrangebyscore(key, "-inf", f"({max(t for t, _ in pairs) - STATE_RETENTION_MS}")
            pipe.zremrangebyrank(key, 0, -(MAX_EVENTS_PER_KEY + 1))
            pipe.expire(key, STATE_TTL_S)
        await pipe.execute()

    async def load_offline(
        self,
        users: Iterable[tuple[str, dict[str, Any]]],
        items: Iterable[tuple[str, dict[str, Any]]],
    ) -> tuple[int, int]:
        """Write offline profiles and statics, announcing each flushed batch with
        a new keys.STATICS_VERSION once its writes are done (a separate call:
        a cluster pipeline sends each node's commands in parallel, so in the
        same pipeline the version could land before the data). A load that
        dies partway has announced what it wrote. Unique versions, so a
        restarted Redis loaded afresh never repeats one a service cached under."""
        n_users = n_items = 0
        pipe = self._redis.pipeline(transaction=False)

        async def flush() -> None:
            await pipe.execute()
            await self._redis.set(keys.STATICS_VERSION, uuid.uuid4().hex)

        for uid, feats in users:
            pipe.delete(keys.user_profile(uid))
            pipe.hset(keys.user_profile(uid), mapping={k: orjson.dumps(v) for k, v in feats.items()})
            n_users += 1
            if len(pipe) >= 5000:
                await flush()
        for iid, feats in items:
            pipe.delete(keys.item_static(iid))
            pipe.hset(keys.item_static(iid), mapping={k: orjson.dumps(v) for k, v in feats.items()})
            pipe.zadd(keys.POPULARITY, {iid: float(feats.get("popularity", 0.0))})
            pipe.zadd(
                keys.category_popularity(str(feats.get("category", "unknown"))),
                {iid: float(feats.get("popularity", 0.0))},
            )
            n_items += 1
            if len(pipe) >= 5000:
                await flush()
        await flush()
        return n_users, n_items

    # --- reads --------------------------------------------------------------

    async def popular(self, limit: int) -> list[tuple[str, float]]:
        raw = await self._redis.zrevrange(keys.POPULARITY, 0, limit - 1, withscores=True)
        return [(bytes(m).decode(), float(s)) for m, s in cast(list[tuple[bytes, float]], raw)]

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
        vouched = self._statics_vouched if now - self._statics_confirmed_at <= self._static_ttl_s else None
        profile = self._user_profile.get_fresh(user_id, now, vouched) if with_user else None
        statics_held, static_missing, static_due = self._item_static.get_many(
            item_ids, now, self._static_refresh_after_s, vouched
        )
        if static_due:
            self._refresh_statics_later(static_due)
        lo10 = window_lo(as_of_ms, "category_clicks_10m")
        lo1h = window_lo(as_of_ms, "last_viewed_3")
        try:
            async with asyncio.timeout(timeout_s):
                results = await self._read(
                    user_id,
                    item_ids,
                    static_missing,
                    with_user,
                    with_user and profile is None,
                    lo10,
                    lo1h,
                    as_of_ms,
                )
        except (TimeoutError, RedisError, OSError) as err:
            reason = (
                "realtime_store_timeout" if isinstance(err, TimeoutError) else "realtime_store_unavailable"
            )
            _log.warning("feature_fallback", reason=reason, error=repr(err))
            user = _with_defaults("user", None, self._user_profile.get_stale(user_id)) if with_user else {}
            stale = [self._item_static.get_stale(i) for i in item_ids]
            return Lookup(user, _item_columns(None, stale, as_of_ms), [reason])
        version, events_raw, viewed_raw, profile_raw, item_windows, statics = results
        self._observe_statics_version(version, now)
        if profile_raw is not None:
            profile = _decode_hash(profile_raw)
            self._user_profile.put(user_id, profile, now)
        if static_missing:
            STATIC_READS.labels("inline").inc(len(static_missing))
            fetched = {
                iid: _parse_item_static(raw, self._item_static.get_stale(iid))
                for iid, raw in zip(static_missing, statics, strict=True)
            }
            for iid, static in fetched.items():
                self._item_static.put(iid, static, now)
            statics_held = [fetched.get(iid, held) for iid, held in zip(item_ids, statics_held, strict=True)]
        items = _item_columns(item_windows, statics_held, as_of_ms)
        if not with_user:
            return Lookup({}, items)
        events = [UserEvent.decode(m.decode(), int(s)) for m, s in events_raw]
        viewed = [(m.decode().rsplit("|", 1)[1], int(s)) for m, s in viewed_raw]
        user = _with_defaults("user", user_realtime(events, viewed, as_of_ms), profile)
        return Lookup(user, items)

    def _observe_statics_version(self, version: bytes | None, read_at: float) -> None:
        """`version` as read by a look-up that started at `read_at`. No version
        (none written yet, or lost) vouches for nothing: the TTLs apply."""
        vouched = self._statics_vouched
        if read_at < vouched.since:
            return  # began before the last change was seen: its version may be older
        if version != self._statics_version:
            # Entries read before now may predate the load (on a cluster the
            # version and the hashes come from different nodes in no set
            # order); they were current when the old version was last read.
            self._statics_version = version
            self._statics_vouched = Vouched(
                time.monotonic(), self._statics_confirmed_at, vouched.since, VOUCHED_MAX_AGE_S
            )
        self._statics_confirmed_at = read_at if version is not None else float("-inf")

    async def read_raw(self, user_id: str, item_ids: Sequence[str], as_of_ms: int) -> None:
        """The look-up's Redis round trip alone, without decoding (a benchmark baseline)."""
        lo10 = window_lo(as_of_ms, "category_clicks_10m")
        lo1h = window_lo(as_of_ms, "last_viewed_3")
        await self._read(user_id, item_ids, [], True, False, lo10, lo1h, as_of_ms)

    async def _read(
        self,
        user_id: str,
        item_ids: Sequence[str],
        static_missing: list[str],
        want_user: bool,
        want_profile: bool,
        lo10: int,
        lo1h: int,
        as_of_ms: int,
    ) -> tuple[bytes | None, Any, Any, Any, ItemWindows, list[Any]]:
        if self._item_sha is None and not self._cluster:
            await self.prepare()
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(keys.STATICS_VERSION)
        if want_user:
            pipe.zrangebyscore(keys.user_events(user_id), f"({lo10}", as_of_ms, withscores=True)
            pipe.zrevrangebyscore(
                keys.user_viewed(user_id), as_of_ms, f"({lo1h}", start=0, num=10, withscores=True
            )
        if want_profile:
            pipe.hgetall(keys.user_profile(user_id))
        unique = list(dict.fromkeys(item_ids))
        lo = f"({lo10}"
        if self._cluster:
            # redis-py refuses scripts in cluster pipelines; plain commands are
            # grouped per node, one round trip per node in parallel.
            for iid in unique:
                for key in (keys.item_clicks(iid), keys.item_views(iid)):
                    pipe.zcount(key, lo, as_of_ms)
                    pipe.zrevrangebyscore(key, as_of_ms, lo, start=0, num=1, withscores=True)
        elif unique:
            pipe.evalsha(self._item_sha, 0, lo, as_of_ms, "\n".join(unique))  # type: ignore[arg-type]
        for iid in static_missing:
            pipe.hgetall(keys.item_static(iid))
        try:
            out = await pipe.execute()
        except NoScriptError:
            # The server lost its script cache (restart, failover): load and retry once.
            await self.prepare()
            return await self._read(
                user_id, item_ids, static_missing, want_user, want_profile, lo10, lo1h, as_of_ms
            )
        version, rest = out[0], out[1:]
        events_raw, viewed_raw = (rest.pop(0), rest.pop(0)) if want_user else ([], [])
        profile_raw = rest.pop(0) if want_profile else None
        windows: ItemWindows = ([], [], [])
        if self._cluster:
            by_item: dict[str, tuple[int, int, int]] = {}
            for iid in unique:
                clicks, newest_click, views, newest_view = rest[:4]
                del rest[:4]
                newest = max([int(s) for _, s in newest_click + newest_view], default=-1)
                by_item[iid] = (int(clicks), int(views), newest)
            for iid in item_ids:
                for column, value in zip(windows, by_item[iid], strict=True):
                    column.append(value)
        elif unique:
            flat: list[int] = rest.pop(0)
            windows = (flat[0::3], flat[1::3], flat[2::3])
            if len(unique) != len(item_ids):  # repeated ids: spread the unique answers back
                at = {iid: n for n, iid in enumerate(unique)}
                windows = tuple([col[at[i]] for i in item_ids] for col in windows)  # type: ignore[assignment]
        return version, events_raw, viewed_raw, profile_raw, windows, rest
