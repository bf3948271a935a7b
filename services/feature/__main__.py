"""python -m services.feature: run the FeatureService gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import structlog
from redis.exceptions import RedisError

from recmesh.features.repository import serving_repository
from recmesh.metrics_http import start_metrics_server
from recmesh.redis_client import connect
from recmesh.resilience import retry_until
from recmesh.security import process_tls
from recmesh.settings import FeatureSettings
from recmesh.telemetry import setup_logging, setup_tracing
from services.feature.item_cache import ItemReadCache
from services.feature.served_log import served_log_from
from services.feature.server import build_server
from services.feature.store import FeatureStore


async def main(settings: FeatureSettings) -> None:
    from recmesh.grpcserver import wait_for_shutdown_signal

    fs = serving_repository(settings.repository, "feature")
    client = connect(settings.redis_url, settings.redis_max_connections)
    item_reads = ItemReadCache(settings.item_cache_ms)
    store = FeatureStore(client, fs, item_reads=item_reads)
    follow_task = asyncio.create_task(item_reads.follow(client))
    served_log = served_log_from(settings, fs.version)
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(served_log.run(stop_log)) if served_log is not None else None
    server = build_server(settings, store, served_log)
    await server.start()
    # NOT_SERVING until Redis answers, so probes and `recmesh up` wait for it.
    await retry_until(store.prepare, "redis", retry_on=(RedisError, OSError))
    # Everything built so far (modules, protobuf descriptors, the server) lives
    # for the whole process: move it out of the collector's reach so full
    # collections stay short (GC pauses dominate Python tail latency).
    gc.collect()
    gc.freeze()
    await server.set_serving()
    await wait_for_shutdown_signal()
    await server.stop(settings.shutdown_grace_s)
    follow_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follow_task
    if log_task is not None:
        stop_log.set()
        await asyncio.wait_for(log_task, 10)
    await client.aclose()


if __name__ == "__main__":
    cfg = FeatureSettings()
    setup_logging("feature", cfg.log_level, cfg.log_format)
    setup_tracing("feature", flush_s=cfg.telemetry_flush_s)
    process_tls()  # certificates read (or plaintext said) before anything listens
    start_metrics_server(cfg.metrics_port, addr=cfg.bind_host)  # /metrics, /healthz, /readyz
    structlog.get_logger().info("starting", settings=cfg.model_dump(mode="json"))
    asyncio.run(main(cfg))
