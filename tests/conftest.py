"""Shared fixtures: real redis-server and Tansu broker processes, a trained model."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from recmesh.features.repository import DEMO_REPOSITORY, FeatureSet, load_feature_set
from recmesh.tools.localinfra import broker_process, redis_process, start_redis_cluster, wait_tcp
from recmesh.tools.training.train import TrainConfig, train
from recmesh.topics import ensure_topics
from tests.helpers import free_port

# The suite's in-process servers, and the processes it starts, speak plaintext
# gRPC unless a test turns mutual TLS on (tests/integration/test_security.py,
# tests/e2e/test_up.py: `recmesh up` makes its own CA). Explicit, as
# RECMESH_TLS=off must be: the default is on.
os.environ["RECMESH_TLS"] = "off"
# Nor does the CLI the suite runs (in process or not) pick up the credentials of a
# `recmesh up` the developer left running here (.recmesh/secrets/cli.env): the
# tests that want it read say so (tests/unit/recmesh/tools/cli/test_clienv.py,
# tests/integration/test_cli_env.py).
os.environ["RECMESH_CLI_ENV"] = "off"

SMALL_TRAINING = TrainConfig(sessions=1500, hours=2.0, epochs=3)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = redis_process(port, workdir, workdir)
    proc.start()
    asyncio.run(wait_tcp("127.0.0.1", port, 10, proc))
    yield f"redis://127.0.0.1:{port}/0"
    proc.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-master Redis Cluster from redis-server processes."""
    ports = [free_port(below=55536) for _ in range(3)]
    procs = asyncio.run(start_redis_cluster(ports, tmp_path_factory.mktemp("cluster")))
    yield f"redis+cluster://127.0.0.1:{ports[0]}"
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = broker_process(port, tmp_path_factory.mktemp("broker"))
    proc.start()
    asyncio.run(wait_tcp("127.0.0.1", port, 10, proc))
    yield f"127.0.0.1:{port}"
    proc.stop()


@pytest.fixture(scope="session")
def demo_feature_set() -> FeatureSet:
    """The demo repository's feature set (examples/demo/recmesh.toml)."""
    return load_feature_set(DEMO_REPOSITORY)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, demo_feature_set: FeatureSet) -> Path:
    out = tmp_path_factory.mktemp("models")
    train(SMALL_TRAINING, out, demo_feature_set, progress=lambda _: None)
    return out


@pytest.fixture(scope="session")
def scratch_redis_url(redis_url: str) -> str:
    """Database 1 of the same server: tests that flush it never touch the mesh's database 0."""
    return redis_url.rsplit("/", 1)[0] + "/1"


@pytest.fixture
async def redis_client(scratch_redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(scratch_redis_url, protocol=2)  # as recmesh.redis_client connects
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def topics(kafka_bootstrap: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """Fresh topic names per test, so tests never see each other's records."""
    suffix = f"{request.node.name}-{free_port()}".replace("[", "-").replace("]", "")
    names = {"events": f"ub-{suffix}", "dlq": f"ub-{suffix}.dlq"}
    await ensure_topics(kafka_bootstrap, {names["events"]: 3, names["dlq"]: 1})
    return names


@pytest.fixture(scope="session")
def embed_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model dir holding the MiniLM encoder exported from the packaged weights (about 2 s)."""
    from recmesh.tools.embedding.export import export

    model_dir = tmp_path_factory.mktemp("embed-models")
    export(model_dir)
    return model_dir
