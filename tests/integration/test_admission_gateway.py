"""The gateway under (simulated) overload against real services: C and B get
429 + Retry-After before the body is read, A is served, and an anonymous caller
asking for A is treated as the B it is entitled to, so it is shed too."""

from __future__ import annotations

import httpx
from prometheus_client import generate_latest

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.clients.feature import FeatureClient
from recmesh.clients.ranker import RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from tests.helpers import free_port
from tests.integration.conftest import Mesh


async def test_lagging_gateway_sheds_c_and_b_serves_a_and_escalation_gets_no_protection(mesh: Mesh) -> None:
    settings = GatewaySettings.model_validate(
        {"RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}}
    )
    gate = AdmissionGate(AdmissionConfig(loop_lag_limit_ms=20.0, retry_after_s=2), service="gateway")
    ranker = RankerClient(mesh.ranker.address, "gateway")
    features = FeatureClient(mesh.feature.address, "gateway")
    recommender = Recommender(ranker, features, 100)
    publisher = EventPublisher(f"127.0.0.1:{free_port()}", "unused", 0.1)
    deps = GatewayDeps(recommender, ClassPolicy.from_settings(settings), publisher, {}, gate=gate)
    app = create_app(settings, deps)
    body = {"user_id": "u5", "count": 3}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
            for _ in range(20):
                gate.record_loop_lag(500.0)  # the gateway's own loop is far behind
            shed_c = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "C"})
            assert shed_c.status_code == 429 and shed_c.headers["retry-after"] == "2"
            assert shed_c.json()["error"] == "ResourceExhausted" and "loop_lag" in shed_c.json()["message"]
            escalated = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "A"})
            assert escalated.status_code == 429 and escalated.headers["x-slo-class"] == "B", (
                "without entitlement a header asking for A is B, and B is shed here"
            )
            served = await http.post(
                "/v1/recommend", json=body, headers={"x-slo-class": "A", "x-api-key": "k-a"}
            )
            assert served.status_code == 200 and served.json()["slo_class"] == "A"
            bad = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "Q"})
            assert bad.status_code == 400, "a bad class still gets its 400, not a 429"
            metrics = generate_latest().decode()
            assert (
                'recmesh_admission_shed_total{reason="loop_lag",service="gateway",slo_class="C"}' in metrics
            )
            assert 'method="POST /v1/recommend",service="gateway",slo_class="C"' in metrics
    finally:
        await ranker.close()
        await features.close()
