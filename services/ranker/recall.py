"""Recall sources: small units that each propose candidates for one user.

Each source has a name, a fusion role (see fusion.py) and one `fetch`; the
pipeline runs them concurrently, each under its own deadline, and a source
that fails or runs late contributes nothing (its reason goes into `degraded`)
while the others still count. Only popularity has a further fallback: its
last list, served stale, so a request always has candidates once the feature
service answered once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from recmesh.cache import TtlCache
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.errors import RecmeshError
from recmesh.features.covisit import seeds_of
from recmesh.features.repository import FeatureValue, RecallRoles
from services.ranker.fusion import (
    Role,
    affinity_candidates,
    category_affinity,
    realtime_trust,
    semantic_sigma,
)
from services.ranker.semantic import IndexHolder

# Recall lists change slowly; a few seconds of staleness is invisible.
CACHE_TTL_S = 5.0
# A query longer than this is cut before embedding (the encoder truncates anyway).
QUERY_MAX_CHARS = 1000

Vector = npt.NDArray[np.float32]
Attributes = dict[str, str | int | float]


@dataclass(frozen=True)
class RecallContext:
    user_id: str
    user: Mapping[str, FeatureValue]
    context: Mapping[str, str]
    limit: int
    cap_s: float
    user_freshness: Mapping[str, float] = field(default_factory=dict)
    skip: frozenset[str] = frozenset()  # downstreams not to call (presumed cold)
    # Co-visitation recall the user look-up brought along (None: not there).
    related: Sequence[tuple[str, float]] | None = None
    # The user's newest distinct items (learnt retrieval's seeds; None: not read).
    history: Sequence[str] | None = None


@dataclass
class Recalled:
    items: list[tuple[str, float]]
    sigma: float = 0.0  # the semantic source's confidence; 0 for the others
    stale: bool = False  # served from the last good answer
    attributes: dict[str, str | int | float] = field(default_factory=dict)


class RecallSource(Protocol):
    name: str
    role: Role

    async def fetch(self, ctx: RecallContext) -> Recalled: ...


def last_viewed(roles: RecallRoles, user: Mapping[str, FeatureValue]) -> list[str]:
    """The user's recent items (the repository's recent_items feature; none when undeclared)."""
    return seeds_of(user.get(roles.recent_items)) if roles.recent_items else []


def seen_items(roles: RecallRoles, user: Mapping[str, FeatureValue]) -> list[str]:
    """Items never recommended to the user again: the repository's `recall.seen`
    feature's, else their recent items."""
    return seeds_of(user.get(roles.seen)) if roles.seen else last_viewed(roles, user)


def never_again(roles: RecallRoles, ctx: RecallContext, seeds: list[str]) -> frozenset[str]:
    """What a learnt source must not propose: the `recall.seen` feature's items
    when declared (an item only viewed may come back), else every seed (an item
    of the user's history is seen)."""
    return frozenset(seen_items(roles, ctx.user)) if roles.seen else frozenset(seeds)


def history_seeds(roles: RecallRoles, ctx: RecallContext) -> list[str]:
    """Learnt retrieval's seeds: the user's history the look-up brought (newest
    first), else their recent items."""
    return list(ctx.history) if ctx.history else last_viewed(roles, ctx.user)


class PopularSource:
    """Real-time popularity from the feature service (cached, stale on failure)."""

    name = "popular"
    role: Role = "prior"

    def __init__(self, features: FeatureClient, cache_s: float = CACHE_TTL_S) -> None:
        self._features = features
        self._cache: TtlCache[list[tuple[str, float]]] = TtlCache(cache_s, 4)

    async def fetch(self, ctx: RecallContext) -> Recalled:
        key = str(ctx.limit)
        fresh = self._cache.get_fresh(key)
        if fresh is not None:
            return Recalled(fresh)
        try:
            popular = await self._features.popular(ctx.limit, cap_s=ctx.cap_s)
        except RecmeshError:
            stale = self._cache.get_stale(key)
            if stale is None:
                raise
            return Recalled(stale, stale=True)
        self._cache.put(key, popular)
        return Recalled(popular)


