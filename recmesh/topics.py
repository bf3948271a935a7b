"""Kafka topics on any broker (the mesh's own or the local one): the partitions
of a topic, and creating the topics a mesh needs when they are missing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

from recmesh.credentials import kafka_options


async def topic_partitions(bootstrap: str, topic: str) -> list[int]:
    """The partition ids of `topic` ([] when it does not exist). Listed first:
    a metadata request naming a missing topic creates it on a broker that
    auto-creates topics, as Tansu does."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **kafka_options())
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return []
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    for t in described:
        if t.get("topic", t.get("name")) == topic and not t.get("error_code"):
            return sorted(p.get("partition", p.get("partition_index")) for p in t["partitions"])
    return []


async def ensure_topics(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 20.0) -> None:
    """Create the topics that do not exist yet (name -> partitions)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    deadline = time.monotonic() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **kafka_options())
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [NewTopic(n, p, 1) for n, p in topics.items() if n not in existing]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(missing)
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
        finally:
            await admin.close()
