"""python -m services.inference: run the InferenceService gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from prometheus_client import start_http_server

from recmesh.grpcserver import wait_for_shutdown_signal
from recmesh.settings import InferenceSettings
from recmesh.telemetry import setup_logging, setup_tracing
from services.inference.model import ModelRegistry
from services.inference.pressure import GpuProbe
from services.inference.server import build_batcher, build_server
from services.inference.textmodels import load_text_models

_log = structlog.get_logger("recmesh.inference")


async def main(settings: InferenceSettings, started: float) -> None:
    registry = ModelRegistry(settings.model_dir, settings.intra_op_threads)
    batcher = build_batcher(settings)
    text = await asyncio.to_thread(load_text_models, settings)
    for note in text.notes:
        _log.info("text_models", note=note)
    _log.info("text_models_loaded", embedding=text.embedder.model if text.embedder else None,
              embedding_backend=text.embedder.backend if text.embedder else None,
              generation=text.generator.model if text.generator else None)  # fmt: skip
    server = build_server(settings, registry, batcher, GpuProbe(), text)
    batch_task = asyncio.create_task(batcher.run()) if batcher is not None else None
    await server.start()
    model = await asyncio.to_thread(registry.load_current)
    await server.set_serving()
    _log.info("cold_start", seconds=round(time.perf_counter() - started, 3), version=model.version,
              provider=model.provider)  # fmt: skip
    follower = asyncio.create_task(registry.follow())
    await wait_for_shutdown_signal()
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    await server.stop(settings.shutdown_grace_s)
    if batch_task is not None:
        batch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await batch_task


if __name__ == "__main__":
    t0 = time.perf_counter()
    cfg = InferenceSettings()
    setup_logging("inference", cfg.log_level, cfg.log_format)
    setup_tracing("inference")
    start_http_server(cfg.metrics_port, addr=cfg.bind_host)
    asyncio.run(main(cfg, t0))
