"""The gateway app in-process (httpx ASGI transport) against real services."""

from __future__ import annotations

import httpx

from recmesh.clients import FeatureClient, RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.app import GatewayDeps, create_app
from services.gateway.events import EventPublisher
from services.gateway.recommend import Recommender
from tests.helpers import free_port
from tests.integration.conftest import Mesh


async def test_dead_ranker_falls_back_to_held_popular_items(mesh: Mesh) -> None:
    dead = RankerClient(f"127.0.0.1:{free_port()}", "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    recommender = Recommender(dead, features, max_count=100)
    assert await recommender.refresh_popular()
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.5)
    app = create_app(GatewaySettings(), GatewayDeps(recommender, publisher, {"ranker": dead.health}))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            resp = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5},
                                   headers={"x-slo-class": "A"})  # fmt: skip
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["degraded"] == ["ranker_unavailable"] and body["model_version"] == "popularity"
            popular = await features.popular(5, cap_s=1.0)
            assert [i["item_id"] for i in body["items"]] == [i for i, _ in popular]

            ready = await http.get("/readyz")
            assert ready.status_code == 503 and ready.json()["checks"]["ranker"] is False

            events = await http.post("/v1/events", json={"events": [
                {"event_id": "e", "user_id": "u1", "item_id": "i1", "behavior": "view", "event_time": 1}
            ]})  # fmt: skip
            assert events.status_code == 503, "no broker: the events must not be accepted"

            bad = await http.post("/v1/recommend", json={"user_id": "u1", "count": 0})
            assert bad.status_code == 400 and "count" in bad.json()["message"]
    finally:
        await dead.close()
        await features.close()
        await publisher.stop()
