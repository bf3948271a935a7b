"""The catalog load: users' and items' offline features into Redis.

Profiles go to `{u:<id>}:profile` and statics to `{i:<id>}:static` (JSON
values per feature), the recall popularity sets from the repository's
declared popularity feature (global and per category), and after each batch a
new `{catalog}:statics_version`, so feature services re-read what changed
within a look-up or two. The repository that described the catalog is
recorded in `{catalog}:repository`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from recmesh.features import keys
from recmesh.features.repository import Entity, FeatureSet, FeatureValue
from recmesh.redis_client import AnyRedis

BATCH_COMMANDS = 5000


@dataclass(frozen=True)
class LoadFigures:
    users: int
    items: int
    seconds: float
    bytes_per_user: float | None  # Redis memory (MEMORY USAGE, sampled) per profile
    bytes_per_item: float | None  # per static hash with its popularity entries

    def to_json(self) -> dict[str, Any]:
        return {
            "users": self.users, "items": self.items, "seconds": round(self.seconds, 2),
            "bytes_per_user": self.bytes_per_user, "bytes_per_item": self.bytes_per_item,
        }  # fmt: skip


async def load_catalog(
    client: AnyRedis,
    feature_set: FeatureSet,
    users: Iterable[tuple[str, dict[str, FeatureValue]]],
    items: Iterable[tuple[str, dict[str, FeatureValue]]],
    progress: Callable[[Entity, int], None] | None = None,
) -> LoadFigures:
    """Write offline profiles and statics, announcing each flushed batch with a
    new keys.STATICS_VERSION once its writes are done (a separate call: a
    cluster pipeline sends each node's commands in parallel, so in the same
    pipeline the version could land before the data). A load that dies partway
    has announced what it wrote. Unique versions, so a restarted Redis loaded
    afresh never repeats one a service cached under."""
    started = time.perf_counter()
    roles = feature_set.roles
    pipe = client.pipeline(transaction=False)
    counts: dict[Entity, int] = {"user": 0, "item": 0}
    samples: dict[Entity, list[str]] = {"user": [], "item": []}

    async def flush() -> None:
        nonlocal pipe
        await pipe.execute()
        await new_statics_version(client)
        pipe = client.pipeline(transaction=False)

    for entity, rows in (("user", users), ("item", items)):
        for eid, feats in rows:
            key = keys.profile(entity, eid)
            pipe.delete(key)
            if feats:
                pipe.hset(key, mapping={k: orjson.dumps(v) for k, v in feats.items()})
            if entity == "item" and roles.popularity_feature is not None:
                score = float(feats.get(roles.popularity_feature, 0.0))  # type: ignore[arg-type]
                pipe.zadd(keys.POPULARITY, {eid: score})
                if roles.category is not None:
                    cats = feats.get(roles.category)
                    for cat in cats if isinstance(cats, list) else [cats]:
                        if cat:
                            pipe.zadd(keys.category_popularity(str(cat)), {eid: score})
            elif entity == "item" and roles.popularity_behaviors:
                # Counted live by the ingest: every catalog item starts at 0 (kept
                # when already counted), so a mesh with no events yet still has a
                # popular list to recall and fall back on (ties by item id).
                pipe.zadd(keys.POPULARITY, {eid: 0.0}, nx=True)
            counts[entity] += 1  # type: ignore[index]
            if len(samples[entity]) < 200 and counts[entity] % 97 == 1:  # type: ignore[index]
                samples[entity].append(key)  # type: ignore[index]
            if len(pipe) >= BATCH_COMMANDS:
                await flush()
                if progress is not None:
                    progress(entity, counts[entity])  # type: ignore[index, arg-type]
        if progress is not None:
            progress(entity, counts[entity])  # type: ignore[index, arg-type]
    pipe.hset(
        keys.REPOSITORY,
        mapping={
            "name": feature_set.name,
            "version": feature_set.version,
            "loaded_at_ms": int(time.time() * 1000),
        },
    )
    await flush()
    seconds = time.perf_counter() - started
    return LoadFigures(
        counts["user"], counts["item"], seconds,
        await _bytes_per_key(client, samples["user"]), await _bytes_per_key(client, samples["item"]),
    )  # fmt: skip


async def new_statics_version(client: AnyRedis, *, only_if_none: bool = False) -> None:
    """Announce the offline features in Redis under a new keys.STATICS_VERSION
    (feature processes re-read what they cached under another). `only_if_none`:
    name state that has no version yet (loaded before versions existed, or the
    version lost), leaving a load's version alone."""
    await client.set(keys.STATICS_VERSION, uuid.uuid4().hex, nx=only_if_none)


async def _bytes_per_key(client: AnyRedis, sample: list[str]) -> float | None:
    if not sample:
        return None
    pipe = client.pipeline(transaction=False)
    for key in sample:
        pipe.memory_usage(key)
    sizes = [int(s) for s in await pipe.execute() if s is not None]
    return round(sum(sizes) / len(sizes), 1) if sizes else None


async def loaded_repository(client: AnyRedis) -> dict[str, str]:
    """The name and version of the repository whose catalog was last loaded ({} if none)."""
    raw = await client.hgetall(keys.REPOSITORY)
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
