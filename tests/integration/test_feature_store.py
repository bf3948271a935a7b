"""FeatureStore against a real redis-server: windows, idempotency, fallbacks,
and parity with the offline replay."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import redis.asyncio as redis
from prometheus_client import REGISTRY

from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.backfill import ReplayState
from recmesh.features.repository import DEMO_REPOSITORY, FeatureSet, load_feature_set, parse_feature_set
from recmesh.redis_client import AnyRedis, connect
from recmesh.tools.demo.generate import generate_events, make_catalog, offline_rows
from services.feature.catalog import load_catalog
from services.feature.offline_cache import OfflineCache
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter
from tests.helpers import poll_until, write_events

MIN = 60_000
T0 = 1_800_000_000_000


def e(eid: str, user: str, item: str, behavior: str, t: int) -> Event:
    return Event.model_validate(
        {"event_id": eid, "user_id": user, "item_id": item, "behavior": behavior, "event_time": t}
    )


FEATURE_SET: FeatureSet = load_feature_set(DEMO_REPOSITORY)
# The demo with every window tiled by the minute: the counts are read from tiles (totals on
# one Redis; the tiles hash summed in Python on a cluster), not per-event sorted sets.
TILED_DEMO: FeatureSet = parse_feature_set(
    DEMO_REPOSITORY.read_text()
    .replace('window = "5m"\n', 'window = "5m"\nslide = "1m"\n')
    .replace('window = "10m"\n', 'window = "10m"\nslide = "1m"\n'),
    DEMO_REPOSITORY,
)
USERS = [("u1", {"age_band": "25-34", "interest_tags": ["news"]})]
ITEMS = [("i1", {"category": "news", "length": 60, "author_level": 2, "popularity": 5.0}),
         ("i2", {"category": "food", "length": 90, "author_level": 3, "popularity": 1.0})]  # fmt: skip


async def loaded_store(
    client: redis.Redis, static_ttl_s: float = 5.0, profile_ttl_s: float = 60.0
) -> FeatureStore:
    offline = OfflineCache(client, FEATURE_SET, static_ttl_s=static_ttl_s, profile_ttl_s=profile_ttl_s)
    store = FeatureStore(client, FEATURE_SET, offline=offline)
    await store.prepare()
    await load_catalog(client, FEATURE_SET, USERS, ITEMS)  # type: ignore[arg-type]
    return store


async def test_windows_as_of_and_provenance(redis_client: redis.Redis) -> None:
    store = await loaded_store(redis_client)
    await write_events(store, [
        e("a", "u1", "i1", "click", T0 - 11 * MIN),  # outside every 10-minute window
        e("b", "u1", "i1", "view", T0 - 6 * MIN),
        e("c", "u1", "i1", "click", T0 - 6 * MIN + 1000),
        e("d", "u1", "i2", "click", T0 - 2 * MIN),
        e("f", "u1", "i2", "view", T0 + MIN),  # after as_of: must not be seen
    ])  # fmt: skip
    got = await store.lookup("u1", ["i1", "i2", "i404"], T0, timeout_s=1.0)
    assert got.degraded == []
    assert got.user["clicks_5m"] == (1, "realtime", 2 * MIN)
    assert got.user["category_clicks_10m"][0] == {"news": 1, "food": 1}
    # last_viewed_3 (1 h) keeps each item's latest event: i2's is after the as-of time
    assert got.user["last_viewed_3"][0] == ["i1"]
    assert got.user["age_band"] == ("25-34", "offline", -1)
    i1, i2, missing = got.items
    assert (i1["clicks_10m"][0], i1["views_10m"][0]) == (1, 1)
    assert i1["category"] == ("news", "offline", -1)
    assert (i2["clicks_10m"][0], i2["views_10m"][0]) == (1, 0)
    assert missing["category"] == ("unknown", "default", -1)
    assert missing["clicks_10m"] == (0, "realtime", -1)


async def test_applying_a_batch_twice_changes_nothing(redis_client: redis.Redis) -> None:
    store = await loaded_store(redis_client)
    batch = [e(f"x{i}", "u1", "i1", "click", T0 - i * 1000) for i in range(20)]
    first = await write_events(store, batch)
    once = await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
    again = await write_events(store, batch)
    await write_events(store, batch[:5])
    twice = await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
    assert once == twice
    assert twice.items[0]["clicks_10m"][0] == 20
    assert (first.written, first.duplicates, again.written, again.duplicates) == (20, 0, 0, 20)


async def test_an_event_id_counts_once_whatever_else_it_carries(redis_client: redis.Redis) -> None:
    """Event identity is the event id (within a user's retained state): a second
    event reusing an id, with another item, behaviour or time, is dropped and counted."""
    store = await loaded_store(redis_client)
    await write_events(store, [e("same", "u1", "i1", "click", T0 - MIN)])
    result = await write_events(store, [
        e("same", "u1", "i2", "click", T0 - MIN),  # another item
        e("same", "u1", "i1", "view", T0 - 2 * MIN),  # another behaviour and time
        e("other", "u1", "i2", "click", T0 - MIN),
    ])  # fmt: skip
    assert (result.written, result.duplicates) == (1, 2)
    got = await store.lookup("u1", ["i1", "i2"], T0, timeout_s=1.0)
    i1, i2 = got.items
    assert (i1["clicks_10m"][0], i1["views_10m"][0], i2["clicks_10m"][0]) == (1, 0, 1)
    assert got.user["clicks_5m"][0] == 2
    # The replay applies the same rule.
    replay = ReplayState(FEATURE_SET, dict(USERS), dict(ITEMS))
    for ev in [e("same", "u1", "i1", "click", T0 - MIN), e("same", "u1", "i2", "click", T0 - MIN)]:
        replay.apply(ev)
    assert replay.duplicates == 1 and replay.features("item", "i2", T0)["clicks_10m"][0] == 0


async def test_item_ages_come_from_each_features_own_events(redis_client: redis.Redis) -> None:
    """An item count's age is its own stream's newest event in its window:
    every case (index, set, past as-of) agrees with the replay."""
    store = await loaded_store(redis_client)
    cases = {
        "clicks-newer": [("click", T0 - MIN), ("view", T0 - 2 * MIN), ("click", T0 - 3 * MIN)],
        "views-newer": [("view", T0 - MIN), ("click", T0 - 2 * MIN)],
        "tie": [("view", T0 - MIN), ("click", T0 - MIN)],
        "clicks-only": [("click", T0 - 4 * MIN)],
        "views-only": [("view", T0 - 5 * MIN)],
        "future-click": [("view", T0 - MIN), ("click", T0 + MIN)],  # after as_of: not the newest
        "old-view": [("view", T0 - 11 * MIN), ("click", T0 - 2 * MIN)],  # view outside the window
    }
    replay = ReplayState(FEATURE_SET, {}, {})
    batch = []
    for item, evs in cases.items():
        for n, (behavior, t) in enumerate(evs):
            batch.append(e(f"{item}-{n}", "u9", item, behavior, t))
    for ev in sorted(batch, key=lambda x: x.event_time):
        replay.apply(ev)
    await write_events(store, batch)
    got = await store.lookup("u9", list(cases), T0, timeout_s=1.0)
    for item, row in zip(cases, got.items, strict=True):
        want = replay.features("item", item, T0)
        assert {k: (row[k][0], row[k][2]) for k in want} == want, item
    by_item = dict(zip(cases, got.items, strict=True))
    assert by_item["clicks-newer"]["clicks_10m"][2] == MIN
    assert by_item["views-newer"]["clicks_10m"][2] == 2 * MIN  # the click's own age, not the view's
    assert by_item["clicks-only"]["views_10m"][2] == -1


def _tile_age(
    feature_set: FeatureSet, want: dict[str, tuple[Any, int]], as_of: int
) -> dict[str, tuple[Any, int]]:
    """`want` with a tiled feature's age at tile resolution (as-of minus the start of the tile
    holding the newest event), as a cluster serves it: its read sums the tiles hash, which
    keeps no newest event time (docs/features.md, "Tiled windows")."""
    slide = {f.name: s.slide_ms for s in feature_set.streams if s.read == "tiles" for f in s.features}
    return {
        k: (v, as_of - (as_of - a) // slide[k] * slide[k] if k in slide and a >= 0 else a)
        for k, (v, a) in want.items()
    }


async def check_parity_with_replay(client: AnyRedis, feature_set: FeatureSet = FEATURE_SET) -> None:
    """The same events through the store and through the replay give the same
    features at every as-of time probed, even when applied out of order (on a cluster,
    tiled features' ages at tile resolution)."""
    cluster = not isinstance(client, redis.Redis)
    catalog = make_catalog()
    users, items = offline_rows(catalog)
    store = FeatureStore(client, feature_set)
    await load_catalog(client, feature_set, users, items)
    events = [Event.model_validate(x) for x in generate_events(catalog, T0, 40 * MIN, 300, seed=3)]
    writer = EventWriter(client, feature_set, store.offline.attributes)
    replay = ReplayState(feature_set, dict(users), dict(items))
    rng = random.Random(2)
    probe_users = sorted({ev.user_id for ev in events})[:25]
    probe_items = [ev.item_id for ev in rng.sample(events, 40)]
    written = 0
    for as_of in (T0 + 10 * MIN, T0 + 25 * MIN + 123, T0 + 40 * MIN):
        # What happened up to as-of: written shuffled (out of order), replayed in order.
        upto = next((n for n, ev in enumerate(events) if ev.event_time > as_of), len(events))
        shuffled = events[written:upto]
        random.Random(as_of).shuffle(shuffled)
        for i in range(0, len(shuffled), 500):
            await writer.apply(shuffled[i : i + 500])
        for ev in events[written:upto]:
            replay.apply(ev)
        written = upto
        for user in probe_users:
            got = await store.lookup(user, probe_items, as_of, timeout_s=2.0)
            assert got.degraded == []
            want_user = replay.features("user", user, as_of)
            if cluster:
                want_user = _tile_age(feature_set, want_user, as_of)
            assert {k: got.user[k][0] for k in want_user} == {k: v for k, (v, _) in want_user.items()}
            assert {k: got.user[k][2] for k in want_user} == {k: a for k, (_, a) in want_user.items()}
            for iid, row in zip(probe_items, got.items, strict=True):
                want = replay.features("item", iid, as_of)
                if cluster:
                    want = _tile_age(feature_set, want, as_of)
                assert {k: (row[k][0], row[k][2]) for k in want} == want, (iid, as_of)


async def test_online_equals_offline_replay_on_demo_traffic(redis_client: redis.Redis) -> None:
    await check_parity_with_replay(redis_client)


async def test_online_equals_offline_replay_with_tiled_windows(redis_client: redis.Redis) -> None:
    assert {s.read for s in TILED_DEMO.streams} >= {"tiles"}, "the variant reads tiles"
    await check_parity_with_replay(redis_client, TILED_DEMO)


async def test_online_equals_offline_replay_on_a_redis_cluster(redis_cluster_url: str) -> None:
    client = connect(redis_cluster_url, 16)
    try:
        await check_parity_with_replay(client)
        await client.flushall()  # the same event ids again: nothing may look applied already
        await check_parity_with_replay(client, TILED_DEMO)
        nodes = client.get_primaries()  # type: ignore[union-attr]
        assert len(nodes) == 3
        # One user's keys share a slot (hash tags), so they live on one node.
        from redis.crc import key_slot

        from recmesh.features import keys as k

        user_keys = [k.stream("user", "u1", s.id) for s in FEATURE_SET.streams_of("user")]
        assert len({key_slot(x.encode()) for x in (*user_keys, k.user_ids("u1"), k.user_profile("u1"))}) == 1
    finally:
        await client.aclose()


async def test_redis_down_falls_back_to_cached_offline_features(redis_client: redis.Redis) -> None:
    store = await loaded_store(redis_client)
    await store.lookup("u1", ["i1"], T0, timeout_s=1.0)  # warms the offline caches
    dead = connect("redis://127.0.0.1:1/0", 4)
    broken = FeatureStore(dead, FEATURE_SET, offline=store.offline)
    got = await broken.lookup("u1", ["i1", "i2"], T0, timeout_s=0.5)
    assert got.degraded == ["realtime_store_unavailable"]
    assert got.user["clicks_5m"] == (0, "default", -1)
    assert got.user["age_band"] == ("25-34", "offline", -1)
    assert got.items[0]["category"] == ("news", "offline", -1)
    assert got.items[1]["category"] == ("unknown", "default", -1)
    await dead.aclose()


async def test_slow_redis_times_out_within_budget(redis_client: redis.Redis, scratch_redis_url: str) -> None:
    await loaded_store(redis_client)
    reader = connect(scratch_redis_url, 4)
    slow = FeatureStore(reader, FEATURE_SET)
    await slow.prepare()
    await redis_client.client_pause(300)
    started = time.perf_counter()
    got = await slow.lookup("u1", ["i1"], T0, timeout_s=0.05)
    elapsed = time.perf_counter() - started
    assert got.degraded == ["realtime_store_timeout"]
    assert elapsed < 0.2
    await reader.aclose()


def static_reads(path: str) -> float:
    return REGISTRY.get_sample_value("recmesh_feature_static_reads_total", {"path": path}) or 0.0


async def test_cached_statics_are_reread_only_after_an_offline_load(redis_client: redis.Redis) -> None:
    store = await loaded_store(redis_client, static_ttl_s=0.5, profile_ttl_s=0.5)
    first = await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
    assert first.items[0]["category"][0] == "news"

    async def settled() -> bool:
        # The first read came before the version was known: it is re-read once
        # in the background; after that, look-ups read no statics at all.
        await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
        confirmed = store.offline.item_cache.get_fresh("i1", vouched=store.offline._statics_vouched)
        return store.offline._refresher is None and confirmed is not None

    await poll_until(settled, "cached statics confirmed by the version", 2.0, interval=0.02)
    inline, background = static_reads("inline"), static_reads("background")
    until = time.monotonic() + 1.2  # more than twice the TTLs
    while time.monotonic() < until:
        got = await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
        await asyncio.sleep(0.02)
    assert (static_reads("inline"), static_reads("background")) == (inline, background)
    assert got.items[0]["category"][0] == "news" and got.user["age_band"][0] == "25-34"


async def test_an_offline_load_reaches_lookups_long_before_the_ttls(redis_client: redis.Redis) -> None:
    store = await loaded_store(redis_client, static_ttl_s=60.0, profile_ttl_s=60.0)
    for _ in range(3):  # cached, then confirmed by the version
        await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
    inline = static_reads("inline")
    await load_catalog(
        redis_client,
        FEATURE_SET,
        [("u1", {"age_band": "35-44", "interest_tags": ["food"]})],
        [("i1", {"category": "sports", "length": 60, "author_level": 2, "popularity": 5.0})],
    )

    async def loaded() -> bool:
        got = await store.lookup("u1", ["i1"], T0, timeout_s=1.0)
        return got.items[0]["category"][0] == "sports" and got.user["age_band"][0] == "35-44"

    await poll_until(loaded, "the load reaches look-ups (the TTLs are 60 s)", 5.0, interval=0.02)
    assert static_reads("inline") == inline, "served while re-read in the background, never in-line"


async def test_the_ingest_enrichment_rereads_statics_only_after_an_offline_load(
    redis_client: redis.Redis,
) -> None:
    """The write path's attributes are vouched for by the statics version (read with
    each batch): past the TTLs nothing is re-read until a load changes the version,
    and the batch after the load sees it."""
    store = await loaded_store(redis_client, static_ttl_s=0.3, profile_ttl_s=0.3)
    offline = store.offline
    for _ in range(2):  # the first read came before the version was known: read once more
        await offline.attributes("item", ["i1", "i2"])
        await offline.attributes("user", ["u1"])
    reads = static_reads("enrichment")
    until = time.monotonic() + 1.0  # more than three times the TTLs
    while time.monotonic() < until:
        items = await offline.attributes("item", ["i1", "i2"])
        users = await offline.attributes("user", ["u1"])
        await asyncio.sleep(0.02)
    assert static_reads("enrichment") == reads
    assert offline.stale_profile("u1") is not None and users["u1"]["age_band"] == "25-34"
    assert items["i1"]["category"] == "news"
    await load_catalog(
        redis_client,
        FEATURE_SET,
        [("u1", {"age_band": "35-44", "interest_tags": ["food"]})],
        [("i1", {"category": "sports", "length": 60, "author_level": 2, "popularity": 5.0})],
    )
    await offline.attributes("item", ["i1"])  # the batch that sees the new version
    items = await offline.attributes("item", ["i1", "i2"])
    users = await offline.attributes("user", ["u1"])
    assert items["i1"]["category"] == "sports" and users["u1"]["age_band"] == "35-44"
    assert static_reads("enrichment") > reads


async def test_without_a_version_the_ttls_apply(redis_client: redis.Redis) -> None:
    """State loaded before versions existed (or a lost version): look-ups
    re-read statics on their TTL, not on every look-up."""
    store = await loaded_store(redis_client, static_ttl_s=60.0)
    await redis_client.delete(keys.STATICS_VERSION)
    await store.lookup("u1", ["i1", "i2"], T0, timeout_s=1.0)
    reads = static_reads("inline") + static_reads("background")
    for _ in range(20):
        await store.lookup("u1", ["i1", "i2"], T0, timeout_s=1.0)
    await asyncio.sleep(0.05)
    assert static_reads("inline") + static_reads("background") == reads
    await store.prepare()  # names the state that is there
    assert await redis_client.get(keys.STATICS_VERSION) is not None


async def test_the_newest_index_answers_as_the_sorted_sets_do(redis_client: redis.Redis) -> None:
    """Item ages come from each item's `newest` hash (kept by the ingest write)
    when it is at or before as-of, else from the sorted sets: both must agree
    at every as-of, including ones between and before the events."""
    store = await loaded_store(redis_client)
    rng = random.Random(5)
    events = sorted(
        (e(f"n{n}", f"u{rng.randrange(5)}", f"i{rng.randrange(1, 3)}", rng.choice(["click", "view"]),
           T0 - rng.randrange(20 * MIN)) for n in range(200)),
        key=lambda ev: ev.event_time,
    )  # fmt: skip
    writer = EventWriter(redis_client, FEATURE_SET, store.offline.attributes)
    for start in range(0, len(events), 50):
        await writer.apply(events[start : start + 50])
    # A missing index (evicted, written before it existed) re-made by a batch
    # of older events starts from the sets' newest.
    newest = keys.newest("item", "i1")
    held = await redis_client.hgetall(newest)
    await redis_client.delete(newest)
    await writer.apply([e("late", "u1", "i1", "click", events[0].event_time)])
    assert await redis_client.exists(newest, keys.newest("item", "i2")) == 2
    assert int(await redis_client.hget(newest, "click")) == int(held[b"click"])  # type: ignore[arg-type]
    # The index and the item's sets expire together.
    ttls = [await redis_client.pttl(k) for k in (newest, keys.stream("item", "i1", "view"))]
    assert ttls[0] > 0 and abs(ttls[0] - ttls[1]) < 1000
    as_ofs = [T0 + 1, T0 - 3 * MIN, T0 - 9 * MIN, T0 - 25 * MIN, *(ev.event_time for ev in events[::37])]
    indexed = [(await store.lookup("u1", ["i1", "i2", "i3"], t, timeout_s=1.0)).items for t in as_ofs]
    await redis_client.delete(newest, keys.newest("item", "i2"))
    from_sets = [(await store.lookup("u1", ["i1", "i2", "i3"], t, timeout_s=1.0)).items for t in as_ofs]
    assert indexed == from_sets
    assert any(row["clicks_10m"][2] > 0 for rows in indexed for row in rows)  # ages were served


async def test_a_closed_store_re_reads_nothing_on_its_closed_client(scratch_redis_url: str) -> None:
    """Statics due for a re-read are queued for a background task; closing the
    store stops it, so it never takes a connection from a client that has been
    closed (one nobody would close: a ResourceWarning in the suite, a leaked
    socket at a service's shutdown)."""
    client = redis.Redis.from_url(scratch_redis_url, protocol=2)
    store = FeatureStore(client, FEATURE_SET, offline=OfflineCache(client, FEATURE_SET))
    before = static_reads("background")
    store.offline._refresh_statics_later(["i1", "i2"])  # as a look-up queues statics due for a re-read
    await store.aclose()
    await client.aclose()
    await asyncio.sleep(0.2)
    assert static_reads("background") == before
