"""Redis key layout. Every key carries a hash tag, so all state of one user
(or one item) lands in one Redis Cluster slot and multi-key operations on it
stay valid in a cluster."""

from __future__ import annotations


def user_events(user_id: str) -> str:
    """ZSET of the user's events: member 'event_id|item_id|behavior|category', score event time."""
    return f"{{u:{user_id}}}:events"


def user_viewed(user_id: str) -> str:
    """ZSET of the user's view/click events: member 'event_id|item_id', score event time."""
    return f"{{u:{user_id}}}:viewed"


def user_profile(user_id: str) -> str:
    """HASH of offline user features (JSON-encoded values)."""
    return f"{{u:{user_id}}}:profile"


# Two scripts build keys from ids themselves: the item window script in
# services/feature/store.py (the item click/view/newest keys below) and the
# ingest write in services/feature/writer.py (user events/viewed, item
# clicks/views/newest/covisits). test_parity and test_writer fail if the
# formats ever diverge.


def item_clicks(item_id: str) -> str:
    """ZSET of click event ids on the item, score event time."""
    return f"{{i:{item_id}}}:clicks"


def item_views(item_id: str) -> str:
    """ZSET of view event ids on the item, score event time."""
    return f"{{i:{item_id}}}:views"


def item_newest(item_id: str) -> str:
    """STRING: the newest event time among the item's clicks and views, kept by
    the one-script ingest write as an index for look-ups (which check it and
    fall back to the sorted sets, the truth, when it is missing or past as-of)."""
    return f"{{i:{item_id}}}:newest"


def item_static(item_id: str) -> str:
    """HASH of offline item features (JSON-encoded values)."""
    return f"{{i:{item_id}}}:static"


STATICS_VERSION = "{catalog}:statics_version"
"""STRING set to a new unique value by every offline load after its writes: a
feature service that reads the same value again knows no offline feature
changed meanwhile."""

POPULARITY = "{catalog}:popularity"
"""ZSET item_id -> offline popularity, the candidate source for recall."""


def item_covisits(item_id: str) -> str:
    """ZSET of items co-visited with this one -> count (see recmesh.features.covisit)."""
    return f"{{i:{item_id}}}:covisits"


def user_covisit_marks(user_id: str) -> str:
    """ZSET of the user's event ids already counted for co-visitation, score event time."""
    return f"{{u:{user_id}}}:covisit_marks"


def category_popularity(category: str) -> str:
    """ZSET item_id -> offline popularity within one category (category-affinity recall)."""
    return f"{{catalog}}:popularity:{category}"


# Real-time state, by feature family: (entity prefix, key suffix) of its keys.
# The state-drift sampler (services/feature/drift.py) sizes each family in
# events (ZCARD). item_newest is not one: one small string per item, bounded
# by the catalogue, that the ingest write expires with the item's clicks and views.
STATE_FAMILIES: dict[str, tuple[str, str]] = {
    "user_events": ("{u:", "}:events"),
    "user_viewed": ("{u:", "}:viewed"),
    "item_clicks": ("{i:", "}:clicks"),
    "item_views": ("{i:", "}:views"),
    # Co-visitation state (recall, not features) grows with traffic the same way.
    "item_covisits": ("{i:", "}:covisits"),
    "user_covisit_marks": ("{u:", "}:covisit_marks"),
}


def state_family(key: str) -> str | None:
    """The real-time feature family a key belongs to, or None (offline or other keys)."""
    for family, (prefix, suffix) in STATE_FAMILIES.items():
        if key.startswith(prefix) and key.endswith(suffix):
            return family
    return None
