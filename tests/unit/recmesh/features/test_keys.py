"""The Redis key layout: every key of one entity in one Cluster slot, each part
spelled once, and the parts the Lua scripts take building the same keys."""

from __future__ import annotations

import re

from recmesh.features import keys
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set

FEATURE_SET = load_feature_set(DEMO_REPOSITORY)


def _tag(key: str) -> str:
    """The hash tag Redis Cluster slots a key by (the first {...})."""
    found = re.search(r"\{([^}]*)\}", key)
    assert found is not None, key
    return found.group(1)


def test_an_entitys_keys_share_one_hash_tag() -> None:
    user = [keys.stream("user", "u1", "click"), keys.user_ids("u1"), keys.user_history("u1"),
            keys.user_profile("u1"), keys.newest("user", "u1"), keys.entity_tag("user", "u1")]  # fmt: skip
    item = [keys.stream("item", "i1", "view"), keys.item_static("i1"), keys.item_covisits("i1"),
            keys.newest("item", "i1"), keys.profile("item", "i1")]  # fmt: skip
    assert {_tag(k) for k in user} == {"u:u1"} and {_tag(k) for k in item} == {"i:i1"}
    catalog = [keys.POPULARITY, keys.STATICS_VERSION, keys.REPOSITORY, keys.category_popularity("shoes")]
    assert {_tag(k) for k in catalog} == {"catalog"} and _tag(keys.applied("user_behavior")) == "ingest"


def test_the_scripts_parts_build_the_same_keys() -> None:
    user_prefix, item_prefix, ids, covisits = keys.WRITE_SCRIPT_PARTS
    assert user_prefix + "u1" + ids == keys.user_ids("u1")
    assert item_prefix + "i1" + covisits == keys.item_covisits("i1")
    assert user_prefix + "u1" + keys.stream_suffix("click") == keys.stream("user", "u1", "click")
    prefix, stream_part, newest = keys.ITEM_SCRIPT_PARTS
    assert prefix + "i1" + stream_part + "view" == keys.stream("item", "i1", "view")
    assert prefix + "i1" + newest == keys.newest("item", "i1")
    assert keys.is_user_ids(keys.user_ids("u1")) and not keys.is_user_ids(keys.user_history("u1"))


def test_acl_patterns_match_the_keys_they_grant() -> None:
    def matches(pattern: str, key: str) -> bool:
        return re.fullmatch(re.escape(pattern[1:]).replace(r"\*", ".*"), key) is not None

    assert matches(keys.acl_pattern("profile"), keys.user_profile("u 1"))
    assert matches(keys.acl_pattern("static"), keys.item_static("i1"))
    assert matches(keys.acl_pattern("catalog"), keys.POPULARITY)
    assert not matches(keys.acl_pattern("profile"), keys.user_ids("u1"))


def test_state_families_name_every_stream_and_recognise_their_keys() -> None:
    families = keys.state_families(FEATURE_SET)
    for s in FEATURE_SET.streams:
        assert keys.state_family(keys.stream(s.entity, "x", s.id), families) == f"{s.entity}:s:{s.id}"
    assert keys.state_family(keys.user_ids("u1"), families) == "user:ids"
    assert keys.state_family(keys.item_static("i1"), families) is None


def test_applied_marks_parse_from_bytes_or_text() -> None:
    assert keys.parse_applied({b"0": b"12:1000", "1": "3:-1"}) == {0: (12, 1000), 1: (3, -1)}
