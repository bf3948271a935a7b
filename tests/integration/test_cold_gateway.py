"""The gateway meets an inference service that is scaled to zero, then starts.

Real parts: the feature service and a ranker in-process on sockets, the
gateway app over ASGI, and inference as its own process started late, the way
Knative starts a replica from zero. Class A gets the popularity fallback at
once (no wait); a class-C request waits while inference comes up and is scored
by the model; after that class A is scored too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
from prometheus_client import REGISTRY

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.grpcserver import MeshServer
from recmesh.settings import GatewaySettings, RankerSettings
from recmesh.slo import ClassDecision, SloClass
from services.gateway.app import GatewayDeps, create_app
from services.gateway.cold import build_cold_guard
from services.gateway.edge import Caller, ClassPolicy, Edge
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port
from tests.integration.conftest import Mesh

# Class C's real budget is 3 s and inference starts in about 1.2 s here; the
# test widens C (budget and tolerated wait) so a loaded CI machine cannot turn
# a slow process start into a flaky failure. Class A keeps its real 300 ms.
PATIENT_C = Caller(ClassDecision(SloClass("C", 20_000, "best effort, patient for this test"), "C"), "test")


CLASS_A = {"x-slo-class": "A", "x-api-key": "k-a"}


def _count(action: str, slo_class: str) -> float:
    labels = {"dependency": "inference", "action": action, "slo_class": slo_class}
    return REGISTRY.get_sample_value("recmesh_gateway_cold_decisions_total", labels) or 0.0


def _waits_served(slo_class: str) -> float:
    labels = {"dependency": "inference", "outcome": "serving", "slo_class": slo_class}
    return REGISTRY.get_sample_value("recmesh_gateway_cold_wait_seconds_count", labels) or 0.0


async def _start_ranker(
    mesh: Mesh, inference_addr: str, ranker_dir: Path
) -> tuple[MeshServer, FeatureClient, InferenceClient]:
    """A serving ranker in-process over the mesh's feature service and inference at
    `inference_addr` (not running yet); with its two clients, for the caller to close."""
    ranker_features = FeatureClient(mesh.feature.address, "ranker")
    ranker_inference = InferenceClient(inference_addr, "ranker")
    ranker_settings = RankerSettings(ranker_port=free_port(), model_dir=ranker_dir)
    pipeline = build_pipeline(ranker_settings, ranker_features, ranker_inference, mesh.store.feature_set)
    ranker = build_ranker(ranker_settings, pipeline)
    await ranker.start()
    await ranker.set_serving()
    return ranker, ranker_features, ranker_inference


async def test_class_a_falls_back_at_once_and_class_c_waits_for_a_late_inference(
    mesh: Mesh, model_dir: Path, tmp_path: Path
) -> None:
    inference_port = free_port()
    inference_addr = f"127.0.0.1:{inference_port}"
    ranker, ranker_features, ranker_inference = await _start_ranker(mesh, inference_addr, tmp_path)

    settings = GatewaySettings.model_validate(
        {
            "RECMESH_MAY_BE_COLD": ["inference"],
            "RECMESH_COLD_WAIT_S_BY_CLASS": {"B": 0.0, "C": 15.0},
            "RECMESH_COLD_WAKE_TIMEOUT_S": 1.0,
            "RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}},
        }
    )
    rc = RankerClient(ranker.address, "gateway")
    fc = FeatureClient(mesh.feature.address, "gateway")
    ic = InferenceClient(inference_addr, "gateway")
    cold = build_cold_guard(settings, {"ranker": rc.health, "inference": ic.health})
    assert cold is not None
    recommender = Recommender(rc, fc, 100, cold=cold)
    assert await recommender.refresh_popular()
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.5)
    app = create_app(settings, GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {}))
    env = dict(
        os.environ,
        INFERENCE_PORT=str(inference_port),
        INFERENCE_METRICS_PORT=str(free_port()),
        RECMESH_MODEL_DIR=str(model_dir),
        RECMESH_LOG_LEVEL="WARNING",
    )
    proc: subprocess.Popen[bytes] | None = None
    body = {"user_id": "u1", "count": 5}
    a_fallbacks, c_waits, c_served = _count("fallback", "A"), _count("waited", "C"), _waits_served("C")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            # Inference is not running: class A takes the fallback without waiting.
            first_a = await http.post("/v1/recommend", json=body, headers=CLASS_A)
            assert first_a.status_code == 200, first_a.text
            assert first_a.json()["slo_class"] == "A"
            assert "inference_cold" in first_a.json()["degraded"]
            # The ranker was told to skip scoring: it did not try (and fail) to reach inference.
            assert "scoring_unavailable" not in first_a.json()["degraded"]
            assert first_a.json()["model_version"] == "recall", "the ranker's unscored recall order"
            assert _count("fallback", "A") == a_fallbacks + 1
            await asyncio.sleep(1.2)  # let the bounded background wake-up give up (1 s)

            # Inference starts now; the class-C request is sent at the same moment and waits for it.
            with (tmp_path / "inference.log").open("wb") as log:
                proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
                    [sys.executable, "-m", "services.inference"], env=env, stdout=log, stderr=log
                )
            assert not await ic.health(0.2), "inference must not be serving before class C asks"
            async with Edge(ClassPolicy.from_settings(settings)).admit(PATIENT_C) as admitted:
                c = await recommender.recommend("u1", 5, {}, admitted)
            assert proc.poll() is None, (tmp_path / "inference.log").read_text()
            assert "inference_cold" not in c.degraded and "scoring_unavailable" not in c.degraded, c.degraded
            assert c.model_version.startswith("ctr-")
            assert _count("waited", "C") == c_waits + 1
            assert _waits_served("C") == c_served + 1

            # Seen serving by the class-C request: class A is scored now.
            second_a = await http.post("/v1/recommend", json=body, headers=CLASS_A)
            assert second_a.status_code == 200, second_a.text
            assert "inference_cold" not in second_a.json()["degraded"], "routed to inference, not skipped"
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        await cold.close()
        await publisher.stop()
        for client in (rc, fc, ic, ranker_features, ranker_inference):
            await client.close()
        await ranker.stop(0.5)
