"""gRPC FeatureService: batch look-ups and popular-item candidates."""

from __future__ import annotations

import asyncio
import time

import grpc
from opentelemetry import trace
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from recmesh.errors import InvalidArgument, Unavailable
from recmesh.features.block import ItemLayout
from recmesh.features.covisit import seeds_of
from recmesh.features.wire import columns_to_pb, row_to_pb
from recmesh.grpcserver import MeshServer, Registration
from recmesh.metadata import REQUEST_ID_HEADER
from recmesh.resilience import current_slo_class, remaining_s
from recmesh.settings import FeatureSettings
from recmesh.telemetry import FALLBACKS, current_trace_id
from recmesh.v1 import features_pb2 as pb
from recmesh.v1 import features_pb2_grpc
from services.feature.recall_store import RecallStore
from services.feature.served_log import ServedLog
from services.feature.store import FeatureStore, Lookup

LOOKUP_ITEMS = Counter("recmesh_feature_lookup_items_total", "Items looked up.", ("slo_class",))
# Bounds of the recall RPCs (items per answer, seeds or categories per request).
MAX_RECALL = 1000
MAX_SEEDS = 100
ITEM_CACHE_HIT_RATIO = Gauge(
    "recmesh_feature_item_cache_hit_ratio", "Hit ratio of the in-process item feature cache."
)


