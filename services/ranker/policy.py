"""Pure ranking rules, tested with plain values."""

from __future__ import annotations

from collections.abc import Sequence

from recmesh.resilience import load_band


def top_n(item_ids: Sequence[str], scores: Sequence[float], n: int) -> list[tuple[str, float]]:
    """The n best (item, score) pairs, best first; ties keep candidate order."""
    values = [float(s) for s in scores]
    ranked = sorted(range(len(values)), key=values.__getitem__, reverse=True)  # stable: ties in order
    return [(item_ids[i], values[i]) for i in ranked[:n]]


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
