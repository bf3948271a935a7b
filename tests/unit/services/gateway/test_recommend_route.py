"""POST /v1/recommend's plain ASGI route: what it refuses before any downstream
is called, and that every other route still reaches FastAPI. (Served
recommendations, fallbacks and shedding are covered against real services in
tests/integration/test_gateway.py and test_admission_gateway.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import REGISTRY

from recmesh.clients.feature import FeatureClient
from recmesh.clients.ranker import RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy, field_path
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.gateway.recommend_route import MAX_BODY_BYTES, is_json
from tests.helpers import free_port

SETTINGS = GatewaySettings.model_validate({"RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}})


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: no request here may reach a downstream
    ranker, features = RankerClient(nowhere, "gateway"), FeatureClient(nowhere, "gateway")
    deps = GatewayDeps(
        Recommender(ranker, features, SETTINGS.max_count),
        ClassPolicy.from_settings(SETTINGS),
        EventPublisher(nowhere, "unused", 0.1),
        {},
    )
    app = create_app(SETTINGS, deps)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client
    await ranker.close()
    await features.close()


def _count(slo_class: str, code: str) -> float:
    value = REGISTRY.get_sample_value(
        "recmesh_request_duration_seconds_count",
        {"service": "gateway", "method": "POST /v1/recommend", "slo_class": slo_class, "code": code},
    )
    return value or 0.0


async def test_bad_bodies_are_400_naming_the_field(http: httpx.AsyncClient) -> None:
    before = _count("none", "400")
    cases = {
        '{"user_id": "u1", "count": 0}': "count: Input should be greater than or equal to 1",
        '{"user_id": "u1", "count": "3"}': "count: Input should be a valid integer",
        '{"user_id": ""}': "user_id: String should have at least 1 character",
        '{"user_id": "u1", "colour": "red"}': "colour: Extra inputs are not permitted",
        '{"user_id": "u1", "context": {"q": 1}}': "context.q: Input should be a valid string",
        '{"user_id": "u1",': "body: Invalid JSON",
        "[]": "body: Input should be an object",
    }
    for raw, message in cases.items():
        resp = await http.post("/v1/recommend", content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400, raw
        assert resp.json()["error"] == "InvalidArgument"
        assert resp.json()["message"].startswith(message), (raw, resp.json())
    assert _count("none", "400") == before + len(cases)


async def test_content_type_must_be_json(http: httpx.AsyncClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        resp = await http.post("/v1/recommend", content=b'{"user_id": "u1"}', headers=headers)
        assert resp.status_code == 400 and "application/json" in resp.json()["message"], content_type


async def test_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    raw = b'{"user_id": "u1", "context": {"q": "' + b"x" * MAX_BODY_BYTES + b'"}}'
    resp = await http.post("/v1/recommend", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"] == "PayloadTooLarge"


async def test_class_errors_after_a_valid_body(http: httpx.AsyncClient) -> None:
    body = {"user_id": "u1", "count": 3}
    before = _count("invalid", "400")
    unknown = await http.post("/v1/recommend", json=body, headers={"x-slo-class": "Q"})
    assert unknown.status_code == 400 and "x-slo-class" in unknown.json()["message"].lower()
    assert _count("invalid", "400") == before + 1
    stolen = await http.post("/v1/recommend", json=body, headers={"x-api-key": "stolen?"})
    assert stolen.status_code == 401 and stolen.json()["error"] == "Unauthenticated"
    # A bad body is reported first, as FastAPI did: the field, not the class.
    both = await http.post("/v1/recommend", json={"user_id": "u1", "count": 0}, headers={"x-slo-class": "Q"})
    assert both.status_code == 400 and both.json()["message"].startswith("count:")


async def test_count_above_the_gateway_maximum_is_400(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/recommend", json={"user_id": "u1", "count": SETTINGS.max_count + 1})
    assert resp.status_code == 400 and "count" in resp.json()["message"]


async def test_other_routes_and_methods_reach_fastapi(http: httpx.AsyncClient) -> None:
    assert (await http.get("/v1/recommend")).status_code == 405
    assert (await http.get("/healthz")).json() == {"status": "alive"}
    schema = (await http.get("/openapi.json")).json()
    assert "post" in schema["paths"]["/v1/recommend"], "the route stays documented"


def test_field_path_and_content_types() -> None:
    assert field_path(("body", "context", "q")) == "context.q"
    assert field_path(("body", "items", 0, "id")) == "items[0].id"
    assert field_path(("body",)) == field_path(()) == "body"
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert is_json("application/merge-patch+json")
    assert not is_json(None) and not is_json("text/json") and not is_json("application/jsonx")