class CovisitSource:
    """Items co-visited with the user's last viewed items (learnt from the event stream).

    The user look-up usually brings them along (GetFeatures with
    `related_limit`, the same read as GetRelated); only when it did not
    (not asked, or the read failed there) does the source call GetRelated."""

    name = "covisit"
    role: Role = "cf"

    def __init__(self, features: FeatureClient, roles: RecallRoles) -> None:
        self._features = features
        self._roles = roles

    async def fetch(self, ctx: RecallContext) -> Recalled:
        seeds = last_viewed(self._roles, ctx.user)
        if not seeds:
            return Recalled([], attributes={"seeds": 0})
        if ctx.related is not None:
            return Recalled(list(ctx.related[: ctx.limit]), attributes={"seeds": len(seeds), "with_user": 1})
        items = await self._features.related(seeds, ctx.limit, per_item=ctx.limit, cap_s=ctx.cap_s)
        return Recalled(items, attributes={"seeds": len(seeds), "with_user": 0})


class CategorySource:
    """Popular items of the user's categories: the repository's affinity feature
    (real-time counts per category) plus declared interests."""

    name = "category"
    role: Role = "graph"

    def __init__(
        self, features: FeatureClient, n_categories: int, roles: RecallRoles, cache_s: float = CACHE_TTL_S
    ) -> None:
        self._features = features
        self._n = n_categories
        self._roles = roles
        self._cache: TtlCache[list[tuple[str, float]]] = TtlCache(cache_s, 1024)

    async def fetch(self, ctx: RecallContext) -> Recalled:
        roles = self._roles
        clicks = ctx.user.get(roles.affinity, {}) if roles.affinity else {}
        tags = ctx.user.get(roles.interests, []) if roles.interests else []
        # Real-time counts weigh by how fresh they are (the served freshness scores).
        trust = realtime_trust(ctx.user_freshness.get(roles.affinity, 1.0) if roles.affinity else 1.0)
        affinity = category_affinity(
            clicks if isinstance(clicks, dict) else {},
            [str(t) for t in tags] if isinstance(tags, list) else [],
            self._n,
            realtime_weight=trust,
        )
        per_cat: dict[str, list[tuple[str, float]]] = {}
        missing: list[str] = []
        for cat, _ in affinity:
            hit = self._cache.get_fresh(f"{cat}/{ctx.limit}")
            if hit is None:
                missing.append(cat)
            else:
                per_cat[cat] = hit
        if missing:
            fetched = await self._features.category_popular(missing, ctx.limit, cap_s=ctx.cap_s)
            for cat, items in fetched.items():
                self._cache.put(f"{cat}/{ctx.limit}", items)
                per_cat[cat] = items
        items = affinity_candidates(affinity, per_cat, ctx.limit)
        return Recalled(items, attributes={"categories": ",".join(c for c, _ in affinity)})


class SemanticSource:
    """Nearest items to the user's intent vector in the ANN index; sigma from the margins.

    The intent is the mean of the vectors of the user's last viewed items and,
    when the request's context carries a `query`, of that text embedded by the
    inference service (the same model as the item vectors). The query gets at
    most half of the source's deadline; without it the viewed items still count.
    """

    name = "semantic"
    role: Role = "semantic"

    def __init__(
        self, holder: IndexHolder, roles: RecallRoles, inference: InferenceClient | None = None
    ) -> None:
        self._holder = holder
        self._roles = roles
        self._inference = inference

    async def _query_vector(self, ctx: RecallContext, attributes: Attributes) -> list[Vector]:
        query = ctx.context.get("query", "").strip()
        if not query or self._inference is None:
            return []
        if "inference" in ctx.skip:
            attributes["query"] = "skipped: inference_cold"
            return []
        try:
            embedded = await self._inference.embed([query[:QUERY_MAX_CHARS]], cap_s=ctx.cap_s / 2)
        except RecmeshError as err:
            attributes["query"] = f"unavailable: {type(err).__name__}"
            return []
        attributes["query"] = "embedded"
        return [embedded.matrix[0]]

    async def fetch(self, ctx: RecallContext) -> Recalled:
        index = self._holder.index
        if index is None:
            return Recalled([], attributes={"index": "absent"})
        attributes: Attributes = {}
        extra = await self._query_vector(ctx, attributes)
        intent = index.intent(last_viewed(self._roles, ctx.user), extra)
        if intent is None:
            return Recalled([], attributes={**attributes, "index": "no_intent"})
        hits = index.search(intent.vector, ctx.limit)
        sigma = semantic_sigma([s for _, s in hits], intent.coherence)
        attributes["coherence"] = round(intent.coherence, 3)
        return Recalled(hits, sigma=sigma, attributes=attributes)
