"""FeatureService over a real gRPC socket and a real redis-server: requests
out of bounds are refused naming the field (INVALID_ARGUMENT, translated once
on each side), look-ups answer from the store, and a store that cannot be
reached degrades the answer instead of failing it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from recmesh.clients.feature import FeatureClient
from recmesh.errors import InvalidArgument
from recmesh.features.repository import FeatureSet
from recmesh.features.wire import row_values
from recmesh.redis_client import connect
from recmesh.settings import FeatureSettings
from services.feature.catalog import load_catalog
from services.feature.server import MAX_RECALL, build_server
from services.feature.store import FeatureStore
from tests.helpers import free_port

T0 = 1_800_000_000_000
USERS = [("u1", {"age_band": "25-34", "interest_tags": ["news"]})]
ITEMS = [("i1", {"category": "news", "length": 60, "author_level": 2, "popularity": 5.0}),
         ("i2", {"category": "food", "length": 90, "author_level": 3, "popularity": 1.0})]  # fmt: skip


async def _serve(store: FeatureStore, redis_url: str) -> AsyncIterator[FeatureClient]:
    server = build_server(FeatureSettings(feature_port=free_port(), redis_url=redis_url, max_items=3), store)
    await server.start()
    await server.set_serving()
    client = FeatureClient(server.address, "test")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(0)


@pytest.fixture
async def feature(
    redis_client: redis.Redis, scratch_redis_url: str, demo_feature_set: FeatureSet
) -> AsyncIterator[FeatureClient]:
    store = FeatureStore(redis_client, demo_feature_set)
    await store.prepare()
    await load_catalog(redis_client, demo_feature_set, USERS, ITEMS)  # type: ignore[arg-type]
    async for client in _serve(store, scratch_redis_url):
        yield client


async def test_requests_out_of_bounds_are_refused_naming_the_field(feature: FeatureClient) -> None:
    with pytest.raises(InvalidArgument, match="user_id is required"):
        await feature.get_features("", ["i1"], T0)
    with pytest.raises(InvalidArgument, match="item_ids has 4 entries; at most 3"):
        await feature.get_features("u1", ["i1", "i2", "i3", "i4"], T0)
    with pytest.raises(InvalidArgument, match="items_only skips them"):
        await feature.get_features("u1", ["i1"], T0, related_limit=5, items_only=True)
    with pytest.raises(InvalidArgument, match=re.escape("limit must be in 1..10000")):
        await feature.popular(0)
    with pytest.raises(InvalidArgument, match=re.escape(f"limit must be in 1..{MAX_RECALL}")):
        await feature.related(["i1"], MAX_RECALL + 1)


async def test_a_lookup_answers_from_the_store(feature: FeatureClient) -> None:
    resp = await feature.get_features("u1", ["i1", "i404"], T0)
    assert list(resp.degraded) == []
    assert row_values(resp.user)["age_band"] == "25-34"
    assert list(resp.items.entity_ids) == ["i1", "i404"]
    assert await feature.popular(2) == [("i1", 5.0), ("i2", 1.0)]


async def test_a_store_out_of_reach_degrades_the_answer(demo_feature_set: FeatureSet) -> None:
    dead_url = "redis://127.0.0.1:1/0"
    dead = connect(dead_url, 2)
    try:
        async for client in _serve(FeatureStore(dead, demo_feature_set), dead_url):
            resp = await client.get_features("u1", ["i1"], T0)
            assert list(resp.degraded) == ["realtime_store_unavailable"]
            assert row_values(resp.user)["age_band"] == "unknown", "the declared default"
    finally:
        await dead.aclose()
