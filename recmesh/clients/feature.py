"""FeatureClient: the feature service's RPCs (features, popularity, recall look-ups)."""

from __future__ import annotations

from recmesh.clients.base import GrpcClient, ResiliencePolicy
from recmesh.v1 import features_pb2, features_pb2_grpc


class FeatureClient(GrpcClient):
    target = "feature"
    service_name = "recmesh.v1.FeatureService"

    def __init__(
        self, address: str, caller: str, margin_ms: float = 5.0, policy: ResiliencePolicy | None = None
    ) -> None:
        super().__init__(address, caller, margin_ms, policy)
        self._stub = features_pb2_grpc.FeatureServiceStub(self.channel)

    async def get_features(
        self,
        user_id: str,
        item_ids: list[str],
        as_of_ms: int,
        cap_s: float | None = None,
        *,
        related_limit: int = 0,
        related_per_item: int = 0,
        items_only: bool = False,
        history_limit: int = 0,
        item_block: bool = False,
    ) -> features_pb2.GetFeaturesResponse:
        """`related_limit` > 0 also asks for the user's co-visitation recall
        (the response's `related`, when `related_included`); `items_only`
        skips the user's features (the response's user row is empty);
        `history_limit` > 0 asks for the user's newest distinct items too;
        `item_block` asks for the items as one packed block (the response's
        `item_block`, recmesh/features/block.py) instead of `items`."""
        req = features_pb2.GetFeaturesRequest(
            user_id=user_id, item_ids=item_ids, as_of_ms=as_of_ms,
            related_limit=related_limit, related_per_item=related_per_item, items_only=items_only,
            history_limit=history_limit, item_block=item_block,
        )  # fmt: skip
        # User-only look-ups and candidate look-ups hedge on their own p95.
        kind = "GetFeatures:items" if item_ids else "GetFeatures:user"
        return await self._call(
            "GetFeatures", self._stub.GetFeatures, req, cap_s, retry=True, hedge=True, latency_key=kind
        )

    async def popular(self, limit: int, cap_s: float | None = None) -> list[tuple[str, float]]:
        req = features_pb2.GetPopularRequest(limit=limit)
        resp: features_pb2.GetPopularResponse = await self._call(
            "GetPopular", self._stub.GetPopular, req, cap_s, retry=True
        )
        return [(i.item_id, i.score) for i in resp.items]

    async def related(
        self, item_ids: list[str], limit: int, per_item: int = 0, cap_s: float | None = None
    ) -> list[tuple[str, float]]:
        req = features_pb2.GetRelatedRequest(item_ids=item_ids, limit=limit, per_item=per_item)
        resp: features_pb2.GetRelatedResponse = await self._call(
            "GetRelated", self._stub.GetRelated, req, cap_s
        )
        return [(i.item_id, i.score) for i in resp.items]

    async def category_popular(
        self, categories: list[str], limit: int, cap_s: float | None = None
    ) -> dict[str, list[tuple[str, float]]]:
        req = features_pb2.GetCategoryPopularRequest(categories=categories, limit=limit)
        resp: features_pb2.GetCategoryPopularResponse = await self._call(
            "GetCategoryPopular", self._stub.GetCategoryPopular, req, cap_s
        )
        return {c.category: [(i.item_id, i.score) for i in c.items] for c in resp.categories}
