"""Item-to-item co-visitation learnt from the event stream: the rules.

Two items are co-visited when one user has events of the repository's
co-visitation behaviours (`[recall] covisit`, by default those of the
recent-items feature) on both within its window. For every such event the
ingest write pairs the item with the user's previous distinct items in that
window (at most `previous` of them) and adds 1 to the pair's count in both
directions. Earlier items are read from the user's co-visit list, a capped
list of their newest distinct items with each one's latest time (a stream
read 'distinct', recmesh/features/tiles.py): its size does not grow with the
user's events.

Counting is idempotent under redelivery: an event is counted only when its id
was new for the user (services/feature/writer.py). Counts per item are
bounded: trimmed to the COVISIT_MAX_PER_ITEM strongest neighbours at most once
a minute per key, and expire COVISIT_TTL_S after the item's last co-visit.
These functions are pure; the Redis I/O is in services/feature/writer.py and
services/feature/recall_store.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

COVISIT_MAX_PER_ITEM = 200
COVISIT_TTL_S = 24 * 60 * 60


def seeds_of(value: object) -> list[str]:
    """The seed item ids in a recent-items value (anything else: none)."""
    return [str(s) for s in value] if isinstance(value, list) else []


def batch_pairs(
    visits: Sequence[tuple[str, str, int]],
    held: Mapping[str, Mapping[str, int]],
    window_ms: int,
    previous: int,
) -> list[tuple[str, str]]:
    """The co-visit pairs of a batch's new events of the co-visit behaviours, (user, item,
    time) in write order, as the write script counts them: each item with the user's
    `previous` newest distinct items whose latest time is in (time - window, time),
    read from the user's co-visit list (`held`: item -> latest time, as it was before
    the batch) updated event by event. Ties in time go by item id, descending (a Redis
    sorted set read newest first)."""
    lists = {user: dict(items) for user, items in held.items()}
    pairs: list[tuple[str, str]] = []
    for user, item, te in visits:
        latest = lists.setdefault(user, {})
        earlier = sorted(((t, o) for o, t in latest.items() if te - window_ms < t < te), reverse=True)
        pairs.extend(
            (item, o) for _, o in [(t, o) for t, o in earlier[: previous + 1] if o != item][:previous]
        )
        if latest.get(item, -1) < te:
            latest[item] = te
    return pairs


def pair_increments(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """item -> {neighbour: +count}, both directions of every pair."""
    out: dict[str, dict[str, int]] = {}
    for a, b in pairs:
        if a == b:
            continue
        out.setdefault(a, {}).setdefault(b, 0)
        out[a][b] += 1
        out.setdefault(b, {}).setdefault(a, 0)
        out[b][a] += 1
    return out


def merge_neighbours(
    neighbours: Sequence[Sequence[tuple[str, float]]], exclude: Iterable[str], limit: int
) -> list[tuple[str, float]]:
    """Sum co-visitation counts over several seeds, drop `exclude`, best first
    (ties by item id, so the answer is deterministic)."""
    skip = set(exclude)
    total: dict[str, float] = {}
    for row in neighbours:
        for item, count in row:
            if item not in skip:
                total[item] = total.get(item, 0.0) + float(count)
    return sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
