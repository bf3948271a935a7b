"""python -m services.feature: run the FeatureService gRPC server (recmesh.service)."""

from __future__ import annotations

import asyncio

import structlog
from redis.exceptions import RedisError

from recmesh.features.repository import served_feature_set
from recmesh.redis_client import connect
from recmesh.resilience import retry_until
from recmesh.service import Parts, run_service
from recmesh.settings import FeatureSettings
from services.feature.item_cache import ItemReadCache
from services.feature.served_log import served_log_from
from services.feature.server import build_server
from services.feature.store import FeatureStore

# The most the served-feature log may take to flush what it holds at shutdown.
SERVED_LOG_FLUSH_S = 10.0


async def build(settings: FeatureSettings) -> Parts:
    structlog.get_logger().info("starting", settings=settings.model_dump(mode="json"))
    feature_set = served_feature_set(settings.repository, "feature")
    client = connect(settings.redis_url, settings.redis_max_connections)
    item_reads = ItemReadCache(settings.item_cache_ms)
    store = FeatureStore(client, feature_set, item_reads=item_reads)
    served_log = served_log_from(settings, feature_set.version)
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(served_log.run(stop_log)) if served_log is not None else None

    async def warm() -> None:  # NOT_SERVING until Redis answers, so probes and `recmesh up` wait for it
        await retry_until(store.prepare, "redis", retry_on=(RedisError, OSError))

    async def flush_log() -> None:
        if log_task is not None:
            stop_log.set()
            await asyncio.wait_for(log_task, SERVED_LOG_FLUSH_S)

    return Parts(
        build_server(settings, store, served_log),
        warm=warm,
        background=[lambda: item_reads.follow(client)],
        closers=[flush_log, store.aclose, client.aclose],
    )


if __name__ == "__main__":
    run_service("feature", FeatureSettings(), build, redis=True)
