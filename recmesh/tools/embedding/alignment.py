"""Semantic alignment, measured as the design notes do: mean reciprocal rank
of the next clicked item given the user's intent vector.

Replay: walk the demo events in time; for every click, the intent vector is
the mean of the vectors of the user's last `history` viewed items before it
(excluding the clicked item itself, whose own view precedes its click), and
the clicked item is ranked among all items not in that history. Baselines in
the same run: catalog popularity and random order (expected MRR H_n / n).
The pure parts (`replay_cases`, `reciprocal_ranks`) take plain values.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Case:
    history: list[int]  # row indexes of the recently viewed items, oldest first
    target: int  # row index of the clicked item


def replay_cases(events: Iterable[dict[str, Any]], index: dict[str, int], history: int = 3) -> list[Case]:
    recent: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=history + 1))
    cases: list[Case] = []
    for e in events:
        row = index.get(e["item_id"])
        if row is None:
            continue
        seen = recent[e["user_id"]]
        if e["behavior"] == "click":
            past = [r for r in seen if r != row][-history:]
            if past:
                cases.append(Case(past, row))
        elif e["behavior"] == "view":
            if row in seen:
                seen.remove(row)
            seen.append(row)
    return cases


def reciprocal_ranks(scores: npt.NDArray[np.float32], cases: list[Case]) -> npt.NDArray[np.float64]:
    """1/rank of each case's target under `scores` (one row per case), history items excluded."""
    out = np.empty(len(cases), dtype=np.float64)
    for n, case in enumerate(cases):
        row = scores[n].astype(np.float64, copy=True)
        row[case.history] = -np.inf
        out[n] = 1.0 / (1 + int((row > row[case.target]).sum()))
    return out


def intent_vectors(matrix: npt.NDArray[np.float32], cases: list[Case]) -> npt.NDArray[np.float32]:
    intents = np.stack([matrix[c.history].mean(axis=0) for c in cases]) if cases else matrix[:0]
    return np.asarray(intents / np.maximum(np.linalg.norm(intents, axis=1, keepdims=True), 1e-12), np.float32)


def alignment_report(
    matrix: npt.NDArray[np.float32],
    popularity: npt.NDArray[np.float64],
    cases: list[Case],
    blend: float = 0.2,
) -> dict[str, Any]:
    """MRR for cosine, popularity, cosine + blend * log popularity, and random order."""
    n_items = matrix.shape[0]
    intents = intent_vectors(matrix, cases)
    cosine = intents @ matrix.T
    log_pop = np.log(np.maximum(popularity, 1e-9) / popularity.max()).astype(np.float32)
    pop_scores = np.broadcast_to(log_pop, cosine.shape)
    rr_cos = reciprocal_ranks(cosine, cases)
    rr_pop = reciprocal_ranks(pop_scores, cases)
    rr_blend = reciprocal_ranks(cosine + blend * log_pop, cases)
    target_cos = np.array([cosine[n, c.target] for n, c in enumerate(cases)])
    candidates = n_items - np.array([len(c.history) for c in cases])
    random_mrr = float(np.mean([np.sum(1.0 / np.arange(1, k + 1)) / k for k in candidates])) if cases else 0.0
    return {
        "cases": len(cases),
        "items": n_items,
        "mrr_intent_cosine": round(float(rr_cos.mean()), 4),
        "mrr_popularity": round(float(rr_pop.mean()), 4),
        "mrr_cosine_plus_popularity": round(float(rr_blend.mean()), 4),
        "blend_weight": blend,
        "mrr_random": round(random_mrr, 4),
        "mean_cosine_intent_to_clicked": round(float(target_cos.mean()), 4),
        "mean_cosine_intent_to_all": round(float(cosine.mean()), 4),
    }
