"""Pure recall rules: category affinity, semantic confidence, fusion, diversity.

Everything here works on plain values and is unit-tested with them; the I/O
around it (which source asks what, with which deadline) is in `recall.py`.

Fusion follows the design notes' hybrid rule. Each source has a role: the
collaborative source (`cf`, co-visitation) gets weight w*(1-sigma), the graph source
(`graph`, the user -> category -> item affinity) w*(1-0.5sigma), the semantic
source w*sigma, and a `prior` source (popularity) keeps w. sigma is the semantic
source's confidence from its similarity margins (0 when it has nothing to say),
so the better the embedding neighbourhood stands out, the more it counts. A
`learnt` source (item-kNN, EASE, a team's table: services/ranker/learnt.py)
keeps w too, and its w is learnt with its table (recmesh.retrieval.build.tune). The
default base weights are the design notes' (0.35, 0.45, 0.20) plus 0.10 for the
popularity prior. Inside a source, items are scored by reciprocal rank
(RRF_K / (RRF_K + rank)), so sources with incomparable raw scores (counts,
popularity, cosine) fuse on one scale.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

Role = Literal["cf", "graph", "semantic", "prior", "learnt"]

RRF_K = 60.0
# A category the user declared (offline interest_tags) counts like this many
# real-time clicks in it over the last 10 minutes.
INTEREST_TAG_CLICKS = 1.0


@dataclass(slots=True)
class Fused:
    item_id: str
    score: float
    sources: tuple[str, ...] = field(default=())


def role_weights(base: Mapping[str, float], roles: Mapping[str, Role], sigma: float) -> dict[str, float]:
    """Each source's weight after the hybrid rule shifted it by the semantic confidence sigma."""
    s = min(1.0, max(0.0, sigma))
    factor: dict[Role, float] = {
        "cf": 1.0 - s,
        "graph": 1.0 - 0.5 * s,
        "semantic": s,
        "prior": 1.0,
        "learnt": 1.0,
    }
    return {name: w * factor[roles.get(name, "prior")] for name, w in base.items()}


def rank_score(rank: int) -> float:
    """Reciprocal-rank score of the item at 0-based `rank` within its source."""
    return RRF_K / (RRF_K + rank)


def fuse(lists: Mapping[str, Sequence[tuple[str, float]]], weights: Mapping[str, float]) -> list[Fused]:
    """One deduplicated list: an item's score is the weighted sum of its rank
    scores over the sources that returned it. Best first; ties by item id.
    A source without a weight (or with weight 0) does not contribute."""
    score: dict[str, float] = {}
    sources: dict[str, tuple[str, ...]] = {}
    for name, items in lists.items():
        w = weights.get(name, 0.0)
        if w <= 0.0:
            continue
        wk, one = w * RRF_K, (name,)
        for rank, item_id in enumerate(dict.fromkeys([i for i, _ in items])):
            s = wk / (RRF_K + rank)  # w * rank_score(rank), inlined: this loop is the ranker's hottest
            if item_id in score:
                score[item_id] += s
                sources[item_id] += one
            else:
                score[item_id] = s
                sources[item_id] = one
    ordered = sorted(score)  # ties by item id: the sort below is stable
    ordered.sort(key=score.__getitem__, reverse=True)
    return [Fused(i, score[i], sources[i]) for i in ordered]


def contributions(fused: Sequence[Fused]) -> dict[str, int]:
    """How many of the fused items each source brought (an item with two sources counts for both)."""
    return dict(Counter(chain.from_iterable(f.sources for f in fused)))


# --- category affinity --------------------------------------------------------


# A real-time feature at or above this freshness (2^(-age/tau)) is trusted in full;
# below it, its weight falls linearly to 0 (a 10-minute count whose newest click
# is several tau old says less about the user's current intent).
FRESHNESS_TRUST_THRESHOLD = 0.5


def realtime_trust(freshness: float, threshold: float = FRESHNESS_TRUST_THRESHOLD) -> float:
    """Weight in [0, 1] of a real-time signal with this freshness score."""
    if freshness >= threshold:
        return 1.0
    return max(0.0, freshness) / threshold


