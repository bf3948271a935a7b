"""Pure ranking rules, tested with plain values."""

from __future__ import annotations

from collections.abc import Sequence

from recmesh.resilience import load_band


def top_n(item_ids: Sequence[str], scores: Sequence[float], n: int) -> list[tuple[str, float]]:
    """The n best (item, score) pairs, best first; ties keep candidate order."""
    values = [float(s) for s in scores]
    ranked = sorted(range(len(values)), key=values.__getitem__, reverse=True)  # stable: ties in order
    return [(item_ids[i], values[i]) for i in ranked[:n]]


def blend_orders(
    item_ids: Sequence[str], scores: Sequence[float], recall_weight: float
) -> list[tuple[str, float]]:
    """The final order of scored candidates (given in recall order): each item's
    reciprocal-rank score in the model's order plus `recall_weight` times its
    reciprocal-rank score in the recall order (fusion.py's RRF scale). 0 keeps
    the model's order; the recall order carries what the model's inputs do not
    (item-to-item structure of the whole log). Ties keep recall order."""
    if recall_weight <= 0.0:
        return top_n(item_ids, scores, len(item_ids))
    # The returned score is the blended one: an answer's scores follow its order.
    by_model = sorted(range(len(scores)), key=lambda i: float(scores[i]), reverse=True)
    blended = [0.0] * len(item_ids)
    for rank, i in enumerate(by_model):
        blended[i] += RRF_K / (RRF_K + rank)
    for i in range(len(item_ids)):
        blended[i] += recall_weight * RRF_K / (RRF_K + i)
    order = sorted(range(len(item_ids)), key=blended.__getitem__, reverse=True)
    return [(item_ids[i], blended[i]) for i in order]


RRF_K = 60.0

# --- degradation ladder -------------------------------------------------------

# Below this much budget left there is no time to fetch features and score.
SCORING_FLOOR_MS = 15.0
# A request that has used more than this share of the class budget (recall
# running long) skips fine ranking (design notes: recall > 1.2 s of a 3 s
# budget -> skip fine ranking).
RECALL_SKIP_SHARE = 0.4
# Under this share of the class budget left, sample features.
LOW_BUDGET_SHARE = 0.3

# Levels 1-3 are the inference service's model variants (the ranker asks for
# that level); SKIP_FINE_RANKING is the fuse past them: no scoring at all.
SKIP_FINE_RANKING = 4
LEVEL_NAMES = {
    1: "L1_feature_sampling",
    2: "L2_smaller_embeddings",
    3: "L3_no_cross_features",
    SKIP_FINE_RANKING: "L4_skip_fine_ranking",
}


def choose_level(
    remaining_ms: float | None,
    class_budget_ms: float,
    elapsed_ms: float,
    suggested_level: int,
    load: float = 0.0,
) -> int:
    """The ladder level for this request, 0 (full model) to 3 (the cheapest
    model variant), or SKIP_FINE_RANKING (recall order only), from what is left
    of the budget, how long the request has run so far (the ranker asks before
    every graph node), the inference service's own suggestion (0-3) and the
    ranker's load (Rank calls in flight over its capacity, in the design notes'
    bands: `resilience.load_band`). Downstream health acts through the circuit
    breakers instead: a call to an open one fails at once and its node takes
    its neutral answer (e.g. recall order, flagged `scoring_unavailable`)."""
    level = max(0, min(3, suggested_level), load_band(load))
    if elapsed_ms > RECALL_SKIP_SHARE * class_budget_ms:
        return SKIP_FINE_RANKING
    if remaining_ms is not None:
        if remaining_ms < SCORING_FLOOR_MS:
            return SKIP_FINE_RANKING
        if remaining_ms < LOW_BUDGET_SHARE * class_budget_ms:
            level = max(level, 1)
    return level


def sample_candidates(candidates: Sequence[tuple[str, float]], level: int) -> list[tuple[str, float]]:
    """From L1 on, only the better half of the candidates (by recall order) is
    scored; the rest follow in recall order. The levels also differ in the
    model variant they ask inference for (the level itself), which is where
    L2 and L3 save their further cost."""
    if level >= 1:
        return list(candidates[: max(1, len(candidates) // 2)])
    return list(candidates)
