"""python -m services.ranker: run the RankerService gRPC server."""

from __future__ import annotations

import gc

from recmesh import eventloop
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.features.repository import serving_repository
from recmesh.grpcserver import wait_for_shutdown_signal
from recmesh.metrics_http import start_metrics_server
from recmesh.security import process_tls
from recmesh.settings import RankerSettings
from recmesh.telemetry import setup_logging, setup_tracing
from services.ranker.graph import PipelineGraphError
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server


async def main(settings: RankerSettings) -> None:
    features = FeatureClient(settings.feature_addr, "ranker", settings.hop_margin_ms)
    inference = InferenceClient(settings.inference_addr, "ranker", settings.hop_margin_ms)
    fs = serving_repository(settings.repository, "ranker")
    try:
        pipeline = build_pipeline(settings, features, inference, fs)
    except PipelineGraphError as err:
        raise SystemExit(f"ranker: bad ranking graph: {err}") from None
    server = build_server(settings, pipeline)
    await server.start()
    # What start-up built (modules, descriptors, the graph, the index) lives as
    # long as the process: out of the collector's reach, so full collections
    # stay short under load (as in the feature service).
    gc.collect()
    gc.freeze()
    # The ranker is useful as soon as it can answer (its fallbacks cover slow
    # or missing downstreams), so it reports SERVING right away.
    await server.set_serving()
    await wait_for_shutdown_signal()
    await server.stop(settings.shutdown_grace_s)
    await features.close()
    await inference.close()


if __name__ == "__main__":
    cfg = RankerSettings()
    setup_logging("ranker", cfg.log_level, cfg.log_format)
    setup_tracing("ranker", redis=False, flush_s=cfg.telemetry_flush_s)  # the ranker never talks to Redis
    process_tls()  # certificates read (or plaintext said) before anything listens
    start_metrics_server(cfg.metrics_port, addr=cfg.bind_host)  # /metrics, /healthz, /readyz
    eventloop.run(main(cfg))
