"""python -m services.attribution: the attribution consumer (services/attribution/consumer.py)
and, beside it, the experiment guard (services/attribution/guard.py)."""

from __future__ import annotations

import asyncio

import structlog
from redis.exceptions import RedisError

from recmesh.features.repository import served_feature_set
from recmesh.redis_client import connect
from recmesh.resilience import retry_until
from recmesh.service import until_stopped
from recmesh.settings import AttributionSettings
from services.attribution.consumer import running
from services.attribution.guard import ExperimentGuard, watch
from services.attribution.store import AttributionStore

_log = structlog.get_logger("recmesh.attribution")


async def main(settings: AttributionSettings) -> None:
    feature_set = served_feature_set(settings.repository, "attribution")
    client = connect(settings.redis_url, settings.redis_max_connections)
    store = AttributionStore(
        client, feature_set.evaluation, settings.grace_s * 1000, settings.retention_s * 1000
    )

    declared = feature_set.evaluation.guard if settings.guard else None
    guard = ExperimentGuard(client, settings.model_dir, declared)
    if feature_set.evaluation.guard is None:
        _log.info("guard_off", detail="no [evaluation.guard]: experiments end only by hand")
    elif not settings.guard:
        _log.info("guard_off", detail="RECMESH_GUARD=off: figures only, experiments end only by hand")

    async def consume(stop: asyncio.Event, started: asyncio.Event) -> int:
        await retry_until(client.ping, "redis", retry_on=(RedisError, OSError))
        async with running(settings, store, feature_set.event_schema) as attributor:
            started.set()
            assert attributor.task is not None
            guarding = asyncio.create_task(watch(guard))  # its failures are logged, never fatal
            try:
                stopped = asyncio.create_task(stop.wait())
                await asyncio.wait({stopped, attributor.task}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
            finally:
                guarding.cancel()
                await asyncio.wait({guarding})  # its end, without taking its cancellation for ours
            if attributor.task.done():
                attributor.task.result()  # a failure ends the process, non-zero
        return attributor.finalised

    finalised = await until_stopped(consume)
    if finalised is not None:
        _log.info("stopped", finalised=finalised)
    await client.aclose()


if __name__ == "__main__":
    from prometheus_client import start_http_server

    from recmesh.telemetry import setup_logging, setup_tracing

    cfg = AttributionSettings()
    setup_logging("attribution", cfg.log_level, cfg.log_format)
    setup_tracing("attribution", flush_s=cfg.telemetry_flush_s)
    start_http_server(cfg.metrics_port, addr=cfg.bind_host)
    asyncio.run(main(cfg))
