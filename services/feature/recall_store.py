"""Recall state in Redis: item-to-item co-visitation and per-category popularity (reads).

Kept apart from the feature look-up path (store.py): these keys serve the
ranker's recall sources, not model inputs. The rules are in
recmesh.features.covisit; the counts are written by the one event write path
(services/feature/writer.py) and per-category popularity by the catalog load
(services/feature/catalog.py) or, when declared, live by the ingest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from recmesh.features import keys
from recmesh.features.covisit import merge_neighbours
from recmesh.redis_client import AnyRedis


def _pairs(raw: object) -> list[tuple[str, float]]:
    return [(bytes(m).decode(), float(s)) for m, s in cast(list[tuple[bytes, float]], raw)]


class RecallStore:
    def __init__(self, client: AnyRedis) -> None:
        self._redis = client

    # --- reads (recall) ----------------------------------------------------

    async def related(self, item_ids: Sequence[str], per_item: int, limit: int) -> list[tuple[str, float]]:
        """Co-visited neighbours of the seeds, counts summed, seeds excluded, best first."""
        seeds = list(dict.fromkeys(item_ids))
        if not seeds or limit <= 0:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for iid in seeds:
            pipe.zrevrange(keys.item_covisits(iid), 0, per_item - 1, withscores=True)
        rows = [_pairs(raw) for raw in await pipe.execute()]
        return merge_neighbours(rows, seeds, limit)

    async def history(self, user_id: str, as_of_ms: int, limit: int) -> list[str]:
        """The user's newest distinct items as of `as_of_ms`, newest first."""
        raw = await self._redis.zrevrangebyscore(
            keys.user_history(user_id), as_of_ms, "-inf", start=0, num=limit
        )
        return [bytes(m).decode() for m in cast(list[bytes], raw)]

    async def category_popular(
        self, categories: Sequence[str], limit: int
    ) -> list[tuple[str, list[tuple[str, float]]]]:
        """The `limit` most popular items of each category, in the given order."""
        wanted = list(dict.fromkeys(categories))
        if not wanted or limit <= 0:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for cat in wanted:
            pipe.zrevrange(keys.category_popularity(cat), 0, limit - 1, withscores=True)
        return [(cat, _pairs(raw)) for cat, raw in zip(wanted, await pipe.execute(), strict=True)]
