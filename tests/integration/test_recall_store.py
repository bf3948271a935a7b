"""Co-visitation and category popularity in a real Redis and a real 3-master cluster."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.covisit import COVISIT_TTL_S
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import AnyRedis, connect
from services.feature.catalog import load_catalog
from services.feature.recall_store import RecallStore
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter

FEATURE_SET = load_feature_set(DEMO_REPOSITORY)
COVISIT_WINDOW_MS = FEATURE_SET.roles.covisit_window_ms


async def check_covisitation(client: AnyRedis, path: str) -> None:
    """`path`: "script" (the one write on a single Redis) or "pipelined" (its
    plain-command form, which a Redis Cluster always takes)."""
    tag = uuid.uuid4().hex[:6]  # the cluster is shared by the session: own ids

    def i(n: int) -> str:
        return f"cv{tag}-{n}"

    store, recall = FeatureStore(client, FEATURE_SET), RecallStore(client)
    writer = EventWriter(
        client, FEATURE_SET, store.offline.attributes, pipelined=True if path == "pipelined" else None
    )

    async def apply(events: list[Event]) -> int:
        return (await writer.apply(sorted(events, key=lambda e: e.event_time))).covisit_pairs

    await load_catalog(
        client, FEATURE_SET, [], [(i(n), {"category": "news", "popularity": 1.0}) for n in range(6)]
    )
    t = int(time.time() * 1000) - 60_000

    def ev(eid: str, user: str, item: str, dt: int, behavior: str = "view") -> Event:
        return Event(event_id=f"{tag}{eid}", user_id=f"{user}{tag}", item_id=item,
                     behavior=behavior, event_time=t + dt)  # fmt: skip

    batch = [
        ev("a1", "ua", i(1), 0), ev("a2", "ua", i(2), 1000), ev("a3", "ua", i(3), 2000, "click"),
        ev("b1", "ub", i(1), 0), ev("b2", "ub", i(2), 500),
        ev("b3", "ub", i(4), 600, "purchase"),  # not a viewing event: no pairs
        ev("b4", "ub", i(5), 500 + COVISIT_WINDOW_MS + 1),  # outside the window of b1/b2
    ]  # fmt: skip
    assert await apply(batch) == 1 + 2 + 1  # a2-a1; a3-a2, a3-a1; b2-b1
    related = dict(await recall.related([i(1)], 10, 10))
    assert related == {i(2): 2.0, i(3): 1.0}
    assert dict(await recall.related([i(3)], 10, 10)) == {i(1): 1.0, i(2): 1.0}
    assert await recall.related([i(5)], 10, 10) == []

    # Redelivery of the whole batch (or any part of it) counts nothing again.
    assert await apply(batch) == 0
    assert await apply(batch[1:3]) == 0
    assert dict(await recall.related([i(1)], 10, 10)) == related
    # Summed over several seeds, seeds themselves left out.
    assert await recall.related([i(1), i(3)], 10, 10) == [(i(2), 3.0)]

    ttl = await client.ttl(keys.item_covisits(i(1)))
    assert 0 < ttl <= COVISIT_TTL_S, "co-visitation state expires"
    assert await client.ttl(keys.user_ids(f"ua{tag}")) > 0, "the event-id set (the mark) expires"

    by_cat = dict(await recall.category_popular(["news", "nope"], 3))
    assert len(by_cat["news"]) == 3 and by_cat["nope"] == []


@pytest.mark.parametrize("path", ["script", "pipelined"])
async def test_covisitation_counts_once_per_event(redis_client: redis.Redis, path: str) -> None:
    await check_covisitation(redis_client, path)


async def test_covisitation_on_a_redis_cluster(redis_cluster_url: str) -> None:
    client = connect(redis_cluster_url, 16)
    try:
        # A user's event ids and an item's counts live in different slots here.
        assert key_slot(keys.user_ids("u1").encode()) != key_slot(keys.item_covisits("i1").encode())
        assert isinstance(client, RedisCluster)
        await check_covisitation(client, "cluster")
    finally:
        await client.aclose()
