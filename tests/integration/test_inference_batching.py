"""The batched InferenceService over real gRPC with a real ONNX model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from recmesh.clients.inference import InferenceClient
from recmesh.grpcserver import MeshServer
from recmesh.settings import InferenceSettings
from services.inference.model import ModelRegistry
from services.inference.server import build_batcher, build_server
from tests.helpers import card_schema, free_port


@pytest.fixture
async def batched(model_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[MeshServer, ModelRegistry, Path]]:
    own = tmp_path / "models"
    shutil.copytree(model_dir, own)
    settings = InferenceSettings(inference_port=free_port(), model_dir=own, batch_max_delay_us=2000)
    registry = ModelRegistry(own)
    registry.load_current()
    batcher = build_batcher(settings)
    assert batcher is not None
    server = build_server(settings, registry, batcher)
    await server.start()
    await server.set_serving()
    worker = asyncio.create_task(batcher.run())
    follower = asyncio.create_task(registry.follow(interval_s=0.05))
    yield server, registry, own
    for task in (worker, follower):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await server.stop(0.2)


async def test_concurrent_mixed_sizes_get_their_own_scores(
    batched: tuple[MeshServer, ModelRegistry, Path],
) -> None:
    server, registry, own = batched
    version, columns = card_schema(own)
    d = len(columns)
    client = InferenceClient(server.address, "test")
    rng = np.random.default_rng(1)
    inputs = [rng.random((int(rng.integers(1, 60)), d)).astype(np.float32) * 3 for _ in range(120)]
    try:
        replies = await asyncio.gather(
            *(client.score(version, columns, x.ravel().tolist(), cap_s=10) for x in inputs)
        )
    finally:
        await client.close()
    for x, reply in zip(inputs, replies, strict=True):
        np.testing.assert_allclose(np.array(reply.scores), registry.model.score(x), rtol=1e-5, atol=1e-6)


async def test_version_switch_under_load_loses_no_request(
    batched: tuple[MeshServer, ModelRegistry, Path],
) -> None:
    server, registry, own = batched
    old = registry.model.version
    src = own / "ctr" / old
    new = "ctr-switched"
    shutil.copytree(src, own / "ctr" / new)
    card = json.loads((src / "card.json").read_text())
    card["version"] = new
    (own / "ctr" / new / "card.json").write_text(json.dumps(card))
    client = InferenceClient(server.address, "test")
    fs_version, columns = card_schema(own)
    row = [0.5] * len(columns)
    versions: list[str] = []

    async def caller(level: int) -> None:
        for _ in range(60):
            reply = await client.score(fs_version, columns, row * 4, level=level, cap_s=10)
            assert len(reply.scores) == 4 and reply.level == level  # every variant of both versions
            versions.append(reply.model_version)
            await asyncio.sleep(0.002)

    async def switch() -> None:
        await asyncio.sleep(0.05)
        (own / "ctr" / "CURRENT").write_text(new + "\n")

    try:
        await asyncio.gather(switch(), *(caller(i % 4) for i in range(8)))
    finally:
        await client.close()
    assert len(versions) == 8 * 60, "every request answered"
    assert versions[0] == old and versions[-1] == new
    assert set(versions) == {old, new}


async def test_score_answers_carry_the_suggested_level(
    batched: tuple[MeshServer, ModelRegistry, Path],
) -> None:
    server, _, own = batched
    version, columns = card_schema(own)
    client = InferenceClient(server.address, "test")
    try:
        reply = await client.score(version, columns, [0.0] * len(columns), cap_s=5)
    finally:
        await client.close()
    assert reply.suggested_level == 0 and len(reply.scores) == 1
