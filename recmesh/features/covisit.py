"""Item-to-item co-visitation learnt from the event stream: the rules.

Two items are co-visited when one user has events of the repository's
co-visitation behaviours (`[recall] covisit`, by default those of the
recent-items feature) on both within its window. For every such event the
ingest write pairs the item with the user's previous distinct items in that
window (at most `previous` of them, among the newest `scan` events) and adds
1 to the pair's count in both directions.

Counting is idempotent under redelivery: an event is counted only when its id
was new for the user (services/feature/writer.py). Counts per item are
bounded: trimmed to the COVISIT_MAX_PER_ITEM strongest neighbours at most once
a minute per key, and expire COVISIT_TTL_S after the item's last co-visit.
These functions are pure; the Redis I/O is in services/feature/writer.py and
services/feature/recall_store.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from recmesh.features.repository import FIELD_SEP

COVISIT_MAX_PER_ITEM = 200
COVISIT_TTL_S = 24 * 60 * 60


def seeds_of(value: object) -> list[str]:
    """The seed item ids in a recent-items value (anything else: none)."""
    return [str(s) for s in value] if isinstance(value, list) else []


def previous_items(item_id: str, members: Iterable[bytes | str], previous: int) -> list[str]:
    """Distinct items (newest first) other than `item_id`, at most `previous`,
    from stream members 'event_id<FIELD_SEP>item_id...'."""
    out: list[str] = []
    for raw in members:
        member = raw.decode() if isinstance(raw, bytes) else raw
        parts = member.split(FIELD_SEP)
        other = parts[1] if len(parts) > 1 else member
        if other != item_id and other not in out:
            out.append(other)
            if len(out) == previous:
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
