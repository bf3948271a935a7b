"""Pure ranking rules, tested with plain values."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def drop_seen(candidates: Sequence[tuple[str, float]], seen: Collection[str]) -> list[tuple[str, float]]:
    """Remove items the user just viewed; keep order."""
    return [c for c in candidates if c[0] not in seen]


def top_n(item_ids: Sequence[str], scores: Sequence[float], n: int) -> list[tuple[str, float]]:
    """The n best (item, score) pairs, best first; ties keep candidate order."""
    ranked = sorted(range(len(item_ids)), key=lambda i: (-scores[i], i))
    return [(item_ids[i], float(scores[i])) for i in ranked[:n]]
