"""The one event write path: its single-Redis script against its pipelined (Redis Cluster) form."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set, parse_feature_set
from services.feature.catalog import load_catalog
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter, Source
from tests.helpers import tile_events

FEATURE_SET = load_feature_set(DEMO_REPOSITORY)


@pytest.fixture
async def two_dbs(redis_url: str) -> AsyncIterator[tuple[redis.Redis, redis.Redis]]:
    base = redis_url.rsplit("/", 1)[0]
    a, b = redis.Redis.from_url(f"{base}/2", protocol=2), redis.Redis.from_url(f"{base}/3", protocol=2)
    for client in (a, b):
        await client.flushdb()
    yield a, b
    for client in (a, b):
        await client.flushdb()
        await client.aclose()


def _batches(seed: int) -> list[list[Event]]:
    """Batches as the consumer sees them: sorted by event time within a batch,
    out of order across batches, with redelivered events. Spread over 50 min:
    within the 1 h retention, as the consumer's `too_late` rule keeps it (past
    it, each path re-counts a redelivery once its mark is trimmed, and the two
    marks are trimmed at different moments)."""
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    events = [
        Event(event_id=f"e{n}", user_id=f"u{rng.randrange(40)}", item_id=f"i{rng.randrange(30)}",
              behavior=rng.choice(FEATURE_SET.behaviors), event_time=now - rng.randrange(50 * 60_000))
        for n in range(3000)
    ]  # fmt: skip
    events.sort(key=lambda e: e.event_time + rng.randrange(-120_000, 120_000))
    events += rng.sample(events, 300)  # redeliveries, some in the same batch as the original
    # Reused ids with other content (another item): dropped as duplicates either way.
    events += [e.model_copy(update={"item_id": "i0"}) for e in rng.sample(events, 50)]
    batches = [events[i : i + 250] for i in range(0, len(events), 250)]
    return [sorted(b, key=lambda e: e.event_time) for b in batches]


async def _state(client: redis.Redis) -> dict[str, object]:
    out: dict[str, object] = {}
    async for raw in client.scan_iter(count=1000):
        key = raw.decode()
        if key.endswith("}:newest") or key == keys.REPOSITORY:  # the script's index (below), load metadata
            continue
        kind = await client.type(key)
        if kind == b"string":  # the statics version
            continue
        if kind == b"zset":
            if not key.startswith("{catalog}"):  # offline popularity has no TTL
                assert await client.ttl(key) > 0, f"{key} has no TTL"
            out[key] = await client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = await client.hgetall(key)
    return out


async def test_the_one_script_write_equals_the_pipelined_write(
    two_dbs: tuple[redis.Redis, redis.Redis],
) -> None:
    a, b = two_dbs
    statics = [(f"i{n}", {"category": f"c{n % 4}", "popularity": 1.0}) for n in range(30)]
    await load_catalog(a, FEATURE_SET, [], statics)  # type: ignore[arg-type]
    await load_catalog(b, FEATURE_SET, [], statics)  # type: ignore[arg-type]
    pipelined = EventWriter(a, FEATURE_SET, FeatureStore(a, FEATURE_SET).offline.attributes, pipelined=True)
    script = EventWriter(b, FEATURE_SET, FeatureStore(b, FEATURE_SET).offline.attributes)
    counted_a = counted_b = dups_a = dups_b = 0
    batches = _batches(7)
    for batch in batches:
        got_a, got_b = await pipelined.apply(batch), await script.apply(batch)
        counted_a += got_a.covisit_pairs
        counted_b += got_b.covisit_pairs
        dups_a += got_a.duplicates
        dups_b += got_b.duplicates
    assert counted_a == counted_b > 1000
    assert dups_a == dups_b >= 300
    state_a, state_b = await _state(a), await _state(b)
    assert sorted(state_a) == sorted(state_b)
    assert state_a == state_b
    assert any(k.endswith(":covisits") for k in state_b)

    # The script also keeps each item's newest event time per count stream for look-ups.
    for n in range(30):
        for stream in ("click", "view"):
            top = await b.zrange(keys.stream("item", f"i{n}", stream), -1, -1, withscores=True)
            held = await b.hget(keys.newest("item", f"i{n}"), stream)
            assert (int(held) if held is not None else None) == (int(top[0][1]) if top else None), f"i{n}"
        if await b.exists(keys.newest("item", f"i{n}")):
            assert 0 < await b.ttl(keys.newest("item", f"i{n}")) <= FEATURE_SET.ttl_s

    # Everything again, as after a crash before the commit: nothing changes.
    for batch in batches:
        again = await script.apply(batch)
        assert (again.written, again.covisit_pairs) == (0, 0)
    assert await _state(b) == state_b


async def test_the_history_keeps_each_users_newest_distinct_items_capped(
    two_dbs: tuple[redis.Redis, redis.Redis],
) -> None:
    """Learnt retrieval's seeds: events of the learnt behaviours only (the demo's:
    click), one member per item at its newest time, a late event never moves an
    item back, at most recall.learnt.history items after the batch's upkeep;
    both write paths alike, and read as of a time."""
    from services.feature.recall_store import RecallStore

    cap = FEATURE_SET.roles.history_cap
    now = int(time.time() * 1000)
    events = [
        Event(event_id=f"h{n}", user_id="u1", item_id=f"i{n}", behavior="click", event_time=now - 10_000 + n)
        for n in range(cap + 5)
    ]
    events += [
        Event(
            event_id="again", user_id="u1", item_id="i0", behavior="click", event_time=now
        ),  # i0 newest now
        Event(event_id="late", user_id="u1", item_id="i1", behavior="click", event_time=now - 20_000),  # late
        Event(
            event_id="view", user_id="u1", item_id="seen-only", behavior="view", event_time=now
        ),  # not learnt
    ]
    events.sort(key=lambda e: e.event_time)
    for client, pipelined in zip(two_dbs, (False, True), strict=True):
        writer = EventWriter(
            client, FEATURE_SET, FeatureStore(client, FEATURE_SET).offline.attributes, pipelined=pipelined
        )
        await writer.apply(events)
        history = await RecallStore(client).history("u1", now, 1000)
        assert history[0] == "i0" and "seen-only" not in history
        assert len(history) == cap, pipelined
        assert history[1:4] == [f"i{cap + 4}", f"i{cap + 3}", f"i{cap + 2}"]
        assert await client.ttl(keys.user_history("u1")) > 0
        # as of a moment before the re-click, i0 is not the newest
        assert (await RecallStore(client).history("u1", now - 1, 2)) == [f"i{cap + 4}", f"i{cap + 3}"]


async def test_the_applied_mark_never_moves_back(two_dbs: tuple[redis.Redis, redis.Redis]) -> None:
    client, _ = two_dbs
    writer = EventWriter(client, FEATURE_SET, FeatureStore(client, FEATURE_SET).offline.attributes)
    key = keys.applied("topic")
    await writer.mark_applied("topic", {0: (10, 1_000), 1: (5, -1)})
    assert keys.parse_applied(await client.hgetall(key)) == {0: (10, 1_000), 1: (5, -1)}
    # A redelivered (older) batch leaves a partition as it is; a newer one moves it,
    # keeping the newest event time when its own events are older (late ones).
    await writer.mark_applied("topic", {0: (7, 5_000), 1: (9, 2_000)})
    assert keys.parse_applied(await client.hgetall(key)) == {0: (10, 1_000), 1: (9, 2_000)}
    await writer.mark_applied("topic", {0: (12, 400), 1: (11, -1)})
    assert keys.parse_applied(await client.hgetall(key)) == {0: (12, 1_000), 1: (11, 2_000)}


TILED = parse_feature_set(
    """
