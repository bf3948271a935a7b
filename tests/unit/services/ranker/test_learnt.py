"""Learnt recall sources in the ranker: seeds from the user's history, the
version's decay, hot switching, refusal of another feature set, and the
learnt fusion weights (pure logic over files made here)."""

from __future__ import annotations

from pathlib import Path

from recmesh.features.repository import FeatureSet
from recmesh.retrieval import files
from recmesh.retrieval.table import NeighbourTable
from recmesh.settings import RankerSettings
from services.ranker.learnt import LearntSource, RecallHolder
from services.ranker.recall import RecallContext
from services.ranker.stages import Env, effective_weights


def _ctx(history: list[str] | None) -> RecallContext:
    return RecallContext("u1", {}, {}, 10, 1.0, history=history)


def _save(model_dir: Path, fs_version: str, decay: float = 0.5) -> str:
    table = NeighbourTable.from_pairs({"a": [("x", 1.0)], "b": [("y", 1.5)]}, keep=10)
    card = {"feature_set_version": fs_version, "sources": {"knn": {"decay": decay}},
            "fusion": {"knn": 0.75, "popular": 0.0}}  # fmt: skip
    return files.save(model_dir, card, {"knn": table})


async def test_the_source_sums_the_rows_of_the_history_with_the_learnt_decay(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    _save(tmp_path, demo_feature_set.version, decay=0.5)
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    assert holder.refresh()
    source = LearntSource("knn", holder, demo_feature_set.roles)
    got = await source.fetch(_ctx(["a", "b"]))  # a newest (weight 1), b next (0.5)
    assert got.items == [("x", 1.0), ("y", 0.75)]
    empty = await source.fetch(_ctx([]))
    assert empty.items == [] and empty.attributes["seeds"] == 0


async def test_without_a_version_or_table_the_source_recalls_nothing_and_says_why(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    got = await LearntSource("knn", holder, demo_feature_set.roles).fetch(_ctx(["a"]))
    assert got.items == [] and got.attributes["table"] == "absent"
    _save(tmp_path, demo_feature_set.version)
    holder.refresh()
    got = await LearntSource("ease", holder, demo_feature_set.roles).fetch(_ctx(["a"]))
    assert got.items == [] and got.attributes["table"] == "absent"


async def test_a_version_of_another_feature_set_is_refused(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    _save(tmp_path, "fs-somewhere-else")
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    assert holder.current is None
    assert holder.problem is not None and "fs-somewhere-else" in holder.problem
    got = await LearntSource("knn", holder, demo_feature_set.roles).fetch(_ctx(["a"]))
    assert got.items == [] and "fs-somewhere-else" in str(got.attributes["table"])


def test_a_new_current_version_is_picked_up(tmp_path: Path, demo_feature_set: FeatureSet) -> None:
    first = _save(tmp_path, demo_feature_set.version, decay=0.5)
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    assert holder.current is not None and holder.current.version == first
    second = _save(tmp_path, demo_feature_set.version, decay=0.9)
    assert holder.refresh()
    assert holder.current.version == second != first
    assert not holder.refresh()  # nothing changed


def test_learnt_fusion_weights_apply_unless_configured(tmp_path: Path, demo_feature_set: FeatureSet) -> None:
    _save(tmp_path, demo_feature_set.version)
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    env = Env(None, None, RankerSettings(), demo_feature_set, {}, learnt_fusion=holder.fusion)  # type: ignore[arg-type]
    w = effective_weights(env)
    # learnt: knn's weight; popularity floored (cold users still get candidates);
    # the sources without a learnt weight scaled down to fill in
    assert w["knn"] == 0.75 and w["popular"] == 0.01
    assert w["covisit"] == 0.35 * 0.15 and w["ease"] == 1.0
    configured = RankerSettings(fusion_weights={"popular": 0.2, "knn": 2.0})
    env = Env(None, None, configured, demo_feature_set, {}, learnt_fusion=holder.fusion)  # type: ignore[arg-type]
    assert effective_weights(env) == {"popular": 0.2, "knn": 2.0}
    env = Env(None, None, RankerSettings(), demo_feature_set, {})  # type: ignore[arg-type]
    assert effective_weights(env) == RankerSettings().fusion_weights  # no learnt version: as configured


def test_the_model_recall_blend_applies_only_with_a_learnt_version(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    assert holder.blend() == 0.0  # no learnt table in the recall order: the model's order
    _save(tmp_path, demo_feature_set.version)
    holder.refresh()
    assert holder.blend() == 2.0


async def test_the_vectors_source_searches_with_the_users_vector_or_their_history(
    tmp_path: Path, demo_feature_set: FeatureSet
) -> None:
    import numpy as np

    from recmesh.retrieval.vectors import TwoTower
    from services.ranker.learnt import VectorSource

    items = np.array([[1, 0], [0.9, 0.1], [0, 1]], np.float32)
    two = TwoTower(["a", "b", "c"], items, ["u1"], np.array([[0, 1]], np.float32))
    files.save(
        tmp_path,
        {"feature_set_version": demo_feature_set.version, "fusion": {"vectors": 1.0}},
        {},
        vectors=two,
    )
    holder = RecallHolder(tmp_path, demo_feature_set.version)
    holder.refresh()
    source = VectorSource(holder, demo_feature_set.roles)
    own = await source.fetch(_ctx([]))  # u1's own vector points at c
    assert own.items[0][0] == "c" and own.attributes["query"] == "user"
    other = await source.fetch(RecallContext("u9", {}, {}, 10, 1.0, history=["a"]))
    assert [i for i, _ in other.items][:1] == ["b"] and other.attributes["query"] == "history"  # a is seen


async def test_past_the_head_the_fused_list_follows_the_depth_weights(demo_feature_set: FeatureSet) -> None:
    from services.ranker.recall import Recalled
    from services.ranker.stages import Candidates, RequestState, SourceOut, _run_fuse

    knn = [(f"k{n:03d}", 1.0) for n in range(80)]
    ease = [(f"e{n:03d}", 1.0) for n in range(80)]
    inputs = {
        "knn": SourceOut("knn", "learnt", Recalled(knn)),
        "ease": SourceOut("ease", "learnt", Recalled(ease)),
    }

    async def fused(depth: dict[str, float]) -> list[str]:
        env = Env(
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            RankerSettings(), demo_feature_set, {}, learnt_fusion=lambda: {"knn": 1.0, "ease": 0.0},
            learnt_fusion_depth=lambda: depth,
        )  # fmt: skip
        req = RequestState("u1", 5, 1_000, {}, frozenset())
        out = await _run_fuse(env, req, None, inputs, 1.0)  # type: ignore[arg-type]
        assert isinstance(out, Candidates)
        return [f.item_id for f in out.items]

    assert await fused({}) == [i for i, _ in knn]  # one set of weights: ease (weight 0) brings nothing
    got = await fused({"knn": 0.0, "ease": 1.0})
    assert got[:50] == [i for i, _ in knn[:50]] and got[50:] == [i for i, _ in ease]


async def test_with_recall_seen_declared_an_item_only_viewed_may_come_back(tmp_path: Path) -> None:
    from recmesh.features.repository import parse_feature_set

    feature_set = parse_feature_set(SEEN_REPO, tmp_path / "recmesh.toml")
    assert feature_set.roles.seen == "bought" and feature_set.roles.seen_behaviors == frozenset({"purchase"})
    table = NeighbourTable.from_pairs({"a": [("b", 2.0), ("x", 1.0)], "b": [("a", 1.0), ("y", 0.5)]}, keep=10)
    files.save(
        tmp_path,
        {"feature_set_version": feature_set.version, "sources": {"knn": {"decay": 1.0}}},
        {"knn": table},
    )
    holder = RecallHolder(tmp_path, feature_set.version)
    holder.refresh()
    source = LearntSource("knn", holder, feature_set.roles)
    # a and b in the history (viewed); a bought: b may be recommended, a may not.
    ctx = RecallContext("u1", {"bought": ["a"]}, {}, 10, 1.0, history=["a", "b"])
    assert [i for i, _ in (await source.fetch(ctx)).items] == ["b", "x", "y"]
    # Without recall.seen (the default), every history item is seen.
    default = LearntSource("knn", holder, parse_feature_set(SEEN_REPO.replace('seen = "bought"', ""),
                                                           tmp_path / "r.toml").roles)  # fmt: skip
    assert [i for i, _ in (await default.fetch(ctx)).items] == ["x", "y"]
    # The revisit source: the history's items not seen, newest first (nothing without recall.seen).
    from services.ranker.learnt import RevisitSource

    assert (await RevisitSource(feature_set.roles).fetch(ctx)).items == [("b", 1.0)]
    assert (await RevisitSource(default._roles).fetch(ctx)).items == []


SEEN_REPO = """
[repository]
name = "shop"

[events]
behaviors = ["view", "purchase"]

[realtime.bought]
entity = "user"
aggregate = "last_n"
n = 50
behaviors = ["purchase"]
window = "90d"

[recall]
seen = "bought"
"""