def category_affinity(
    category_clicks: Mapping[str, int],
    interest_tags: Sequence[str],
    limit: int,
    realtime_weight: float = 1.0,
) -> list[tuple[str, float]]:
    """The user's categories, strongest first: real-time clicks in the last 10
    minutes (times `realtime_weight`, from their freshness) plus
    INTEREST_TAG_CLICKS for each declared interest. Ties by name."""
    weight: dict[str, float] = {}
    for cat, clicks in category_clicks.items():
        if clicks > 0 and cat and realtime_weight > 0:
            weight[cat] = weight.get(cat, 0.0) + float(clicks) * realtime_weight
    for cat in interest_tags:
        if cat:
            weight[cat] = weight.get(cat, 0.0) + INTEREST_TAG_CLICKS
    return sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def affinity_candidates(
    affinity: Sequence[tuple[str, float]],
    popular_by_category: Mapping[str, Sequence[tuple[str, float]]],
    limit: int,
) -> list[tuple[str, float]]:
    """Popular items of the user's categories, interleaved by affinity: an item
    scores its category's affinity share times its rank score there."""
    total = sum(w for _, w in affinity) or 1.0
    best: dict[str, float] = {}
    held = best.get
    for cat, w in affinity:
        items = popular_by_category.get(cat, ())
        share = w / total
        for item_id, rs in zip([i for i, _ in items], _rank_scores(len(items)), strict=False):
            s = share * rs
            if s > held(item_id, 0.0):
                best[item_id] = s
    ordered = sorted(best)  # ties by item id: the sort below is stable
    ordered.sort(key=best.__getitem__, reverse=True)
    return [(i, best[i]) for i in ordered[:limit]]


_RANK_SCORES: list[float] = []


def _rank_scores(n: int) -> list[float]:
    """rank_score(r) for r < n (at least), computed once."""
    if len(_RANK_SCORES) < n:
        _RANK_SCORES.extend(rank_score(r) for r in range(len(_RANK_SCORES), n))
    return _RANK_SCORES


# --- semantic confidence ----------------------------------------------------------

# Margin between the best neighbours and the rest that counts as full confidence.
SIGMA_FULL_MARGIN = 0.25
SIGMA_TOP = 10


def semantic_sigma(similarities: Sequence[float], coherence: float) -> float:
    """sigma in [0, 1] from the similarity margin of the semantic neighbours.

    `similarities` are the cosine similarities of the returned neighbours, best
    first; the margin is the mean of the best SIGMA_TOP minus the mean of the
    rest, so a neighbourhood that stands out from the background gives a high sigma
    and a flat one a low sigma. `coherence` (the norm of the mean of the unit
    vectors behind the intent, 1 when they agree, near 0 when they point every
    way) scales it down for a muddled intent. No neighbours -> 0."""
    if len(similarities) <= SIGMA_TOP or coherence <= 0.0:
        return 0.0
    top = list(similarities[:SIGMA_TOP])
    rest = list(similarities[SIGMA_TOP:])
    margin = sum(top) / len(top) - sum(rest) / len(rest)
    return min(1.0, max(0.0, margin / SIGMA_FULL_MARGIN)) * min(1.0, coherence)


# --- filtering and diversity --------------------------------------------------------


def drop_items(fused: Sequence[Fused], unwanted: Collection[str]) -> list[Fused]:
    """Remove items the user just saw (or any other unwanted ids); keep order."""
    return [f for f in fused if f.item_id not in unwanted]


def cap_per_category(
    ranked: Sequence[tuple[str, float]], categories: Mapping[str, str], cap: int, n: int
) -> list[tuple[str, float]]:
    """The first n items of `ranked` with at most `cap` per category, keeping
    order. Items whose category is unknown are not capped. When the cap leaves
    fewer than n, the best of the skipped items fill the rest (a short answer
    would be worse than a less diverse one)."""
    if cap <= 0:
        return list(ranked[:n])
    taken: list[tuple[str, float]] = []
    skipped: list[tuple[str, float]] = []
    per: dict[str, int] = {}
    for item in ranked:
        if len(taken) == n:
            break
        cat = categories.get(item[0], "unknown")
        if cat != "unknown" and per.get(cat, 0) >= cap:
            skipped.append(item)
            continue
        per[cat] = per.get(cat, 0) + 1
        taken.append(item)
    if len(taken) < n:
        chosen = {i for i, _ in taken} | {i for i, _ in skipped[: n - len(taken)]}
        taken = [item for item in ranked if item[0] in chosen][:n]
    return taken
