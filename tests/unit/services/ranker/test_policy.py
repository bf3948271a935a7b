from __future__ import annotations

from recmesh.resilience import load_band
from services.ranker.policy import SKIP_FINE_RANKING, choose_level, sample_candidates, top_n


def test_top_n_orders_by_score_and_keeps_ties_stable() -> None:
    assert top_n(["a", "b", "c", "d"], [0.1, 0.9, 0.5, 0.9], 3) == [
        ("b", 0.9),
        ("d", 0.9),
        ("c", 0.5),
    ]
    assert top_n([], [], 3) == []


def test_ladder_full_service_with_budget_to_spare() -> None:
    assert choose_level(280.0, 300.0, 5.0, 0) == 0
    assert choose_level(None, 3000.0, 5.0, 0) == 0


def test_ladder_follows_the_inference_suggestion() -> None:
    assert choose_level(280.0, 300.0, 5.0, 2) == 2
    assert choose_level(280.0, 300.0, 5.0, 7) == 3


def test_ladder_samples_features_when_budget_runs_low() -> None:
    assert choose_level(80.0, 300.0, 5.0, 0) == 1  # under 30% of the class budget left


def test_ladder_skips_fine_ranking_when_recall_ran_long_or_no_time_is_left() -> None:
    assert (
        choose_level(2000.0, 3000.0, 1300.0, 0) == SKIP_FINE_RANKING
    )  # recall > 40% of the budget (1.2 s of 3 s)
    assert choose_level(10.0, 300.0, 1.0, 0) == SKIP_FINE_RANKING


def test_sampling_keeps_the_better_half_in_recall_order() -> None:
    cands = [(f"i{i}", float(10 - i)) for i in range(10)]
    assert sample_candidates(cands, 1) == cands[:5]
    assert sample_candidates(cands, 2) == cands[:5]
    assert sample_candidates(cands, 3) == cands[:5]
    assert sample_candidates(cands, 0) == cands
    assert sample_candidates(cands[:1], 1) == cands[:1]


def test_load_steps_down_the_ladder_in_the_design_notes_bands() -> None:
    assert [load_band(x) for x in (0.0, 0.69, 0.7, 0.84, 0.85, 0.94, 0.95, 3.0)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert choose_level(280.0, 300.0, 5.0, 0, load=0.75) == 1, "plenty of budget, but the ranker is loaded"
    assert choose_level(280.0, 300.0, 5.0, 2, load=0.75) == 2, "the worse of the two signals"
    assert choose_level(10.0, 300.0, 1.0, 0, load=0.99) == SKIP_FINE_RANKING, "the budget still rules"


def test_blend_orders_adds_the_recall_order_as_reciprocal_ranks() -> None:
    from services.ranker.policy import blend_orders

    ids = ["a", "b", "c", "d"]  # recall order
    scores = [0.1, 0.9, 0.5, 0.4]  # the model: b, c, d, a
    assert [i for i, _ in blend_orders(ids, scores, 0.0)] == ["b", "c", "d", "a"]
    assert [i for i, _ in blend_orders(ids, scores, 100.0)] == ["a", "b", "c", "d"]
    blended = blend_orders(ids, scores, 1.0)
    assert blended[0][0] == "b"  # second in recall, first for the model
    assert [s for _, s in blended] == sorted((s for _, s in blended), reverse=True)  # scores follow the order
