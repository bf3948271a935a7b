"""The gateway app in-process (httpx ASGI transport) against real services."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest

from recmesh.clients.feature import FeatureClient
from recmesh.clients.ranker import RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.app import GatewayDeps, create_app
from services.gateway.cold import DependencyState, build_cold_guard
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from tests.helpers import free_port
from tests.integration.conftest import Mesh


async def test_dead_ranker_falls_back_to_held_popular_items(mesh: Mesh) -> None:
    dead = RankerClient(f"127.0.0.1:{free_port()}", "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    recommender = Recommender(dead, features, max_count=100)
    assert await recommender.refresh_popular()
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.5)
    app = create_app(
        GatewaySettings(),
        GatewayDeps(
            recommender, ClassPolicy.from_settings(GatewaySettings()), publisher, {"ranker": dead.health}
        ),
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            resp = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5},
                                   headers={"x-slo-class": "A"})  # fmt: skip
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["degraded"] == ["slo_class_downgraded:A->B", "ranker_unavailable"]
            assert body["model_version"] == "popularity"
            popular = await features.popular(5, cap_s=1.0)
            assert [i["item_id"] for i in body["items"]] == [i for i, _ in popular]

            # Ready all the same: it answers from the fallback (services/gateway/readiness.py).
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.json()["checks"]["ranker"] is False
            assert ready.json()["fallback"]["items"] > 0

            events = await http.post("/v1/events", json={"events": [
                {"event_id": "e", "user_id": "u1", "item_id": "i1", "behavior": "view",
                 "event_time": 1_767_225_600_000}
            ]})  # fmt: skip
            assert events.status_code == 503, "no broker: the events must not be accepted"

            bad = await http.post("/v1/recommend", json={"user_id": "u1", "count": 0})
            assert bad.status_code == 400 and "count" in bad.json()["message"]
    finally:
        await dead.close()
        await features.close()
        await publisher.stop()


async def test_entitlement_caps_the_class_end_to_end(mesh: Mesh) -> None:
    settings = GatewaySettings.model_validate(
        {
            "RECMESH_API_KEYS": {
                "k-a": {"tenant": "app", "max_class": "A"},
                "k-c": {"tenant": "batch", "max_class": "C"},
            }
        }
    )
    ranker = RankerClient(mesh.ranker.address, "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    recommender = Recommender(ranker, features, max_count=100)
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.5)
    app = create_app(settings, GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {}))
    body = {"user_id": "u3", "count": 3}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            ok = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "A", "x-api-key": "k-a"})
            assert (
                ok.status_code == 200 and ok.json()["slo_class"] == "A" and ok.headers["x-slo-class"] == "A"
            )
            capped = await http.post(
                "/v1/recommend", json=body, headers={"x-slo-class": "A", "x-api-key": "k-c"}
            )
            assert capped.json()["slo_class"] == "C"
            assert "slo_class_downgraded:A->C" in capped.json()["degraded"]
            anon = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "A"})
            assert anon.json()["slo_class"] == "B", "a header alone does not buy class A"
            bad = await http.post("/v1/recommend", json=body, headers={"x-api-key": "stolen?"})
            assert bad.status_code == 401 and bad.json()["error"] == "Unauthenticated"
            metrics = generate_latest().decode()
            assert 'method="POST /v1/recommend",service="gateway",slo_class="C"' in metrics
    finally:
        await ranker.close()
        await features.close()
        await publisher.stop()


async def test_a_rest_caller_can_tighten_its_deadline(mesh: Mesh) -> None:
    ranker = RankerClient(mesh.ranker.address, "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    settings = GatewaySettings.model_validate({"RECMESH_MAY_BE_COLD": ["ranker"]})
    cold = build_cold_guard(settings, {"ranker": ranker.health})
    assert cold is not None
    recommender = Recommender(ranker, features, max_count=100, cold=cold)
    assert await recommender.refresh_popular()
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.5)
    app = create_app(settings, GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {}))
    body = {"user_id": "u3", "count": 3}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            roomy = await http.post("/v1/recommend", json=body, headers={"x-request-timeout-ms": "5000"})
            assert roomy.status_code == 200 and roomy.json()["model_version"] != "popularity", roomy.text
            assert cold.watches["ranker"].state() is DependencyState.WARM
            # 1 ms leaves no time to call the ranker: the held popular list answers at once.
            tight = await http.post("/v1/recommend", json=body, headers={"x-request-timeout-ms": "1"})
            assert tight.status_code == 200, tight.text
            assert "ranker_timeout" in tight.json()["degraded"], "out of time, not the ranker's fault"
            assert tight.json()["model_version"] == "popularity"
            assert cold.watches["ranker"].state() is DependencyState.WARM, "a caller's deadline is no outage"
            for bad in ("soon", "0", "-5"):
                resp = await http.post("/v1/recommend", json=body, headers={"x-request-timeout-ms": bad})
                assert resp.status_code == 400 and "x-request-timeout-ms" in resp.json()["message"], resp.text
    finally:
        await ranker.close()
        await features.close()
        await publisher.stop()
        await cold.close()
