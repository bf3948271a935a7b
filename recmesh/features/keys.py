"""Redis key layout: the one definition. Every key carries a hash tag, so all
state of one user (or one item) lands in one Redis Cluster slot and multi-key
operations on it stay valid in a cluster.

Real-time state is one sorted set per entity and stream (repository.Stream):
`{u:<id>}:s:<stream>` / `{i:<id>}:s:<stream>`, scored by event time. Each part
of a key is spelled here once; the Lua scripts that build keys from ids
themselves (the item window script in services/feature/store.py, the ingest
write in services/feature/writer.py) receive the parts they need as arguments
(`lua_parts`), and the Redis ACLs their patterns (`acl_pattern`).
tests/unit/test_layers.py refuses a key literal anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping

from recmesh.features.repository import Entity, FeatureSet

PREFIX: dict[str, str] = {"user": "{u:", "item": "{i:"}
TAG_END = "}"
CATALOG_TAG = "{catalog}"
INGEST_TAG = "{ingest}"
EVAL_TAG = "{eval}"
# What follows an entity's hash tag, per kind of key.
STREAM = f"{TAG_END}:s:"
NEWEST = f"{TAG_END}:newest"
IDS = f"{TAG_END}:ids"
HISTORY = f"{TAG_END}:history"
COVISITS = f"{TAG_END}:covisits"
PROFILE = f"{TAG_END}:profile"
STATIC = f"{TAG_END}:static"
IMPRESSION = f"{TAG_END}:imp:"
IMPRESSIONS = f"{TAG_END}:imps"
POSITIVES = f"{TAG_END}:positives"


def entity_tag(entity: Entity | str, entity_id: str) -> str:
    return f"{PREFIX[entity]}{entity_id}{TAG_END}"


def stream_suffix(stream_id: str) -> str:
    """What follows an entity's id in its stream key (the scripts append it)."""
    return f"{STREAM}{stream_id}"


def stream(entity: Entity | str, entity_id: str, stream_id: str) -> str:
    """ZSET of the entity's events in one stream: member per repository.Stream, score event time."""
    return f"{PREFIX[entity]}{entity_id}{stream_suffix(stream_id)}"


def newest(entity: Entity | str, entity_id: str) -> str:
    """HASH stream -> the entity's newest event time in each of its 'count'
    streams, kept by the ingest write as an index for
    look-ups (which check it and fall back to the sorted set, the truth, when
    it is missing or past as-of)."""
    return f"{PREFIX[entity]}{entity_id}{NEWEST}"


def user_ids(user_id: str) -> str:
    """ZSET of the user's event ids, score event time: event identity (a second
    event with a known id is dropped) and the co-visitation mark."""
    return f"{PREFIX['user']}{user_id}{IDS}"


def is_user_ids(key: str) -> bool:
    return key.startswith(PREFIX["user"]) and key.endswith(IDS)


def user_history(user_id: str) -> str:
    """ZSET of the user's newest distinct items (learnt retrieval's seeds) -> the
    time of the user's latest event on it; capped at recall.learnt.history."""
    return f"{PREFIX['user']}{user_id}{HISTORY}"


def user_profile(user_id: str) -> str:
    """HASH of offline user features (JSON-encoded values)."""
    return f"{PREFIX['user']}{user_id}{PROFILE}"


def item_static(item_id: str) -> str:
    """HASH of offline item features (JSON-encoded values)."""
    return f"{PREFIX['item']}{item_id}{STATIC}"


def profile(entity: Entity | str, entity_id: str) -> str:
    return user_profile(entity_id) if entity == "user" else item_static(entity_id)


STATICS_VERSION = f"{CATALOG_TAG}:statics_version"
"""STRING set to a new unique value by every offline load after its writes: a
feature service that reads the same value again knows no offline feature
changed meanwhile."""

POPULARITY = f"{CATALOG_TAG}:popularity"
"""ZSET item_id -> popularity (the declared feature, or counted live from events), the candidate
source for recall."""

ITEMS_CHANGED = "recmesh:items_changed"
"""Pub/sub channel (not a key): after each batch the ingest publishes the ids of the
items it wrote, newline-separated; feature services drop those items' held
real-time reads (services/feature/item_cache.py)."""

REPOSITORY = f"{CATALOG_TAG}:repository"
"""HASH: the name and feature-set version of the repository whose catalog was last loaded."""


def item_covisits(item_id: str) -> str:
    """ZSET of items co-visited with this one -> count (see recmesh.features.covisit)."""
    return f"{PREFIX['item']}{item_id}{COVISITS}"


def category_popularity(category: str) -> str:
    """ZSET item_id -> popularity within one category (category-affinity recall)."""
    return f"{POPULARITY}:{category}"


# The parts the Lua scripts build keys from, in the order they take them.
WRITE_SCRIPT_PARTS = (PREFIX["user"], PREFIX["item"], IDS, COVISITS)
ITEM_SCRIPT_PARTS = (PREFIX["item"], STREAM, NEWEST)


