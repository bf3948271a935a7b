"""Offline features as a feature process holds them: users' profiles and
items' statics (what the catalog load wrote, services/feature/catalog.py),
cached in-process.

Offline features change only by a catalog load, which writes a new
keys.STATICS_VERSION after each batch of its data. Every look-up reads it in
its own round trip (FeatureStore.lookup): while it is unchanged, cached
statics and profiles read since it last changed are current (re-read only
past VOUCHED_MAX_AGE_S), where TTLs re-read a thousand hashes a second in the
background, which cost the look-up ~1 ms at p99. After a change, older item
statics are served and re-read in the background at once; older profiles are
re-read in-line (one HGETALL in the look-up's pipeline). Without a version, or
without a read of it in the last `static_ttl_s` (no look-ups), the TTLs bound
staleness.

The same cache answers the write path's enrichment (`attributes`: the offline
features an event's members carry), which reads the version with its misses
once a batch and is vouched for by it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from prometheus_client import Counter
from redis.exceptions import NoPermissionError, RedisError

from recmesh.cache import TtlCache, Vouched
from recmesh.features import keys
from recmesh.features.compute import attribute_text
from recmesh.features.plans import plans
from recmesh.features.repository import Entity, FeatureSet, FeatureValue
from recmesh.redis_client import AnyRedis
from services.feature.catalog import new_statics_version

_log = structlog.get_logger("recmesh.feature.store")

STATIC_READS = Counter(
    "recmesh_feature_static_reads_total",
    "Offline item features read from Redis: in-line by a look-up that missed the cache, "
    "in the background ahead of expiry or after an offline load, or by the ingest's "
    "enrichment of events.",
    ("path",),
)

# Cached offline features that the statics version vouches for are still
# re-read once this old: a bound for writes that bypass the catalog load.
VOUCHED_MAX_AGE_S = 300.0

# Most item statics one background refresh reads in one pipeline.
REFRESH_BATCH = 500

# A served value's source (the wire's FeatureSource); FeatureStore adds REALTIME.
OFFLINE, DEFAULT = "offline", "default"


def decode_hash(raw: dict[bytes, bytes]) -> dict[str, FeatureValue]:
    return {k.decode(): orjson.loads(v) for k, v in raw.items()}


@dataclass(frozen=True, slots=True)
class ItemStatic:
    """An item's offline features as read from Redis, and the same laid out in
    declaration order (defaults filled in) with their sources: built once when
    the hash is read, so a look-up transposes cached rows instead of testing
    every feature of every item."""

    features: dict[str, Any]
    values: tuple[FeatureValue, ...]
    sources: tuple[str, ...]


class OfflineCache:
    """Profiles and item statics held in-process, vouched for by the statics version."""

    def __init__(
        self,
        client: AnyRedis,
        feature_set: FeatureSet,
        *,
        static_ttl_s: float = 5.0,
        profile_ttl_s: float = 60.0,
        cache_entries: int = 200_000,
    ) -> None:
        self._redis = client
        self._off_defs = plans(feature_set).read.offline_defaults
        self._item_static: TtlCache[ItemStatic] = TtlCache(static_ttl_s, cache_entries)
        self._static_ttl_s = static_ttl_s
        # Item statics older than this are still served but refreshed in the
        # background, so a wave of entries loaded together does not expire
        # together into one slow look-up (in-line HGETALLs cost ~15 µs each).
        self._static_refresh_after_s = static_ttl_s * 0.6
        self._statics_version: bytes | None = None
        never = float("-inf")  # no change seen yet (and nothing vouched: see confirmed_at)
        self._statics_vouched = Vouched(never, never, never, VOUCHED_MAX_AGE_S)
        self._statics_confirmed_at = float("-inf")
        self._refreshing: set[str] = set()  # queued or being re-read
        self._refresh_queue: dict[str, None] = {}
        self._refresher: asyncio.Task[None] | None = None
        self._user_profile: TtlCache[dict[str, Any]] = TtlCache(profile_ttl_s, cache_entries)
        self.no_item_static = self._parse_item_static({})

    @property
    def item_cache(self) -> TtlCache[ItemStatic]:
        return self._item_static

    async def prepare(self) -> None:
        # State loaded before versions existed (or a version lost): name what
        # is there, so look-ups can vouch for it until the next load. The
        # service's own Redis user may only read (recmesh.credentials.ACL_RULES):
        # then the catalog load, which always sets a version, is the one to name it.
        with contextlib.suppress(NoPermissionError):
            await new_statics_version(self._redis, only_if_none=True)

    # --- a look-up's share ------------------------------------------------------

    def held(
        self, user_id: str, item_ids: Sequence[str], with_user: bool, now: float
    ) -> tuple[dict[str, Any] | None, list[ItemStatic | None], list[str]]:
        """What the cache holds for a look-up starting at `now`: the user's
        profile (None: read it in the look-up), the items' statics in order
        (None where missing), and the ids to read in the look-up. Statics due
        for a refresh are queued for a re-read off the request path."""
        vouched = self._statics_vouched if now - self._statics_confirmed_at <= self._static_ttl_s else None
        profile = self._user_profile.get_fresh(user_id, now, vouched) if with_user else None
        statics_held, static_missing, static_due = self._item_static.get_many(
            item_ids, now, self._static_refresh_after_s, vouched
        )
        if static_due:
            self._refresh_statics_later(static_due)
        return profile, statics_held, static_missing

    def stale_profile(self, user_id: str) -> dict[str, Any] | None:
        return self._user_profile.get_stale(user_id)

    def stale_items(self, item_ids: Sequence[str]) -> list[ItemStatic | None]:
        return [self._item_static.get_stale(i) for i in item_ids]

    def put_profile(self, user_id: str, raw: dict[bytes, bytes], read_at: float) -> dict[str, Any]:
        profile = decode_hash(raw)
        self._user_profile.put(user_id, profile, read_at)
        return profile

    def put_items(
        self,
        item_ids: Sequence[str],
        statics_held: list[ItemStatic | None],
        missing: list[str],
        raws: list[Any],
        read_at: float,
    ) -> list[ItemStatic | None]:
        """The statics of `missing`, read by a look-up, cached and merged into `statics_held`."""
        STATIC_READS.labels("inline").inc(len(missing))
        fetched = {
            iid: self._parse_item_static(raw, self._item_static.get_stale(iid))
            for iid, raw in zip(missing, raws, strict=True)
        }
        for iid, static in fetched.items():
            self._item_static.put(iid, static, read_at)
        return [fetched.get(iid, held) for iid, held in zip(item_ids, statics_held, strict=True)]

    def observe_version(self, version: bytes | None, read_at: float) -> None:
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

    def _parse_item_static(self, raw: dict[bytes, bytes], previous: ItemStatic | None = None) -> ItemStatic:
        """`previous` is returned when the hash has not changed: a refresh then
        allocates nothing that outlives it, so re-reading thousands of statics a
        second does not feed the collector's oldest generation (full collections
        were the look-up's worst pauses)."""
        features = decode_hash(raw)
        if previous is not None and previous.features == features:
            return previous
        off_defs = self._off_defs["item"]
        return ItemStatic(
            features,
            tuple(features.get(name, default) for name, default in off_defs),
            tuple(OFFLINE if name in features else DEFAULT for name, _ in off_defs),
        )

    # --- background re-reads ------------------------------------------------------

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

    async def aclose(self) -> None:
        """Stop the background re-reads. Before the Redis client closes: a
        re-read that began after it would take a new connection from the
        closed client's pool, and nothing would ever close it."""
        self._refresh_queue.clear()
        task = self._refresher
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
                self._item_static.put(iid, self._parse_item_static(raw, previous), read_at)
        except (RedisError, OSError) as err:
            _log.warning("static_refresh_failed", error=repr(err), items=len(item_ids))
        finally:
            self._refreshing.difference_update(item_ids)

    # --- event enrichment (the write path) ----------------------------------------

    async def attributes(self, entity: Entity, entity_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """Offline features of each entity as event attributes (text; a
        multi-valued one joined by VALUE_SEP; defaults filled in), from the
        in-process cache or Redis: what the write path stores in members."""
        wanted = sorted(set(entity_ids))
        off_defs = self._off_defs[entity]
        if not off_defs:
            return {}
        # Vouched for by the statics version as look-ups are (read with the misses,
        # for the next batch): without it a consumer re-read every entity's hash
        # each TTL, more Redis time than the batch's write on a large catalog.
        now = time.monotonic()
        vouched = self._statics_vouched if now - self._statics_confirmed_at <= self._static_ttl_s else None
        rows: dict[str, dict[str, Any]] = {}
        missing = []
        for eid in wanted:
            if entity == "item":
                static = self._item_static.get_fresh(eid, now, vouched)
                held = static.features if static is not None else None
            else:
                held = self._user_profile.get_fresh(eid, now, vouched)
            if held is None:
                missing.append(eid)
            else:
                rows[eid] = held
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(keys.STATICS_VERSION)
        for eid in missing:
            pipe.hgetall(keys.profile(entity, eid))
        version, *raws = await pipe.execute()
        if entity == "item" and missing:
            STATIC_READS.labels("enrichment").inc(len(missing))
        for eid, raw in zip(missing, raws, strict=True):
            if entity == "item":
                static = self._parse_item_static(raw, self._item_static.get_stale(eid))
                self._item_static.put(eid, static, now)
                rows[eid] = static.features
            else:
                profile = decode_hash(raw)
                self._user_profile.put(eid, profile, now)
                rows[eid] = profile
        self.observe_version(version, now)
        return {
            eid: {name: attribute_text(row.get(name, default)) for name, default in off_defs}
            for eid, row in rows.items()
        }
