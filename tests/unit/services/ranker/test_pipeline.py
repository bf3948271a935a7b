"""RankPipeline running the shipped graph: a skippable node that fails or runs
past its share of the budget gives its neutral answer and says why; a required
node that fails fails the request. Pure orchestration over stand-in clients
(the stages' calls are what the graph decides to make); with no user history
and no item vectors the personal recall sources recall nothing, so popularity
decides the candidates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from recmesh.clients.inference import UNSCORED_MODEL, Scored
from recmesh.errors import Unavailable
from recmesh.features.block import layout_name
from recmesh.features.repository import FeatureSet
from recmesh.resilience import request_scope
from recmesh.settings import RankerSettings
from recmesh.v1 import features_pb2 as pb
from services.ranker.pipeline import RankPipeline, build_pipeline

POPULAR = [("i1", 3.0), ("i2", 2.0), ("i3", 1.0)]


class Features:
    """The feature service as the stages call it; `user_down` fails the user look-up."""

    def __init__(self, user_down: bool = False, popular_down: bool = False) -> None:
        self.user_down = user_down
        self.popular_down = popular_down

    async def popular(self, limit: int, cap_s: float | None = None) -> list[tuple[str, float]]:
        if self.popular_down:
            raise Unavailable("feature.GetPopular: down")
        return POPULAR[:limit]

    async def get_features(self, user_id: str, item_ids: list[str], as_of_ms: int, **kw: Any) -> Any:
        if not item_ids and self.user_down:
            raise Unavailable("feature.GetFeatures: down")
        resp = pb.GetFeaturesResponse(feature_version="fs-v1", as_of_ms=as_of_ms)
        resp.user.entity_id = user_id
        if kw.get("item_block"):  # the ranker's default: the packed form
            resp.item_block.layout = layout_name("fs-v1")
            resp.item_block.entity_ids.extend(item_ids)
        else:
            resp.items.entity_ids.extend(item_ids)
        return resp


class Inference:
    """Scores the items in reverse recall order, or fails, or answers too late."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode

    async def score_features(self, version: str, user: Any, items: Any, level: int = 0,
                             cap_s: float | None = None) -> Scored:  # fmt: skip
        if self.mode == "down":
            raise Unavailable("inference.Score: down")
        if self.mode == "slow":
            await asyncio.sleep(5.0)
        n = len(items.entity_ids)
        return Scored([float(i) for i in range(n)], "model-v7", 0)


def pipeline(
    tmp_path: Path, feature_set: FeatureSet, features: Features, inference: Inference, blend: float = 0.0
) -> RankPipeline:
    # no item vectors there: no semantic index; blend 0: the model's order alone
    settings = RankerSettings(model_dir=tmp_path, recall_blend=blend)
    return build_pipeline(settings, features, inference, feature_set)  # type: ignore[arg-type]


async def test_every_node_answering_ranks_by_score(tmp_path: Path, demo_feature_set: FeatureSet) -> None:
    ranked = await pipeline(tmp_path, demo_feature_set, Features(), Inference()).rank("u1", 3, 1_000)
    assert [i for i, _ in ranked.items] == ["i3", "i2", "i1"]
    assert ranked.model_version == "model-v7" and ranked.feature_version == "fs-v1"
    assert ranked.degraded == []


async def test_the_recall_blend_weighs_the_recall_order_against_the_models(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    # The stand-in model orders i3, i2, i1; recall i1, i2, i3. Equal weights tie
    # the ends (ties keep recall order) ahead of the middle; a heavier recall weight keeps its order.
    for blend, want in ((0.0, ["i3", "i2", "i1"]), (1.0, ["i1", "i3", "i2"]), (2.0, ["i1", "i2", "i3"])):
        ranked = await pipeline(tmp_path, demo_feature_set, Features(), Inference(), blend).rank(
            "u1", 3, 1_000
        )
        assert [i for i, _ in ranked.items] == want, blend


async def test_a_failing_skippable_node_gives_its_neutral_answer(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    run = pipeline(tmp_path, demo_feature_set, Features(user_down=True), Inference("down"))
    ranked = await run.rank("u1", 3, 1_000)
    # Scoring down: the recall order stands, unscored; the user look-up down: no user features.
    assert [i for i, _ in ranked.items] == ["i1", "i2", "i3"]
    assert ranked.model_version == UNSCORED_MODEL
    assert ranked.degraded == ["user_features_unavailable", "scoring_unavailable"]


async def test_a_node_past_its_budget_share_falls_back_in_time(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    run = pipeline(tmp_path, demo_feature_set, Features(), Inference("slow"))
    started = time.perf_counter()
    with request_scope("A", 0.3):
        ranked = await run.rank("u1", 3, 1_000)
    took = time.perf_counter() - started
    assert ranked.model_version == UNSCORED_MODEL and "scoring_unavailable" in ranked.degraded
    assert took < 0.3, f"scoring's share of the 300 ms budget, not the stand-in's 5 s: {took:.3f} s"


async def test_a_required_node_failing_fails_the_request(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    run = pipeline(tmp_path, demo_feature_set, Features(popular_down=True), Inference())
    with pytest.raises(Unavailable, match="GetPopular"):
        await run.rank("u1", 3, 1_000)
