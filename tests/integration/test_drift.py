"""State-drift signals through the real consumer: a real Tansu broker, a real redis-server.

A steady trickle first, then a burst of events that queued upstream for 20 s:
the processing delay jumps past the 15 s alarm and the state size per family
grows by exactly the burst, at a rate far past 25 %/min.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as redis
from prometheus_client import REGISTRY

from recmesh.events import Event
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.settings import IngestSettings
from services.feature.ingest import running
from services.feature.store import FeatureStore
from tests.helpers import poll_until, produce_events, write_events


def _gauge(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, name
    return value


def _events(prefix: str, n: int, event_time_ms: int) -> list[dict[str, object]]:
    return [
        {"event_id": f"{prefix}{i}", "user_id": f"du{i % 400}", "item_id": f"di{i % 300}",
         "behavior": "click" if i % 5 == 0 else "view", "event_time": event_time_ms - i % 1000}
        for i in range(n)
    ]  # fmt: skip


async def test_a_burst_moves_processing_delay_and_state_growth(
    kafka_bootstrap: str, scratch_redis_url: str, redis_client: redis.Redis, topics: dict[str, str]
) -> None:
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client, load_feature_set(DEMO_REPOSITORY))
    now = int(time.time() * 1000)
    # Existing state, so growth is measured against a real base (above the floor).
    await write_events(store, [Event.model_validate(e) for e in _events("base", 4000, now - 60_000)])
    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}", state_sample_s=0.2,
    )  # fmt: skip
    delays: list[tuple[int, float]] = []

    def on_applied(events: list[Event], applied_at: float) -> None:
        delays.append((len(events), _gauge("recmesh_ingest_processing_delay_seconds")))

    try:
        async with running(settings, store, on_applied=on_applied) as ingestor:
            sizer = ingestor.sizer
            assert sizer is not None
            await produce_events(
                kafka_bootstrap, topics["events"], _events("live", 200, int(time.time() * 1000))
            )
            await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 200), "trickle applied", 20)
            steady_delay = max(d for _, d in delays)
            passes = sizer.passes
            await poll_until(lambda: asyncio.sleep(0, sizer.passes >= passes + 2), "two scans", 20)
            before = _gauge("recmesh_feature_state_events", family="user:ids")
            delays.clear()

            burst = _events("burst", 6000, int(time.time() * 1000) - 20_000)
            await produce_events(kafka_bootstrap, topics["events"], burst)
            await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 6200), "burst applied", 30)
            passes = sizer.passes
            await poll_until(lambda: asyncio.sleep(0, sizer.passes >= passes + 2), "two scans", 20)
            after = _gauge("recmesh_feature_state_events", family="user:ids")
            growth = _gauge("recmesh_feature_state_growth_pct_per_min", family="user:ids")
    finally:
        await client.aclose()

    burst_delay = max(d for _, d in delays)
    assert steady_delay < 15, steady_delay  # not alarming before the burst
    assert burst_delay > 15, delays  # alarm threshold crossed
    assert burst_delay > steady_delay + 10
    assert after - before == 6000  # every burst event is one member of its user's events key
    assert growth > 25, growth
