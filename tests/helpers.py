"""Test helpers: free ports (re-exported from recmesh.tools.localinfra) and polling (no fixed sleeps)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import orjson
from aiokafka import AIOKafkaProducer
from prometheus_client import REGISTRY

from recmesh.clients.base import GrpcClient
from recmesh.events import Event
from recmesh.features import keys
from recmesh.grpcserver import GRPC_OPTIONS
from recmesh.modeldir import EMBEDDER_DIR
from recmesh.tools.localinfra import free_port
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter, WriteResult
from services.gateway.edge import Caller, ClassPolicy

__all__ = [
    "CountingPolicy", "card_schema", "free_port", "grpc_server", "own_model_dir", "poll_until",
    "request_count", "served_client", "tile_events", "write_events",
]  # fmt: skip


async def write_events(store: FeatureStore, events: Sequence[Event]) -> WriteResult:
    """Events through the one write path (as the ingest consumer writes them)."""
    writer = EventWriter(store.client, store.feature_set, store.offline.attributes)
    return await writer.apply(sorted(events, key=lambda e: e.event_time))


async def tile_events(client: Any, item_ids: Sequence[str], stream_id: str) -> int:
    """Events the items' tiles of one tiled stream hold (their ':n' components), summed."""
    total = 0
    for item_id in item_ids:
        fields = await client.hgetall(keys.stream("item", item_id, stream_id))
        total += sum(int(v) for k, v in fields.items() if bytes(k).endswith(b":n"))
    return total


@contextlib.asynccontextmanager
async def grpc_server(add: Callable[[Any, grpc.aio.Server], None], servicer: object) -> AsyncIterator[str]:
    """A bare grpc.aio server with `servicer` (added by its generated `add_*_to_server`)
    on a free loopback port, plaintext, for the length of the block; yields its address.
    Bound as the mesh's servers are (GRPC_OPTIONS: no SO_REUSEPORT, grpc's default is on):
    with it, a second listener on the same port binds silently and the kernel hands it
    part of this server's connections."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    add(servicer, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    try:
        yield address
    finally:
        await server.stop(0)


T = TypeVar("T")
C = TypeVar("C", bound="GrpcClient")


@contextlib.asynccontextmanager
async def served_client(
    client: Callable[[str, str], C], add: Callable[[Any, grpc.aio.Server], None], servicer: object
) -> AsyncIterator[C]:
    """`client` (a GrpcClient class, caller "test") of `servicer` on a grpc_server."""
    async with grpc_server(add, servicer) as address:
        made = client(address, "test")
        try:
            yield made
        finally:
            await made.close()


class CountingPolicy(ClassPolicy):
    """The gateway's class policy, counting its decisions (one per request is the edge's promise)."""

    decisions = 0

    def decide(self, headers: Mapping[str, str], timeout_s: float | None = None) -> Caller:
        self.decisions += 1
        return super().decide(headers, timeout_s)


def request_count(service: str, method: str, slo_class: str, code: str) -> float:
    """How many requests `recmesh_request_duration_seconds` counted with these labels."""
    value = REGISTRY.get_sample_value(
        "recmesh_request_duration_seconds_count",
        {"service": service, "method": method, "slo_class": slo_class, "code": code},
    )
    return value or 0.0


async def poll_until(
    fn: Callable[[], Awaitable[T]],
    description: str,
    timeout: float = 10.0,  # noqa: ASYNC109 (a polling deadline, not a cancellation scope)
    interval: float = 0.05,
) -> T:
    """Call `fn` until it returns a truthy value; fail with `description` on timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for: {description} (last: {last!r})")


async def produce_events(bootstrap: str, topic: str, events: Sequence[Mapping[str, object]]) -> None:
    """Send JSON events keyed by user_id (pipelined, then awaited together)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=str(e["user_id"]).encode(), value=orjson.dumps(e)) for e in events
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def card_schema(model_dir: Path) -> tuple[str, list[str]]:
    """The served model's feature-set version and input columns (for rows a test builds)."""
    import json

    from recmesh.modeldir import current_model

    path = current_model(model_dir)
    assert path is not None, f"no model in {model_dir}"
    card = json.loads((path / "card.json").read_text())
    return str(card["feature_set_version"]), list(card["input"]["columns"])


def own_model_dir(model_dir: Path, embed_model_dir: Path, dest: Path) -> Path:
    """A process's own copy of the session's model directory: the CTR model
    copied, the session's text model linked, and no item vectors. A process
    that writes into its model directory (`recmesh up` embeds the catalog into
    MODEL_DIR/item_vectors in the background) must not leave them for the
    tests that read the shared one (the semantic source appears there)."""
    shutil.copytree(model_dir, dest, ignore=shutil.ignore_patterns(EMBEDDER_DIR, "*item_vectors*"))
    (dest / EMBEDDER_DIR).symlink_to(embed_model_dir / EMBEDDER_DIR)
    return dest
