"""`create_app` (services/gateway/app.py): what it returns is the FastAPI app
that is served, FastAPI's own router serves POST /v1/recommend by the same
lean route, and every route takes its class from one decision per request.
(Each route's answers: test_recommend_route.py, test_openapi.py;
against real services: tests/integration/test_gateway.py, test_ai_tools.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.ai_tool_calls import AiTools
from services.gateway.app import GatewayApp, GatewayDeps, create_app
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from tests.helpers import CountingPolicy, free_port

SETTINGS = GatewaySettings.model_validate({"RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}})
TEXT = "One fact here. Another fact there. A third fact."


@dataclass
class Built:
    app: GatewayApp
    policy: CountingPolicy


@pytest.fixture
async def built() -> AsyncIterator[Built]:
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: every downstream call fails fast
    ranker, features = RankerClient(nowhere, "gateway"), FeatureClient(nowhere, "gateway")
    inference = InferenceClient(nowhere, "gateway_ai_tool")
    policy = CountingPolicy.from_settings(SETTINGS)
    deps = GatewayDeps(
        Recommender(ranker, features, SETTINGS.max_count),
        policy,
        EventPublisher(nowhere, "unused", 0.1),
        {},
        AiTools(inference, SETTINGS.ai_tool),
    )
    yield Built(create_app(SETTINGS, deps), policy)
    for client in (ranker, features, inference):
        await client.close()


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")  # type: ignore[arg-type]


async def test_create_app_returns_the_fastapi_app_that_is_served(built: Built) -> None:
    app = built.app
    assert isinstance(app, FastAPI), "the factory returns the app itself, not a wrapper around it"
    assert "post" in app.openapi()["paths"]["/v1/recommend"]
    async with _client(app) as http:
        assert (await http.get("/healthz")).json() == {"status": "alive"}
        resp = await http.post("/v1/recommend", json={"user_id": "u1"}, headers={"x-api-key": "stolen?"})
        assert resp.status_code == 401 and resp.json()["error"] == "Unauthenticated"


async def test_fastapis_router_serves_v1_recommend_by_the_lean_route(built: Built) -> None:
    # FastAPI's own stack, without GatewayApp's shortcut to the lean route: it
    # serves the same answer (the route was declared by a handler raising
    # AssertionError, a 500, before).
    async def through_fastapi(scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(built.app, scope, receive, send)

    async with _client(through_fastapi) as http:
        refused = await http.post("/v1/recommend", json={"user_id": "u1"}, headers={"x-api-key": "stolen?"})
        assert refused.status_code == 401 and refused.json()["error"] == "Unauthenticated"
        bad = await http.post("/v1/recommend", json={"user_id": "u1", "count": 0})
        assert bad.status_code == 400 and bad.json()["message"].startswith("count:")
        wrong_method = await http.get("/v1/recommend")
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"


async def test_every_route_decides_the_class_once_per_request(built: Built) -> None:
    async with _client(built.app) as http:
        # No ranker and no fallback held: a 503, after the class was decided (B, downgraded from A).
        unserved = await http.post("/v1/recommend", json={"user_id": "u1"}, headers={"x-slo-class": "A"})
        assert unserved.status_code == 503 and built.policy.decisions == 1
        summary = await http.post("/v2/ai-tool/summarize", json={"text": TEXT}, headers={"x-slo-class": "A"})
        assert summary.status_code == 200, summary.text
        assert summary.headers["x-slo-class"] == "B" and summary.json()["slo_class"] == "B"
        assert summary.json()["degraded"][0] == "slo_class_downgraded:A->B"
        assert built.policy.decisions == 2