class FeatureServicer(features_pb2_grpc.FeatureServiceServicer):
    def __init__(
        self,
        store: FeatureStore,
        settings: FeatureSettings,
        served_log: ServedLog | None,
        recall: RecallStore,
    ) -> None:
        self._store = store
        self._feature_set = store.feature_set
        self._settings = settings
        self._served_log = served_log
        self._recall = recall
        self._layout = ItemLayout.of(self._feature_set)

    async def GetFeatures(
        self, request: pb.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetFeaturesResponse:
        _check_features_request(request, self._settings.max_items)
        as_of = request.as_of_ms or int(time.time() * 1000)
        slo = current_slo_class()
        timeout_ms = self._settings.realtime_timeout_ms_by_class.get(slo, self._settings.realtime_timeout_ms)
        timeout = timeout_ms / 1000
        left = remaining_s()
        if left is not None:
            # Keep a little of the caller's budget to build the answer.
            timeout = max(0.001, min(timeout, left * 0.8))
        item_ids = list(request.item_ids)
        # The history is one read of its own: it runs beside the look-up.
        history = (
            asyncio.ensure_future(self._history(request.user_id, as_of, request.history_limit, timeout))
            if request.history_limit
            else None
        )
        lookup = await self._lookup(request, item_ids, as_of, timeout, slo, context)
        cache = self._store.offline.item_cache
        total = cache.hits + cache.misses
        if total:
            ITEM_CACHE_HIT_RATIO.set(cache.hits / total)
        response = pb.GetFeaturesResponse(
            user=row_to_pb(self._feature_set, request.user_id, lookup.user),
            feature_version=self._feature_set.version,
            as_of_ms=as_of,
            degraded=lookup.degraded,
        )
        if request.item_block:
            values = {name: col.values for name, col in lookup.item_columns.items()}
            self._layout.encode(item_ids, values, response.item_block)
        else:
            columns_to_pb(self._feature_set, item_ids, lookup.item_columns, response.items)
        if request.related_limit:
            await self._add_related(request, lookup, timeout_ms / 1000, response)
        if history is not None:
            got = await history
            if isinstance(got, str):
                response.degraded.append(got)
            else:
                response.history.extend(got)
                response.history_included = True
        if response.degraded:
            trace.get_current_span().set_attribute("recmesh.fallback_reason", ",".join(response.degraded))
        return response

    async def _lookup(
        self,
        request: pb.GetFeaturesRequest,
        item_ids: list[str],
        as_of: int,
        cap_s: float,
        slo: str,
        context: grpc.aio.ServicerContext,
    ) -> Lookup:
        """The store's look-up, counted, and offered to the served log when sampled."""
        # A logged look-up is bracketed by how far the ingest had applied the
        # events topic (read before and after it), so `features compare` tells a
        # store behind the stream from a wrong value.
        sampled = self._served_log is not None and self._served_log.sampled()
        topic = self._settings.events_topic
        before = await self._store.applied(topic, cap_s) if sampled else None
        lookup = await self._store.lookup(request.user_id, item_ids, as_of, cap_s, not request.items_only)
        LOOKUP_ITEMS.labels(slo).inc(len(item_ids))
        for reason in lookup.degraded:
            FALLBACKS.labels("feature", reason, slo).inc()
        if sampled and self._served_log is not None:
            after = await self._store.applied(topic, cap_s)
            metadata = dict(context.invocation_metadata() or ())
            self._served_log.offer(
                request_id=str(metadata.get(REQUEST_ID_HEADER, "")),
                trace_id=current_trace_id(),
                as_of_ms=as_of,
                user_id=request.user_id,
                item_ids=item_ids,
                lookup=lookup,
                applied=None if before is None or after is None else (before, after),
            )
        return lookup

    async def _history(self, user_id: str, as_of: int, limit: int, cap_s: float) -> list[str] | str:
        """The user's history, or the reason it could not be read."""
        try:
            async with asyncio.timeout(cap_s):
                return await self._recall.history(user_id, as_of, limit)
        except (TimeoutError, RedisError, OSError) as err:
            reason = "history_timeout" if isinstance(err, TimeoutError) else "history_unavailable"
            FALLBACKS.labels("feature", reason, current_slo_class()).inc()
            return reason

    async def _add_related(
        self,
        request: pb.GetFeaturesRequest,
        lookup: Lookup,
        cap_s: float,
        response: pb.GetFeaturesResponse,
    ) -> None:
        """The user's co-visitation recall, from the seeds the look-up just read.
        A failed or late read leaves `related_included` unset (the caller can
        still ask GetRelated) and says why in `degraded`."""
        seed_feature = self._feature_set.roles.recent_items
        value = lookup.user.get(seed_feature) if seed_feature else None
        seeds = seeds_of(value[0] if value is not None else None)[:MAX_SEEDS]
        if seeds:
            left = remaining_s()
            timeout = cap_s if left is None else max(0.001, min(cap_s, left * 0.8))
            try:
                async with asyncio.timeout(timeout):
                    related = await self._recall.related(
                        seeds, request.related_per_item or request.related_limit, request.related_limit
                    )
            except (TimeoutError, RedisError, OSError) as err:
                reason = "related_timeout" if isinstance(err, TimeoutError) else "related_unavailable"
                FALLBACKS.labels("feature", reason, current_slo_class()).inc()
                response.degraded.append(reason)
                return
            response.related.extend(pb.ScoredItem(item_id=i, score=s) for i, s in related)
        response.related_included = True

    async def GetPopular(
        self, request: pb.GetPopularRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPopularResponse:
        if not 0 < request.limit <= 10_000:
            raise InvalidArgument("limit must be in 1..10000")
        top = await self._store.popular(request.limit)
        return pb.GetPopularResponse(items=[pb.ScoredItem(item_id=i, score=s) for i, s in top])

    async def GetRelated(
        self, request: pb.GetRelatedRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRelatedResponse:
        _check_related_limits(request.limit, request.per_item)
        if len(request.item_ids) > MAX_SEEDS:
            raise InvalidArgument(f"item_ids has {len(request.item_ids)} entries; at most {MAX_SEEDS}")
        try:
            related = await self._recall.related(
                list(request.item_ids), request.per_item or request.limit, request.limit
            )
        except (RedisError, OSError) as err:
            raise Unavailable(f"co-visitation store: {err}") from err
        return pb.GetRelatedResponse(items=[pb.ScoredItem(item_id=i, score=s) for i, s in related])

    async def GetCategoryPopular(
        self, request: pb.GetCategoryPopularRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetCategoryPopularResponse:
        if not 0 < request.limit <= MAX_RECALL:
            raise InvalidArgument(f"limit must be in 1..{MAX_RECALL}")
        if len(request.categories) > MAX_SEEDS:
            raise InvalidArgument(f"categories has {len(request.categories)} entries; at most {MAX_SEEDS}")
        try:
            rows = await self._recall.category_popular(list(request.categories), request.limit)
        except (RedisError, OSError) as err:
            raise Unavailable(f"category popularity: {err}") from err
        return pb.GetCategoryPopularResponse(
            categories=[
                pb.CategoryItems(category=c, items=[pb.ScoredItem(item_id=i, score=s) for i, s in items])
                for c, items in rows
            ]
        )


def _check_features_request(request: pb.GetFeaturesRequest, max_items: int) -> None:
    if not request.user_id:
        raise InvalidArgument("user_id is required")
    if len(request.item_ids) > max_items:
        raise InvalidArgument(f"item_ids has {len(request.item_ids)} entries; at most {max_items}")
    if request.history_limit and not 0 < request.history_limit <= MAX_RECALL:
        raise InvalidArgument(f"history_limit must be in 0..{MAX_RECALL}")
    if request.related_limit:
        if request.items_only:
            raise InvalidArgument("related_limit needs the user's features; items_only skips them")
        _check_related_limits(request.related_limit, request.related_per_item, prefix="related_")


def _check_related_limits(limit: int, per_item: int, prefix: str = "") -> None:
    if not 0 < limit <= MAX_RECALL:
        raise InvalidArgument(f"{prefix}limit must be in 1..{MAX_RECALL}")
    if not 0 <= per_item <= MAX_RECALL:
        raise InvalidArgument(f"{prefix}per_item must be in 0..{MAX_RECALL}")


def build_server(
    settings: FeatureSettings,
    store: FeatureStore,
    served_log: ServedLog | None = None,
    recall: RecallStore | None = None,
) -> MeshServer:
    return MeshServer(
        "feature",
        f"{settings.bind_host}:{settings.feature_port}",
        [
            Registration(
                "recmesh.v1.FeatureService",
                features_pb2_grpc.add_FeatureServiceServicer_to_server,
                FeatureServicer(store, settings, served_log, recall or RecallStore(store.client)),
            )
        ],
    )