def acl_pattern(kind: str) -> str:
    """A Redis ACL key pattern (`~...`): 'profile', 'static', 'catalog' (the CLI's keys),
    'eval' (online evaluation's figures) or 'attribution' (every key attribution writes)."""
    patterns = {"profile": user_profile("*"), "static": item_static("*"), "catalog": f"{CATALOG_TAG}:*",
                "eval": f"{EVAL_TAG}:*"}  # fmt: skip
    if kind == "attribution":
        return " ".join(
            f"~{k}"
            for k in (impression("*", "*"), user_impressions("*"), user_positives("*"), f"{EVAL_TAG}:*")
        )
    return f"~{patterns[kind]}"


def applied(topic: str) -> str:
    """HASH partition -> "<next offset>:<newest event time applied>" of the ingest on
    `topic`: written after each batch's state write and before its offsets are
    committed, never moved back (a redelivered batch leaves it as it is). A served
    row carries it (read before and after its look-up), so `features compare` can
    tell a store that was behind the stream from a wrong value."""
    return f"{INGEST_TAG}:applied:{topic}"


def parse_applied(raw: Mapping[bytes | str, bytes | str]) -> dict[int, tuple[int, int]]:
    """`applied`'s hash as {partition: (next offset, newest event time applied, -1: none)}."""
    out: dict[int, tuple[int, int]] = {}
    for partition, value in raw.items():
        text = value.decode() if isinstance(value, bytes) else value
        offset, _, newest = text.partition(":")
        out[int(partition)] = (int(offset), int(newest or -1))
    return out


# Real-time state families for the state-drift sampler (services/feature/drift.py),
# which sizes each in entries: every stream (a sorted set's members, events or
# distinct ids: ZCARD; a tiles hash's fields: HLEN), the event ids, and
# co-visitation counts (recall, not features), which grow with traffic the same way.
def state_families(feature_set: FeatureSet) -> dict[str, tuple[str, str, str]]:
    """family -> (key prefix, key suffix, the command that sizes a key) of every family."""
    out = {
        f"{s.entity}:s:{s.id}": (
            PREFIX[s.entity],
            stream_suffix(s.id),
            "HLEN" if s.read == "tiles" else "ZCARD",
        )
        for s in feature_set.streams
    }
    out["user:ids"] = (PREFIX["user"], IDS, "ZCARD")
    out["user:history"] = (PREFIX["user"], HISTORY, "ZCARD")
    out["item:covisits"] = (PREFIX["item"], COVISITS, "ZCARD")
    return out


def state_family(key: str, families: dict[str, tuple[str, str, str]]) -> str | None:
    """The real-time state family a key belongs to, or None (offline or other keys)."""
    for family, (prefix, suffix, _) in families.items():
        if key.startswith(prefix) and key.endswith(suffix):
            return family
    return None


# Online evaluation (services/attribution, recmesh/evaluation): the answers a user
# was shown and the positive events that may credit them, under the user's tag;
# what is pending, the clock and the figures under {eval}.
def impression_prefix(user_id: str) -> str:
    """What precedes a request id in the user's impression keys (the read script appends it)."""
    return f"{PREFIX['user']}{user_id}{IMPRESSION}"


def impression(user_id: str, request_id: str) -> str:
    """STRING: one answer as attribution keeps it, until its figures are final."""
    return f"{impression_prefix(user_id)}{request_id}"


def user_impressions(user_id: str) -> str:
    """ZSET request id -> as-of time of the user's answers not yet final."""
    return f"{PREFIX['user']}{user_id}{IMPRESSIONS}"


def user_positives(user_id: str) -> str:
    """ZSET "<item>|<event id>|<request id>" -> event time of the user's positive events."""
    return f"{PREFIX['user']}{user_id}{POSITIVES}"


EVAL_PENDING = f"{EVAL_TAG}:pending"
"""ZSET "<user>|<request id>" -> the time its figures are due (as-of + window)."""

EVAL_CLOCK = f"{EVAL_TAG}:clock"
"""HASH "<topic>:<partition>" -> "<newest time read>:<wall ms when read>": attribution's clock."""

EVAL_BUCKETS = f"{EVAL_TAG}:buckets"
"""ZSET bucket -> bucket (minute of as-of time) of every bucket holding sums."""

EVAL_TOTAL = f"{EVAL_TAG}:sums:all"
"""HASH of the sums of every answer finalised (recmesh/evaluation/sums.py fields)."""


def eval_sums(bucket: int) -> str:
    """HASH of the sums of the answers whose as-of time falls in the minute `bucket`."""
    return f"{EVAL_TAG}:sums:{bucket}"


def eval_done(bucket: int) -> str:
    """SET of the request ids of the minute `bucket` already added (a second time adds nothing)."""
    return f"{EVAL_TAG}:done:{bucket}"
