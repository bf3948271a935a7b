"""Embed over real gRPC: same vectors as the encoder, validation, its own lane."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from recmesh.clients.base import HealthProbe
from recmesh.clients.inference import InferenceClient
from recmesh.embedding.encoder import TextEncoder
from recmesh.errors import CircuitOpen, InvalidArgument, ResourceExhausted
from recmesh.grpcserver import MeshServer
from recmesh.resilience import request_scope
from recmesh.settings import InferenceSettings
from services.inference.model import ModelRegistry
from services.inference.server import TEXT_HEALTH_NAME, build_server, load_text_into
from services.inference.textmodels import OnnxEmbedder, TextModels, TextSlot
from tests.helpers import card_schema, free_port


@pytest.fixture
async def served(model_dir: Path, embed_model_dir: Path) -> AsyncIterator[InferenceClient]:
    settings = InferenceSettings(
        inference_port=free_port(), model_dir=model_dir, batching=False, embed_max_queue=2, embed_max_texts=32
    )
    registry = ModelRegistry(model_dir)
    registry.load_current()
    text = TextModels(embedder=OnnxEmbedder(TextEncoder.from_model_dir(embed_model_dir)))
    server: MeshServer = build_server(settings, registry, text=text)
    await server.start()
    await server.set_serving()
    client = InferenceClient(server.address, "test")
    yield client
    await client.close()
    await server.stop(0.2)


async def test_embed_returns_the_encoder_vectors(served: InferenceClient, embed_model_dir: Path) -> None:
    texts = ["wireless headphones with long battery life", "a vegetarian pasta recipe"]
    got = await served.embed(texts, cap_s=10)
    want = TextEncoder.from_model_dir(embed_model_dir).encode(texts)
    assert got.matrix.shape == (2, 384) and got.backend == "onnxruntime-cpu"
    assert np.abs(got.matrix - want).max() < 1e-6
    assert got.tokens[0] > 5 and got.model.endswith("all-MiniLM-L6-v2")
    caps = await served.capabilities()
    assert caps.embedding_backend == "onnxruntime-cpu" and caps.generation_model == ""


async def test_bad_embed_requests_name_the_problem(served: InferenceClient) -> None:
    with pytest.raises(InvalidArgument, match="texts is empty"):
        await served.embed([], cap_s=5)
    with pytest.raises(InvalidArgument, match=r"texts\[1\] is blank"):
        await served.embed(["ok", "  "], cap_s=5)
    with pytest.raises(InvalidArgument, match="at most 32"):
        await served.embed(["x"] * 33, cap_s=5)


async def test_embed_flood_is_shed_while_scoring_stays_fast(served: InferenceClient, model_dir: Path) -> None:
    version, columns = card_schema(model_dir)
    """Saturate the embed lane (1 slot + 2 waiting); Score never waits behind it.
    Scoring has its own client, as the ranker does (a client's breaker counts the
    flood's RESOURCE_EXHAUSTED answers, and would fail fast for every method)."""
    scorer = InferenceClient(served.address, "ranker")
    long_texts = ["a long product description about headphones and travel " * 4] * 32
    flood = [asyncio.create_task(served.embed(long_texts, cap_s=30)) for _ in range(12)]
    await asyncio.sleep(0.05)
    rows = np.random.default_rng(0).random((50, len(columns))).astype(np.float32).ravel().tolist()
    latencies = []
    for _ in range(20):
        started = time.perf_counter()
        with request_scope("A", 0.3):
            await scorer.score(version, columns, rows)
        latencies.append(time.perf_counter() - started)
    results = await asyncio.gather(*flood, return_exceptions=True)
    await scorer.close()
    shed = [r for r in results if isinstance(r, ResourceExhausted | CircuitOpen)]
    assert len(shed) >= 8, results  # at most 1 running + 2 waiting were admitted at first
    # Beyond the admitted ones, each is refused at once or fails fast once the caller's breaker opens.
    assert all(
        not isinstance(r, Exception) or isinstance(r, ResourceExhausted | CircuitOpen) for r in results
    )
    # Scoring answered within class A's budget throughout (each call had a 300 ms deadline).
    assert max(latencies) < 0.3


async def test_score_serves_while_text_models_load(model_dir: Path, embed_model_dir: Path) -> None:
    """Start-up order of services/inference/__main__.py: SERVING for Score with an
    empty text slot; Embed sheds as not ready (an answer, not a breaker failure);
    the text health name turns SERVING once load_text_into has filled the slot."""
    settings = InferenceSettings(inference_port=free_port(), model_dir=embed_model_dir, batching=False,
                                 text_backend="onnx")  # fmt: skip
    registry = ModelRegistry(model_dir)
    registry.load_current()
    slot = TextSlot()
    server = build_server(settings, registry, text=slot)
    await server.start()
    await server.set_serving()
    client = InferenceClient(server.address, "ranker")
    probe = HealthProbe(server.address)
    try:
        assert await probe.serving() and not await probe.serving(service=TEXT_HEALTH_NAME)
        version, columns = card_schema(model_dir)
        rows = np.random.default_rng(0).random((3, len(columns))).astype(np.float32).ravel().tolist()
        for _ in range(client.policy.failure_threshold + 2):
            with pytest.raises(ResourceExhausted, match="embed lane not ready"):
                await client.embed(["still loading"], cap_s=5)
        scored = await client.score(version, columns, rows, cap_s=5)
        assert len(scored.scores) == 3, "Embed's not-ready answers must not open the breaker Score uses"
        assert (await client.capabilities()).embedding_model == ""

        await load_text_into(slot, settings, server)
        assert await probe.serving(service=TEXT_HEALTH_NAME)
        got = await client.embed(["loaded now"], cap_s=10)
        assert got.matrix.shape == (1, 384)
        assert (await client.capabilities()).embedding_backend == "onnxruntime-cpu"
    finally:
        await probe.close()
        await client.close()
        await server.stop(0.2)
