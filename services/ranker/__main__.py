"""python -m services.ranker: run the RankerService gRPC server (recmesh.service)."""

from __future__ import annotations

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.features.repository import served_feature_set
from recmesh.service import Parts, run_service
from recmesh.settings import RankerSettings
from services.ranker.graph import PipelineGraphError
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server


async def build(settings: RankerSettings) -> Parts:
    features = FeatureClient(settings.feature_addr, "ranker", settings.hop_margin_ms)
    inference = InferenceClient(settings.inference_addr, "ranker", settings.hop_margin_ms)
    feature_set = served_feature_set(settings.repository, "ranker")
    try:
        pipeline = build_pipeline(settings, features, inference, feature_set)
    except PipelineGraphError as err:
        raise SystemExit(f"ranker: bad ranking graph: {err}") from None
    # The ranker is useful as soon as it can answer (its fallbacks cover slow
    # or missing downstreams), so it reports SERVING once it listens: no warm-up.
    return Parts(build_server(settings, pipeline), closers=[features.close, inference.close])


if __name__ == "__main__":
    run_service("ranker", RankerSettings(), build, redis=False)  # the ranker never talks to Redis
