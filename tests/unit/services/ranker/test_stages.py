"""The ranker's two feature look-ups: the candidate look-up skips the user part
only when the user look-up read the store without falling back (pure logic: a
recording stand-in for the feature client)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recmesh.features.block import layout_name
from recmesh.features.repository import FeatureSet
from recmesh.features.wire import row_values
from recmesh.settings import RankerSettings
from recmesh.v1 import features_pb2 as pb
from services.ranker.fusion import Fused
from services.ranker.stages import Candidates, Env, ItemFeatures, RequestState, _run_features, _run_user


class RecordingFeatures:
    def __init__(self, user_degraded: list[str]) -> None:
        self.user_degraded = user_degraded
        self.calls: list[dict[str, Any]] = []

    async def get_features(self, user_id: str, item_ids: list[str], as_of_ms: int, **kw: Any) -> Any:
        self.calls.append({"items": list(item_ids), **kw})
        resp = pb.GetFeaturesResponse(feature_version="fs-v1", as_of_ms=as_of_ms)
        if not kw.get("items_only"):
            resp.user.entity_id = user_id
            resp.user.features["clicks_5m"].number = 0.0 if not item_ids else 7.0
        if not item_ids:
            resp.degraded.extend(self.user_degraded)
        if kw.get("item_block"):
            resp.item_block.layout = layout_name("fs-v1")
        (resp.item_block if kw.get("item_block") else resp.items).entity_ids.extend(item_ids)
        return resp


@pytest.mark.parametrize(
    ("user_degraded", "items_only"),
    [([], True), (["related_timeout"], True), (["realtime_store_timeout"], False)],
)
async def test_the_candidate_lookup_rereads_the_user_only_after_a_fallback(
    user_degraded: list[str], items_only: bool, demo_feature_set: FeatureSet
) -> None:
    features = RecordingFeatures(user_degraded)
    env = Env(features, None, RankerSettings(), demo_feature_set, {})  # type: ignore[arg-type]
    req = RequestState("u1", 5, 1_000, {}, frozenset())
    user = await _run_user(env, req, None, {}, 1.0)  # type: ignore[arg-type]
    inputs = {"user": user, "fuse": Candidates([Fused("i1", 1.0), Fused("i2", 0.5)])}
    out = await _run_features(env, req, None, inputs, 1.0)  # type: ignore[arg-type]
    assert isinstance(out, ItemFeatures)
    assert features.calls[1]["items_only"] is items_only
    # The user features scored are the freshest read: the re-read's when there was one.
    assert row_values(out.user)["clicks_5m"] == (0 if items_only else 7)
    assert out.user.entity_id == "u1"
    assert list(out.items.entity_ids) == ["i1", "i2"] and out.feature_version == "fs-v1"


class CategoryFeatures:
    """Answers with the items' recall category as a text column or as string lists,
    in the message form or in a packed block, as asked."""

    def __init__(self, multi: bool) -> None:
        self.multi = multi

    async def get_features(self, user_id: str, item_ids: list[str], as_of_ms: int, **kw: Any) -> Any:
        resp = pb.GetFeaturesResponse(feature_version="fs-v1", as_of_ms=as_of_ms)
        resp.user.entity_id = user_id
        if kw.get("item_block"):
            block = resp.item_block
            block.layout = layout_name("fs-v1")
            block.entity_ids.extend(item_ids)
            block.dictionaries.add(column="category", values=["news", "music", "food"])
            if self.multi:
                offsets, codes = [0, 2, 2, 3], [0, 2, 1]
                block.lists.add(column="category", offsets=np.asarray(offsets, "<i4").tobytes(),
                                codes=np.asarray(codes, "<i4").tobytes())  # fmt: skip
            else:
                block.dictionaries[0].values.append("")
                block.columns.extend(["other", "category"])
                block.values = np.asarray([[5, 0], [6, 3], [7, 1]], "<f8").tobytes()
            return resp
        resp.items.entity_ids.extend(item_ids)
        col = resp.items.columns.add(name="category")
        if self.multi:
            for values in (["news", "food"], [], ["music"]):
                col.string_lists.add().values.extend(values)
        else:
            col.texts.extend(["news", "", "music"])
        resp.items.columns.add(name="other").texts.extend(["x", "y", "z"])
        return resp


@pytest.mark.parametrize("block", [True, False])
@pytest.mark.parametrize("multi", [False, True])
async def test_the_diversity_categories_are_the_repositorys_recall_category(
    multi: bool, block: bool, demo_feature_set: FeatureSet
) -> None:
    assert demo_feature_set.roles.category == "category"
    settings = RankerSettings(item_block=block)
    env = Env(CategoryFeatures(multi), None, settings, demo_feature_set, {})  # type: ignore[arg-type]
    req = RequestState("u1", 5, 1_000, {}, frozenset())
    inputs = {"fuse": Candidates([Fused("i1", 1.0), Fused("i2", 0.5), Fused("i3", 0.2)])}
    out = await _run_features(env, req, None, inputs, 1.0)  # type: ignore[arg-type]
    assert isinstance(out, ItemFeatures)
    # The first value of a multi-valued category; an item without one is left out.
    assert out.categories == {"i1": "news", "i3": "music"}


async def test_the_user_lookup_asks_for_the_history_only_when_a_learnt_source_serves(
    demo_feature_set: FeatureSet,
) -> None:
    for serves, want in ((False, 0), (True, demo_feature_set.roles.history_cap)):
        features = RecordingFeatures([])

        def learnt_serves(source: str, answer: bool = serves) -> bool:
            return answer

        history = demo_feature_set.roles.history_cap
        env = Env(features, None, RankerSettings(), demo_feature_set, {}, history_limit=history,  # type: ignore[arg-type]
                  learnt_serves=learnt_serves)  # fmt: skip
        await _run_user(env, RequestState("u1", 5, 1_000, {}, frozenset()), None, {}, 1.0)  # type: ignore[arg-type]
        assert features.calls[0]["history_limit"] == want
