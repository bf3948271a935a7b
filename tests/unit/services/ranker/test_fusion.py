from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.ranker.fusion import (
    Fused,
    Role,
    affinity_candidates,
    cap_per_category,
    category_affinity,
    contributions,
    drop_items,
    fuse,
    rank_score,
    realtime_trust,
    role_weights,
    semantic_sigma,
)

BASE = {"popular": 0.10, "covisit": 0.35, "category": 0.45, "semantic": 0.20}
ROLES: dict[str, Role] = {"popular": "prior", "covisit": "cf", "category": "graph", "semantic": "semantic"}


def test_hybrid_rule_without_semantic_confidence_keeps_cf_and_graph() -> None:
    assert role_weights(BASE, ROLES, 0.0) == {**BASE, "semantic": 0.0}


def test_hybrid_rule_shifts_weight_to_semantic_with_sigma() -> None:
    w = role_weights(BASE, ROLES, 0.5)
    assert w["covisit"] == pytest.approx(0.35 * 0.5)
    assert w["category"] == pytest.approx(0.45 * 0.75)
    assert w["semantic"] == pytest.approx(0.20 * 0.5)
    assert w["popular"] == pytest.approx(0.10)
    full = role_weights(BASE, ROLES, 3.0)  # clipped to 1
    assert full["covisit"] == 0.0 and full["category"] == pytest.approx(0.225) and full["semantic"] == 0.2


def test_fuse_dedups_sums_weighted_rank_scores_and_records_sources() -> None:
    fused = fuse(
        {"a": [("x", 9.0), ("y", 1.0)], "b": [("y", 100.0), ("z", 50.0), ("y", 1.0)]},
        {"a": 1.0, "b": 0.5},
    )
    assert [f.item_id for f in fused] == ["y", "x", "z"]
    y = fused[0]
    assert y.score == pytest.approx(rank_score(1) + 0.5 * rank_score(0))
    assert y.sources == ("a", "b")
    assert contributions(fused) == {"a": 2, "b": 2}


def test_fuse_ignores_sources_without_weight_and_breaks_ties_by_id() -> None:
    fused = fuse({"a": [("q", 1.0)], "b": [("p", 1.0)], "c": [("r", 1.0)]}, {"a": 1.0, "b": 1.0, "c": 0.0})
    assert [f.item_id for f in fused] == ["p", "q"]
    assert fuse({}, {}) == []


def test_drop_items_keeps_order() -> None:
    fused = [Fused("a", 3.0), Fused("b", 2.0), Fused("c", 1.0)]
    assert [f.item_id for f in drop_items(fused, {"b"})] == ["a", "c"]


def test_category_affinity_weighs_recent_clicks_over_interests() -> None:
    aff = category_affinity({"tech": 3, "food": 0, "music": 1}, ["news", "music"], 3)
    assert aff == [("tech", 3.0), ("music", 2.0), ("news", 1.0)]
    assert category_affinity({}, [], 3) == []
    assert category_affinity({"a": 1, "b": 1}, [], 1) == [("a", 1.0)]


def test_affinity_candidates_interleave_categories_by_weight() -> None:
    per_cat = {"tech": [("t1", 9.0), ("t2", 8.0)], "news": [("n1", 9.0), ("t1", 1.0)]}
    out = affinity_candidates([("tech", 3.0), ("news", 1.0)], per_cat, 10)
    assert [i for i, _ in out] == ["t1", "t2", "n1"]
    assert affinity_candidates([("tech", 3.0), ("news", 1.0)], per_cat, 2) == out[:2]
    assert affinity_candidates([], per_cat, 5) == []


