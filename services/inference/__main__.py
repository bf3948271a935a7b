"""python -m services.inference: run the InferenceService gRPC server.

Start-up order (cold start = process start -> SERVING): bind the port with
health NOT_SERVING, load and warm the CTR model, SERVING; only then load the
text models (server.load_text_into), so Score never waits for them. A failed
text-model load stops the process, as it did when it ran before SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from recmesh.features.repository import serving_repository
from recmesh.grpcserver import wait_for_shutdown_signal
from recmesh.metrics_http import start_metrics_server
from recmesh.security import process_tls
from recmesh.settings import InferenceSettings
from recmesh.telemetry import process_age_s, setup_logging, setup_tracing
from services.inference.model import ModelRegistry
from services.inference.pressure import GpuProbe
from services.inference.server import build_batcher, build_server, load_text_into
from services.inference.textmodels import TextSlot

_log = structlog.get_logger("recmesh.inference")


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged already
        await task


async def main(settings: InferenceSettings, started: float) -> None:
    fs = serving_repository(settings.repository, "inference")
    registry = ModelRegistry(settings.model_dir, settings.intra_op_threads, fs)
    batcher = build_batcher(settings)
    text = TextSlot()
    server = build_server(settings, registry, batcher, GpuProbe(), text)
    batch_task = asyncio.create_task(batcher.run()) if batcher is not None else None
    await server.start()
    model = await asyncio.to_thread(registry.load_current)
    await server.set_serving()
    _log.info("cold_start", seconds=round(process_age_s() or time.perf_counter() - started, 3),
              after_imports_s=round(time.perf_counter() - started, 3), version=model.version,
              provider=model.provider)  # fmt: skip
    loading = asyncio.create_task(load_text_into(text, settings, server))
    follower = asyncio.create_task(registry.follow())
    stop = asyncio.create_task(wait_for_shutdown_signal())
    pending: set[asyncio.Task[None]] = {stop, loading}
    failure: BaseException | None = None
    while stop in pending and failure is None:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        failure = loading.exception() if loading.done() else None
    if failure is not None:
        _log.error("text_models_failed", error=repr(failure))
    for task in (follower, loading, stop):
        await _cancel(task)
    await server.stop(settings.shutdown_grace_s)  # the batcher runs until in-flight requests finish
    if batch_task is not None:
        await _cancel(batch_task)
    if failure is not None:
        raise failure


if __name__ == "__main__":
    t0 = time.perf_counter()
    cfg = InferenceSettings()
    setup_logging("inference", cfg.log_level, cfg.log_format)
    setup_tracing("inference", redis=False, flush_s=cfg.telemetry_flush_s)
    process_tls()  # certificates read (or plaintext said) before anything listens
    start_metrics_server(cfg.metrics_port, addr=cfg.bind_host)  # /metrics, /healthz, /readyz
    asyncio.run(main(cfg, t0))