[repository]
name = "tiled"

[events]
behaviors = ["view", "click"]

[realtime.item_clicks_1h]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "1h"
slide = "1m"

[state]
dedup = "10s"
""",
    Path("tiled/recmesh.toml"),
)


async def _tile_clicks(client: redis.Redis, items: int) -> int:
    return await tile_events(client, [f"i{i}" for i in range(items)], "click@1m")


async def test_a_batch_written_again_is_recognised_by_its_offsets(redis_client: redis.Redis) -> None:
    """Tiles hold no event ids: a redelivered batch is skipped by the offsets applied,
    recorded in the same script call as the state, even once its ids are forgotten."""
    writer = EventWriter(redis_client, TILED, FeatureStore(redis_client, TILED).offline.attributes)
    now = int(time.time() * 1000)
    events = [
        Event(event_id=f"e{n}", user_id=f"u{n % 7}", item_id=f"i{n % 5}", behavior="click",
              event_time=now + n)
        for n in range(40)
    ]  # fmt: skip
    positions = [(n % 2, 100 + n // 2) for n in range(40)]  # two partitions, offsets 100..119
    marks = {0: (120, now + 38), 1: (120, now + 39)}
    first = await writer.apply(events, Source("topic", positions, marks))
    assert (first.written, first.redelivered) == (40, 0)
    assert await _tile_clicks(redis_client, 5) == 40
    assert keys.parse_applied(await redis_client.hgetall(keys.applied("topic"))) == marks
    for u in range(7):  # the ids remembered for `dedup` are gone
        await redis_client.delete(keys.user_ids(f"u{u}"))
    again = await writer.apply(events, Source("topic", positions, marks))
    assert (again.written, again.redelivered) == (0, 40)
    assert await _tile_clicks(redis_client, 5) == 40, "nothing counted twice"
    # A batch that overlaps what was applied: only the records past the mark count.
    more = [*events[-4:], *(e.model_copy(update={"event_id": f"x{n}"}) for n, e in enumerate(events[:6]))]
    more_positions = [*positions[-4:], *((n % 2, 120 + n // 2) for n in range(6))]
    third = await writer.apply(more, Source("topic", more_positions, {0: (123, now), 1: (123, now)}))
    assert (third.written, third.redelivered) == (6, 4)
    assert await _tile_clicks(redis_client, 5) == 46
    assert keys.parse_applied(await redis_client.hgetall(keys.applied("topic"))) == {
        0: (123, now + 38), 1: (123, now + 39)
    }  # fmt: skip
    # The topic made again (offsets from 0): records newer than what was applied are new events.
    reset = [
        e.model_copy(update={"event_id": f"r{n}", "event_time": now + 1_000 + n})
        for n, e in enumerate(events[:4])
    ]
    fourth = await writer.apply(reset, Source("topic", [(0, n) for n in range(4)], {0: (4, now + 1_003)}))
    assert (fourth.written, fourth.redelivered) == (4, 0)
    assert await _tile_clicks(redis_client, 5) == 50


BY_CATEGORY = parse_feature_set(
    """
