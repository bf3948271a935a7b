"""/v2/ai-tool/* through the gateway app (in-process ASGI) against a real
inference service serving MiniLM embeddings over gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from recmesh.aitools import actions
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.embedding.encoder import TextEncoder
from recmesh.grpcserver import MeshServer
from recmesh.settings import AiToolSettings, GatewaySettings, InferenceSettings
from services.gateway.ai_tool_calls import AiTools
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.inference.model import ModelRegistry
from services.inference.server import build_server
from services.inference.textmodels import OnnxEmbedder, TextModels
from tests.helpers import free_port

TEXT = (
    "The new trail opened in the national park last spring. Hikers reach the summit in four hours. "
    "The mountain hut near the summit serves soup to hikers. Parking costs nothing on weekdays. "
    "From the summit, hikers see three glaciers and the park's lakes. The author owns a red bicycle."
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cta": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "maxLength": 60},
                "url": {"type": "string", "format": "uri"},
            },
            "required": ["text", "url"],
            "additionalProperties": False,
        }
    },
    "required": ["cta"],
}


@pytest.fixture(scope="module")
async def inference_with_text(model_dir: Path, embed_model_dir: Path) -> AsyncIterator[MeshServer]:
    settings = InferenceSettings(inference_port=free_port(), model_dir=model_dir, batching=False)
    registry = ModelRegistry(model_dir)
    registry.load_current()
    text = TextModels(embedder=OnnxEmbedder(TextEncoder.from_model_dir(embed_model_dir)))
    server = build_server(settings, registry, text=text)
    await server.start()
    await server.set_serving()
    yield server
    await server.stop(0.2)


def _app(inference_addr: str) -> tuple[Any, list[Any]]:
    settings = GatewaySettings.model_validate(
        {"RECMESH_API_KEYS": {"k-app": {"tenant": "app", "max_class": "A"}}}
    )
    dead = f"127.0.0.1:{free_port()}"
    ranker, features = RankerClient(dead, "gateway"), FeatureClient(dead, "gateway")
    tool_client = InferenceClient(inference_addr, "gateway_ai_tool")
    tools = AiTools(tool_client, AiToolSettings())
    deps = GatewayDeps(
        Recommender(ranker, features, 100), ClassPolicy.from_settings(settings),
        EventPublisher(dead, "unused", 0.5), {}, tools,
    )  # fmt: skip
    return create_app(settings, deps), [ranker, features, tool_client]


@pytest.fixture
async def http(inference_with_text: MeshServer) -> AsyncIterator[httpx.AsyncClient]:
    app, clients = _app(inference_with_text.address)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield client
    for c in clients:
        await c.close()


async def test_summarize_is_extractive_by_centrality(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v2/ai-tool/summarize", json={"text": TEXT, "max_sentences": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["backend"] == "extractive-centrality/onnxruntime-cpu"
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert body["slo_class"] == "B" and resp.headers["x-slo-class"] == "B"
    assert body["degraded"] == [] and body["tokens_used"] > 40
    assert len(body["sentences"]) == 2 and body["sentences"] == sorted(body["sentences"])
    assert "summit" in body["summary"] and "bicycle" not in body["summary"]


async def test_summarize_refuses_bad_input_with_a_message(http: httpx.AsyncClient) -> None:
    for payload, status, word in (
        ({"text": ""}, 400, "text"),
        ({"text": "...  !!"}, 400, "no sentence"),
        ({"text": TEXT, "max_sentences": 0}, 400, "max_sentences"),
        ({"text": TEXT, "extra": 1}, 400, "extra"),
    ):
        resp = await http.post("/v2/ai-tool/summarize", json=payload)
        assert resp.status_code == status and word in resp.json()["message"], (payload, resp.text)
    over = await http.post("/v2/ai-tool/summarize", json={"text": TEXT}, headers={"x-llm-token-budget": "10"})
    assert over.status_code == 422 and "x-llm-token-budget is 10" in over.json()["message"]
    bad = await http.post(
        "/v2/ai-tool/summarize", json={"text": TEXT}, headers={"x-llm-token-budget": "many"}
    )
    assert bad.status_code == 400


async def test_summarize_without_embeddings_falls_back_to_lead_sentences() -> None:
    app, clients = _app(f"127.0.0.1:{free_port()}")  # nothing listens there
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        resp = await client.post("/v2/ai-tool/summarize", json={"text": TEXT, "max_sentences": 2})
    for c in clients:
        await c.close()
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["backend"] == "extractive-lead" and body["sentences"] == [0, 1]
    assert body["degraded"] == ["embed_unavailable:Unavailable"] and body["summary"]


async def test_action_follows_schema_and_constraints(http: httpx.AsyncClient) -> None:
    payload = {
        "intent": "drive_trial_conversion",
        "constraints": ["must_include_cta", "avoid_price_mention"],
        "output_schema": SCHEMA,
        "context": {"product": "recmesh Pro", "url": "https://example.org/trial", "price": "$20/month"},
    }
    resp = await http.post("/v2/ai-tool/action", json=payload, headers={"x-api-key": "k-app"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["backend"] == "template (no generative model)" and body["attempts"] == 0
    assert body["checks"] == ["json_schema", "must_include_cta", "avoid_price_mention"]
    assert actions.violations(body["output"], SCHEMA, ["must_include_cta", "avoid_price_mention"]) == []
    assert body["output"]["cta"]["url"] == "https://example.org/trial"

    metrics = generate_latest().decode()
    assert 'recmesh_ai_tool_tokens_total{slo_class="B",tenant="app",tool="action"}' in metrics


async def test_action_errors_are_400_or_422(http: httpx.AsyncClient) -> None:
    base = {"intent": "x", "output_schema": SCHEMA}
    bad_schema = await http.post("/v2/ai-tool/action", json={**base, "output_schema": {"type": "nope"}})
    assert bad_schema.status_code == 400 and "JSON Schema" in bad_schema.json()["message"]
    unknown = await http.post("/v2/ai-tool/action", json={**base, "constraints": ["be_brief"]})
    assert unknown.status_code == 400 and "be_brief" in unknown.json()["message"]
    # A look-ahead that nothing matches: the 422 names the keyword and where.
    impossible = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?=x)y"}},
                  "required": ["code"]}  # fmt: skip
    resp = await http.post("/v2/ai-tool/action", json={**base, "output_schema": impossible})
    assert resp.status_code == 422 and "cannot meet `pattern` at /code" in resp.json()["message"], resp.text
    # Both were a 500: a reference outside the schema, a string JSON cannot carry as UTF-8.
    outside = {"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}}
    resp = await http.post("/v2/ai-tool/action", json={**base, "output_schema": outside})
    assert resp.status_code == 400 and "does not resolve" in resp.json()["message"], resp.text
    surrogate = (b'{"intent": "x", "output_schema": {"type": "object", "required": ["x"], '
                 b'"properties": {"x": {"const": "\\ud800"}}}}')  # fmt: skip
    resp = await http.post(
        "/v2/ai-tool/action", content=surrogate, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422 and "cannot meet `const` at /x" in resp.json()["message"], resp.text


async def test_action_meets_a_relative_link_pattern(http: httpx.AsyncClient) -> None:
    """The design notes' CTA with a relative link (`"pattern": "^/"`): the context
    URL's path when there is one, else a placeholder said to be one."""
    cta = {"text": {"type": "string", "maxLength": 60}, "url": {"type": "string", "pattern": "^/"}}
    schema = {"type": "object", "required": ["cta"], "properties": {"cta": {
        "type": "object", "required": ["text", "url"], "additionalProperties": False, "properties": cta,
    }}}  # fmt: skip
    payload = {
        "intent": "drive_trial_conversion",
        "constraints": ["must_include_cta"],
        "output_schema": schema,
    }
    resp = await http.post(
        "/v2/ai-tool/action", json={**payload, "context": {"url": "https://example.org/trial"}}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["output"]["cta"]["url"] == "/trial" and resp.json()["degraded"] == []
    bare = await http.post("/v2/ai-tool/action", json=payload)
    assert bare.status_code == 200, bare.text
    assert bare.json()["output"]["cta"]["url"].startswith("/")
    assert bare.json()["degraded"] == ["placeholder:/cta/url"]


async def test_the_token_budget_caps_what_a_call_spends(http: httpx.AsyncClient) -> None:
    action = {"intent": "drive_trial_conversion", "constraints": ["must_include_cta"],
              "output_schema": SCHEMA, "context": {"url": "https://example.org/trial"}}  # fmt: skip
    for path, payload in (("summarize", {"text": TEXT, "max_sentences": 2}), ("action", action)):
        free = await http.post(f"/v2/ai-tool/{path}", json=payload)
        assert free.status_code == 200, free.text
        spent = free.json()["tokens_used"]
        # Exactly what the call spends is allowed; one token less is refused up front.
        fits = await http.post(
            f"/v2/ai-tool/{path}", json=payload, headers={"x-llm-token-budget": str(spent)}
        )
        assert fits.status_code == 200 and fits.json()["tokens_used"] <= spent, (path, fits.text)
        short = await http.post(
            f"/v2/ai-tool/{path}", json=payload, headers={"x-llm-token-budget": str(spent - 1)}
        )
        assert short.status_code == 422 and f"needs about {spent} tokens" in short.json()["message"], (
            short.text
        )
