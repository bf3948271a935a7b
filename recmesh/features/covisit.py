"""Item-to-item co-visitation learnt from the event stream: the rules.

Two items are co-visited when one user views (or clicks) both within
COVISIT_WINDOW_MS. For every viewing event the ingest consumer pairs the item
with the user's previous distinct viewed items in that window (at most
COVISIT_PREVIOUS of them) and adds 1 to the pair's count in both directions.

Counting is idempotent under redelivery: an event is counted only when its
mark was new. On a single Redis the mark is the event's ZADD into the user's
viewed set, in the same script call as the counts
(services/feature/writer.py). On a Redis Cluster it is a ZADD into the user's
`covisit_marks` set, which lives in the user's slot while the counts live in
each item's slot, so the two writes are separate round trips; a crash between
them loses that event's pairs rather than counting them twice.

Counts per item are bounded: trimmed to the COVISIT_MAX_PER_ITEM strongest
neighbours at most once a minute per key, and expire COVISIT_TTL_S after the
item's last co-visit. These functions are pure; the Redis I/O is in
services/feature/writer.py and services/feature/recall_store.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

COVISIT_WINDOW_MS = 30 * 60 * 1000
COVISIT_PREVIOUS = 5
# Viewed events read to find COVISIT_PREVIOUS distinct items.
COVISIT_SCAN = 10
COVISIT_MAX_PER_ITEM = 200
COVISIT_TTL_S = 24 * 60 * 60


# The user feature whose items seed co-visitation recall (the ranker's covisit
# source, and GetFeatures when asked for `related`).
SEED_FEATURE = "last_viewed_3"


def seeds_of(value: object) -> list[str]:
    """The seed item ids in a value of SEED_FEATURE (anything else: none)."""
    return [str(s) for s in value] if isinstance(value, list) else []


def previous_items(item_id: str, viewed_members: Iterable[bytes | str]) -> list[str]:
    """Distinct items (newest first, from `event_id|item_id` members) other than
    `item_id`, at most COVISIT_PREVIOUS."""
    out: list[str] = []
    for raw in viewed_members:
        member = raw.decode() if isinstance(raw, bytes) else raw
        other = member.rsplit("|", 1)[-1]
        if other != item_id and other not in out:
            out.append(other)
            if len(out) == COVISIT_PREVIOUS:
                break
    return out


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
