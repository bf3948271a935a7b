"""FeatureStore's decoding of the look-up's item stream reads (pure logic): the
single-Redis script's flat reply and a cluster's per-command replies give the
same windows, and repeated item ids get their item's answer back. The look-up
against a real redis-server is tests/integration/test_feature_store.py."""

from __future__ import annotations

from typing import Any

import redis.asyncio as redis

from recmesh.features.repository import FeatureSet
from services.feature.store import FeatureStore, StreamRead

AS_OF = 1_000_000
ASKED = ["i1", "i2", "i1"]  # i1 twice, as a caller may ask
UNIQUE = ["i1", "i2"]


def _store(feature_set: FeatureSet) -> FeatureStore:
    return FeatureStore(redis.Redis(port=1), feature_set)  # never connects: decoding only


def test_the_script_asks_for_every_items_count_windows(demo_feature_set: FeatureSet) -> None:
    store = _store(demo_feature_set)
    # The Lua script's ARGV[2]: 'C|<stream>|<lo>' per count stream, lo = as-of less the window.
    assert store._plan.item_spec(AS_OF) == "C|click|400000;C|view|400000"


def test_script_and_cluster_replies_decode_to_the_same_windows(demo_feature_set: FeatureSet) -> None:
    # Per item, per stream (click, view): the window's count, then its newest event time (-1 none).
    flat: list[Any] = [2, 900_000, 0, -1, 1, 950_000, 3, 990_000]
    script = _store(demo_feature_set)._item_windows(UNIQUE, ASKED, [flat], AS_OF)
    cluster_store = _store(demo_feature_set)
    cluster_store._cluster = True  # plain commands: a ZCOUNT, then the newest (member, score) if any
    per_command: list[Any] = [
        2,
        [(b"m1", 900_000.0)],
        0,
        [],
        1,
        [(b"m2", 950_000.0)],
        3,
        [(b"m3", 990_000.0)],
    ]
    cluster = cluster_store._item_windows(UNIQUE, ASKED, per_command, AS_OF)
    expected = [
        StreamRead([[2, 1, 2]], [900_000, 950_000, 900_000]),  # click
        StreamRead([[0, 3, 0]], [-1, 990_000, -1]),  # view
    ]
    assert script == expected
    assert cluster == expected
    assert per_command == [], "the reads are consumed from the front of the replies"


def test_no_items_reads_nothing(demo_feature_set: FeatureSet) -> None:
    windows = _store(demo_feature_set)._item_windows([], [], [], AS_OF)
    assert windows == [StreamRead([[]]), StreamRead([[]])]