# The rules as first written, one step per candidate: the ranker's own run the same
# arithmetic in fewer steps (its CPU per request, docs/architecture.md), and must give
# the same answer to the last bit.
def _affinity_reference(
    affinity: list[tuple[str, float]], per_cat: dict[str, list[tuple[str, float]]], limit: int
) -> list[tuple[str, float]]:
    total = sum(w for _, w in affinity) or 1.0
    best: dict[str, float] = {}
    for cat, w in affinity:
        for rank, (item_id, _) in enumerate(per_cat.get(cat, ())):
            s = (w / total) * rank_score(rank)
            if s > best.get(item_id, 0.0):
                best[item_id] = s
    return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def _contributions_reference(fused: list[Fused]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in fused:
        for s in f.sources:
            out[s] = out.get(s, 0) + 1
    return out


ITEMS = st.sampled_from([f"i{n}" for n in range(40)])
CATEGORIES = st.sampled_from(["tech", "news", "food", "music", "sport"])


@given(
    # weights from a few values: equal scores, whose order is by item id, are common
    affinity=st.lists(
        st.tuples(CATEGORIES, st.sampled_from([0.0, 1.0, 2.0, 0.3])), max_size=5, unique_by=lambda t: t[0]
    ),
    per_cat=st.dictionaries(CATEGORIES, st.lists(st.tuples(ITEMS, st.floats(0.0, 1.0)), max_size=60)),
    limit=st.integers(0, 80),
)
def test_affinity_candidates_match_the_rule_step_by_step(
    affinity: list[tuple[str, float]], per_cat: dict[str, list[tuple[str, float]]], limit: int
) -> None:
    assert affinity_candidates(affinity, per_cat, limit) == _affinity_reference(affinity, per_cat, limit)


@given(st.dictionaries(st.sampled_from("abcd"), st.lists(st.tuples(ITEMS, st.just(1.0)), max_size=50)))
def test_contributions_count_every_source_of_every_item(lists: dict[str, list[tuple[str, float]]]) -> None:
    fused = fuse(lists, dict.fromkeys(lists, 1.0))
    assert contributions(fused) == _contributions_reference(fused)
    assert list(contributions(fused)) == list(_contributions_reference(fused))  # the same order, too


def test_sigma_is_high_for_a_standout_neighbourhood_and_zero_for_a_flat_one() -> None:
    standout = [0.9] * 10 + [0.5] * 40
    flat = [0.5] * 50
    assert semantic_sigma(standout, 1.0) == 1.0
    assert semantic_sigma(flat, 1.0) == 0.0
    assert semantic_sigma([0.6] * 10 + [0.5] * 40, 1.0) == pytest.approx(0.4)
    assert semantic_sigma(standout, 0.5) == pytest.approx(0.5), "a muddled intent lowers sigma"
    assert semantic_sigma([0.9] * 5, 1.0) == 0.0, "too few neighbours to judge"


def test_diversity_caps_items_per_category_in_score_order() -> None:
    ranked = [("a1", 0.9), ("a2", 0.8), ("a3", 0.7), ("b1", 0.6), ("c1", 0.5), ("b2", 0.4)]
    cats = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "c1": "c"}
    assert cap_per_category(ranked, cats, 2, 4) == [("a1", 0.9), ("a2", 0.8), ("b1", 0.6), ("c1", 0.5)]
    assert cap_per_category(ranked, cats, 0, 3) == ranked[:3]


def test_diversity_fills_from_skipped_items_rather_than_answering_short() -> None:
    ranked = [("a1", 0.9), ("a2", 0.8), ("a3", 0.7), ("b1", 0.6)]
    cats = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}
    assert cap_per_category(ranked, cats, 1, 3) == [("a1", 0.9), ("a2", 0.8), ("b1", 0.6)]


def test_diversity_does_not_cap_unknown_categories() -> None:
    ranked = [("x", 0.9), ("y", 0.8), ("z", 0.7)]
    assert cap_per_category(ranked, {}, 1, 3) == ranked


def test_realtime_trust_is_full_above_the_threshold_and_falls_linearly_below() -> None:
    assert realtime_trust(1.0) == realtime_trust(0.5) == 1.0
    assert realtime_trust(0.25) == 0.5
    assert realtime_trust(0.0) == realtime_trust(-1.0) == 0.0


def test_stale_realtime_clicks_count_less_than_declared_interests() -> None:
    clicks, tags = {"tech": 3}, ["news"]
    fresh = category_affinity(clicks, tags, 2, realtime_weight=realtime_trust(0.9))
    stale = category_affinity(clicks, tags, 2, realtime_weight=realtime_trust(0.05))
    assert fresh[0][0] == "tech"
    assert stale[0][0] == "news", "a click burst several tau old no longer outranks the profile"
    gone = category_affinity(clicks, tags, 2, realtime_weight=0.0)
    assert [c for c, _ in gone] == ["news"]
