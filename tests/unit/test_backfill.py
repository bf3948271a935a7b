"""Offline replay: point-in-time rows, external sort, no leakage."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from recmesh.demo.generate import generate_events, make_catalog
from recmesh.features.backfill import backfill, training_examples
from recmesh.features.eventlog import write_events

MIN = 60_000


def test_features_never_see_the_future() -> None:
    t0 = 1_000 * MIN
    events = [
        {"event_id": "v1", "user_id": "u", "item_id": "i", "behavior": "view", "event_time": t0},
        {"event_id": "c1", "user_id": "u", "item_id": "i", "behavior": "click", "event_time": t0 + 2000},
        {"event_id": "v2", "user_id": "u", "item_id": "i", "behavior": "view", "event_time": t0 + 60_000},
    ]
    items = {"i": {"category": "news"}}
    first, second = training_examples(events, {}, items)
    assert first.label == 1 and first.as_of_ms == t0 - 1
    assert first.user["clicks_5m"] == 0 and first.item["views_10m"] == 0, "its own view is not a feature"
    assert second.label == 0
    assert second.user["clicks_5m"] == 1 and second.user["last_viewed_3"] == ["i"]
    assert second.item["views_10m"] == 1 and second.item["clicks_10m"] == 1


def test_backfill_of_a_shuffled_log_equals_the_in_memory_replay(tmp_path: Path) -> None:
    catalog = make_catalog()
    events = list(generate_events(catalog, 1_767_225_600_000, 30 * MIN, 150, seed=9))
    shuffled = events[:]
    random.Random(4).shuffle(shuffled)
    log = tmp_path / "events.jsonl"
    write_events(log, shuffled)
    users = {u["user_id"]: u for u in catalog.users}
    items = {i["item_id"]: i for i in catalog.items}
    out = tmp_path / "rows.jsonl"
    figures = backfill(log, out, users, items, run_size=97)  # many spilled runs
    rows = [orjson.loads(line) for line in out.read_text().splitlines()]
    want = list(training_examples(events, users, items))
    assert figures["rows"] == len(rows) == len(want) > 100
    assert [(r["user_id"], r["item_id"], r["as_of_ms"], r["label"], r["user"], r["item"]) for r in rows] == [
        (w.user_id, w.item_id, w.as_of_ms, w.label, w.user, w.item) for w in want
    ]
