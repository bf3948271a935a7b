"""python -m services.inference: run the InferenceService gRPC server (recmesh.service).

Start-up order (cold start = process start -> SERVING): bind the port with
health NOT_SERVING, load and warm the CTR model, SERVING; only then load the
text models (server.load_text_into), so Score never waits for them. A failed
text-model load stops the process, as it did when it ran before SERVING.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from recmesh.features.repository import served_feature_set
from recmesh.service import Job, Parts, run_service
from recmesh.settings import InferenceSettings
from recmesh.telemetry import process_age_s
from services.inference.model import ModelRegistry
from services.inference.pressure import GpuProbe
from services.inference.server import build_batcher, build_server, load_text_into
from services.inference.textmodels import TextSlot

_log = structlog.get_logger("recmesh.inference")


def builder(started: float) -> Callable[[InferenceSettings], Awaitable[Parts]]:
    """`build` for run_service; `started`: perf_counter once the imports were done."""

    async def build(settings: InferenceSettings) -> Parts:
        feature_set = served_feature_set(settings.repository, "inference")
        registry = ModelRegistry(settings.model_dir, settings.intra_op_threads, feature_set)
        batcher = build_batcher(settings)
        text = TextSlot()
        server = build_server(settings, registry, batcher, GpuProbe(), text)

        async def warm() -> None:
            model = await asyncio.to_thread(registry.load_current)
            _log.info("cold_start", seconds=round(process_age_s() or time.perf_counter() - started, 3),
                      after_imports_s=round(time.perf_counter() - started, 3), version=model.version,
                      provider=model.provider)  # fmt: skip

        async def load_text() -> None:
            try:
                await load_text_into(text, settings, server)
            except Exception as err:
                _log.error("text_models_failed", error=repr(err))
                raise

        # The batcher runs until the server has drained in-flight requests (background
        # loops stop after the server); the text models load once Score is SERVING.
        return Parts(
            server,
            warm=warm,
            background=[*([batcher.run] if batcher is not None else []), registry.follow],
            after_serving=[Job("text models", load_text)],
        )

    return build


if __name__ == "__main__":
    t0 = time.perf_counter()
    run_service("inference", InferenceSettings(), builder(t0), redis=False)