[repository]
name = "by-category"

[events]
behaviors = ["click"]

[items]
[items.features]
category = { type = "categorical" }

[realtime.category_clicks_1h]
entity = "user"
aggregate = "count_by"
by = "category"
behaviors = ["click"]
window = "1h"
slide = "1m"

[realtime.category_clicks_2h]
entity = "user"
aggregate = "count_by"
by = "category"
behaviors = ["click"]
window = "2h"
slide = "1m"
""",
    Path("by-category/recmesh.toml"),
)


async def test_a_tiled_stream_is_one_compact_hash_with_its_totals(redis_client: redis.Redis) -> None:
    """Tiles and the windows' totals in one key; with a dozen attribute values the totals'
    value passes Redis's default 64-byte limit, and the shipped config keeps it compact."""
    store = FeatureStore(redis_client, BY_CATEGORY)
    await store.prepare()
    items = [(f"i{k}", {"category": f"category-{k:02d}"}) for k in range(12)]
    await load_catalog(redis_client, BY_CATEGORY, [], items)  # type: ignore[arg-type]
    writer = EventWriter(redis_client, BY_CATEGORY, store.offline.attributes)
    now = int(time.time() * 1000)
    events = [
        Event(event_id=f"e{n}", user_id="u1", item_id=f"i{n % 12}", behavior="click",
              event_time=now - n * 1_000)
        for n in range(36)
    ][::-1]  # fmt: skip
    await writer.apply(events)
    key = keys.stream("user", "u1", "click@1m")
    state = [bytes(k).decode() async for k in redis_client.scan_iter(match=f"{keys.PREFIX['user']}u1*:s:*")]
    assert state == [key], "no second hash for the totals"
    c, t, w = [v for v in await redis_client.hmget(key, "c", "t", "w") if isinstance(v, bytes)]
    assert int(c) == now // 60_000 and int(t) == now
    assert len(w) > 64  # Redis's default hash-max-listpack-value
    assert await redis_client.object("encoding", key) in (b"ziplist", b"listpack")
    got = await store.lookup("u1", [], now, timeout_s=1.0)
    by_category = got.user["category_clicks_1h"][0]
    assert isinstance(by_category, dict) and by_category == got.user["category_clicks_2h"][0]
    assert len(by_category) == 12 and sum(by_category.values()) == 36
