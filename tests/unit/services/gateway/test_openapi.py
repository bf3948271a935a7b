"""The gateway's OpenAPI document, built as `python -m services.gateway` builds
the app (AI tools included): it is served, it declares every header the
gateway reads, and the answers FastAPI does not make (the plain /v1/recommend
route's 400/401/413 and its shed 429, an AI tool's 429, FastAPI's own refusals)
validate against it. The whole document is checked against a live mesh with
schemathesis in tests/e2e/test_up.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.schemas import BaseSchema

from recmesh.admission import AdmissionConfig, AdmissionGate
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.settings import GatewaySettings
from services.gateway.ai_tool_calls import AiTools, build_tool_gate
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.gateway.recommend_route import MAX_BODY_BYTES
from tests.helpers import free_port

SETTINGS = GatewaySettings.model_validate({"RECMESH_API_KEYS": {"k-a": {"tenant": "app", "max_class": "A"}}})
CLASS_HEADERS = {"x-slo-class", "x-api-key", "x-user-tier", "x-llm-token-budget", "x-request-timeout-ms",
                 "traceparent"}  # fmt: skip


@dataclass
class Gateway:
    http: httpx.AsyncClient
    gate: AdmissionGate
    tool_gate: AdmissionGate


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: no request here reaches a downstream
    ranker, features = RankerClient(nowhere, "gateway"), FeatureClient(nowhere, "gateway")
    inference = InferenceClient(nowhere, "gateway_ai_tool")
    gate = AdmissionGate(AdmissionConfig())
    tool_gate = build_tool_gate(SETTINGS.ai_tool)
    tools = AiTools(inference, SETTINGS.ai_tool)
    deps = GatewayDeps(
        Recommender(ranker, features, SETTINGS.max_count),
        ClassPolicy.from_settings(SETTINGS),
        EventPublisher(nowhere, "unused", 0.1),
        {},
        tools,
        gate=gate,
        tool_gate=tool_gate,
    )
    transport = httpx.ASGITransport(app=create_app(SETTINGS, deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        yield Gateway(http, gate, tool_gate)
    for client in (ranker, features, inference):
        await client.close()


async def _document(http: httpx.AsyncClient) -> dict[str, Any]:
    resp = await http.get("/openapi.json")
    assert resp.status_code == 200, resp.text
    doc: dict[str, Any] = resp.json()
    return doc


async def test_openapi_json_and_docs_are_served(gateway: Gateway) -> None:
    # Was a 500: a header annotation named a local variable pydantic could not resolve.
    doc = await _document(gateway.http)
    assert set(doc["paths"]) == {"/v1/recommend", "/v1/events", "/v2/ai-tool/summarize",
                                 "/v2/ai-tool/action", "/healthz", "/readyz"}  # fmt: skip
    docs = await gateway.http.get("/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


async def test_every_header_the_gateway_reads_is_declared(gateway: Gateway) -> None:
    paths = (await _document(gateway.http))["paths"]

    def headers(path: str) -> set[str]:
        return {p["name"] for p in paths[path]["post"]["parameters"] if p["in"] == "header"}

    for path in ("/v1/recommend", "/v2/ai-tool/summarize", "/v2/ai-tool/action"):
        assert headers(path) == CLASS_HEADERS, path
    assert headers("/v1/events") == {"traceparent"}


async def test_responses_are_documented_as_sent(gateway: Gateway) -> None:
    doc = await _document(gateway.http)
    assert "HTTPValidationError" not in str(doc), "request validation answers 400 with ErrorOut, never 422"
    expected = {
        "/v1/recommend": {"200", "400", "401", "413", "429", "503"},
        "/v1/events": {"202", "400", "503"},
        "/v2/ai-tool/summarize": {"200", "400", "401", "422", "429"},
        "/v2/ai-tool/action": {"200", "400", "401", "422", "429"},
    }
    for path, statuses in expected.items():
        responses = doc["paths"][path]["post"]["responses"]
        assert set(responses) == statuses, path
        for status in statuses - {"200", "202"}:
            schema = responses[status]["content"]["application/problem+json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (path, status)
        if "429" in statuses:
            shed = responses["429"]["headers"]
            assert shed["retry-after"]["required"] and shed["x-slo-class"]["required"], path
    limits = doc["components"]["schemas"]
    assert limits["RecommendBody"]["properties"]["count"]["maximum"] == SETTINGS.max_count
    assert limits["EventsBody"]["properties"]["events"]["maxItems"] == SETTINGS.max_events_per_request
    assert limits["SummarizeBody"]["properties"]["text"]["maxLength"] == SETTINGS.ai_tool.max_text_chars


async def _check(
    http: httpx.AsyncClient,
    schema: BaseSchema,
    path: str,
    content: bytes,
    headers: dict[str, str],
    method: str = "POST",
) -> httpx.Response:
    """Send one request and validate the answer against the document with
    schemathesis' checks (status documented, body, content type and headers
    as documented, no 5xx)."""
    # Header values go out as bytes, as HTTP/1.1 carries them ("²" is one latin-1 byte).
    wire = [(name.encode(), value.encode("latin-1")) for name, value in headers.items()]
    resp = await http.request(method, path, content=content, headers=wire)
    operation = schema[path]["POST"]
    case = operation.Case(headers=headers, body=content, media_type=headers.get("content-type"))
    case.validate_response(resp)
    return resp


JSON = {"content-type": "application/json"}


async def test_answers_outside_fastapi_validate_against_the_document(gateway: Gateway) -> None:
    http = gateway.http
    schema = schemathesis.openapi.from_dict(await _document(http))

    too_big = b'{"user_id": "u1", "context": {"q": "' + b"x" * MAX_BODY_BYTES + b'"}}'
    resp = await _check(http, schema, "/v1/recommend", too_big, JSON)
    assert resp.status_code == 413

    resp = await _check(http, schema, "/v1/recommend", b'{"user_id": "u1"', JSON)
    assert resp.status_code == 400 and resp.json()["message"].startswith("body: Invalid JSON")

    resp = await _check(http, schema, "/v1/recommend", b'{"user_id": "u1"}', {**JSON, "x-api-key": "nope"})
    assert resp.status_code == 401

    latin1_digit = {**JSON, "x-request-timeout-ms": "\u00b2"}
    resp = await _check(http, schema, "/v1/recommend", b'{"user_id": "u1"}', latin1_digit)
    assert resp.status_code == 400, "was a 500: '²' passed str.isdigit() and failed int()"

    # A lagging event loop sheds class C before the body is read: 429 + Retry-After + the class.
    gateway.gate.record_loop_lag(10_000)
    resp = await _check(http, schema, "/v1/recommend", b'{"user_id": "u1"}', {**JSON, "x-slo-class": "C"})
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1" and resp.headers["x-slo-class"] == "C"

    gateway.tool_gate.record_loop_lag(10_000)
    body = b'{"text": "One sentence. Another one."}'
    resp = await _check(http, schema, "/v2/ai-tool/summarize", body, {**JSON, "x-slo-class": "C"})
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "1" and resp.headers["x-slo-class"] == "C"

    # FastAPI's own refusal of a body it cannot parse: the ErrorOut shape, not {"detail"}.
    resp = await _check(http, schema, "/v1/events", b"\xff\xfe", JSON)
    assert resp.status_code == 400 and resp.json()["error"] == "InvalidArgument"


async def test_wrong_method_is_405_with_allow_in_the_error_shape(gateway: Gateway) -> None:
    resp = await gateway.http.get("/v1/events")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json() == {"type": "about:blank", "title": "Method Not Allowed", "status": 405,
                           "detail": "Method Not Allowed", "error": "MethodNotAllowed",
                           "message": "Method Not Allowed"}  # fmt: skip


async def test_a_request_shed_from_the_queue_is_the_same_documented_429(gateway: Gateway) -> None:
    # Full (every slot taken) but with waiting room: B queues, waits half its
    # 100 ms budget and is shed from the queue, after its body was read.
    schema = schemathesis.openapi.from_dict(await _document(gateway.http))
    gateway.gate.in_flight = 10_000
    headers = {**JSON, "x-slo-class": "B", "x-request-timeout-ms": "100"}
    resp = await _check(gateway.http, schema, "/v1/recommend", b'{"user_id": "u1"}', headers)
    assert resp.status_code == 429 and "queue_timeout" in resp.json()["message"]
    assert resp.headers["retry-after"] == "1" and resp.headers["x-slo-class"] == "B"
