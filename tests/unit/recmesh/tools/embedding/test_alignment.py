"""Replay and MRR for the semantic alignment figure, on plain values."""

from __future__ import annotations

import numpy as np

from recmesh.tools.embedding.alignment import Case, alignment_report, reciprocal_ranks, replay_cases


def _ev(user: str, item: str, behavior: str) -> dict[str, str]:
    return {"user_id": user, "item_id": item, "behavior": behavior}


def test_replay_uses_views_before_the_click_but_not_the_clicked_item() -> None:
    index = {f"i{n}": n for n in range(6)}
    events = [
        _ev("u", "i0", "view"), _ev("u", "i1", "view"), _ev("v", "i5", "view"),
        _ev("u", "i2", "view"), _ev("u", "i3", "view"), _ev("u", "i3", "click"),
        _ev("w", "i4", "view"), _ev("w", "i4", "click"),  # no other history: no case
    ]  # fmt: skip
    assert replay_cases(events, index, history=2) == [Case([1, 2], 3)]


def test_reciprocal_rank_excludes_history() -> None:
    scores = np.array([[0.9, 0.8, 0.1, 0.5]], dtype=np.float32)
    assert reciprocal_ranks(scores, [Case([0], 3)]).tolist() == [0.5]
    assert reciprocal_ranks(scores, [Case([0], 1)]).tolist() == [1.0]


def test_report_beats_random_when_vectors_carry_the_signal() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 16))
    groups = np.repeat(np.arange(4), 25)
    matrix = centres[groups] + 0.3 * rng.normal(size=(100, 16))
    matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)
    cases = [Case([g * 25, g * 25 + 1], g * 25 + k) for g in range(4) for k in range(2, 25)]
    report = alignment_report(matrix, np.ones(100), cases)
    # The vectors only tell the group: the target is found among its group's 23 candidates, not 98.
    assert report["mrr_intent_cosine"] > 2 * report["mrr_random"]
    assert report["mean_cosine_intent_to_clicked"] > report["mean_cosine_intent_to_all"]
