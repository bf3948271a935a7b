"""The shipped demo CSVs are exactly what the seeded generator writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recmesh.events import validate_event
from recmesh.features.repository import DEMO_REPOSITORY, Entity, FeatureSet
from recmesh.features.tabular import read_entities, write_csv
from recmesh.tools.demo.generate import generate_events, make_catalog, offline_rows

DEMO_DATA_DIR = DEMO_REPOSITORY.parent


def test_shipped_csv_matches_generator(demo_feature_set: FeatureSet, tmp_path: Path) -> None:
    users, items = offline_rows(make_catalog())
    tables: list[tuple[Entity, list[tuple[str, dict[str, Any]]]]] = [("user", users), ("item", items)]
    for entity, rows in tables:
        fresh = write_csv(demo_feature_set, tmp_path, entity, rows)
        assert fresh.read_text() == (DEMO_DATA_DIR / fresh.name).read_text()


def test_offline_rows_are_typed_by_the_repository(demo_feature_set: FeatureSet) -> None:
    assert demo_feature_set.entity_source("user") == DEMO_DATA_DIR / "users.csv"
    users = dict(read_entities(demo_feature_set, "user"))
    items = dict(read_entities(demo_feature_set, "item"))
    assert len(users) == 2000 and len(items) == 3000
    assert isinstance(users["u0"]["interest_tags"], list)
    assert isinstance(items["i0"]["length"], int) and isinstance(items["i0"]["popularity"], float)
    assert isinstance(items["i0"]["category"], str)
    # The rows read back are the generator's rows.
    want_users, want_items = offline_rows(make_catalog())
    assert users == dict(want_users) and items == dict(want_items)


def test_events_are_sorted_unique_and_seeded(demo_feature_set: FeatureSet) -> None:
    cat = make_catalog()
    a = list(generate_events(cat, 0, 3_600_000, 200, seed=5))
    assert a == list(generate_events(cat, 0, 3_600_000, 200, seed=5))
    assert [e["event_time"] for e in a] == sorted(e["event_time"] for e in a)
    assert len({e["event_id"] for e in a}) == len(a)
    assert {e["behavior"] for e in a} >= {"view", "click"}
    # Every behaviour the generator writes is in the demo repository's vocabulary.
    assert {e["behavior"] for e in a} <= set(demo_feature_set.behaviors)
    later = list(generate_events(cat, 1_767_225_600_000, 3_600_000, 20, seed=5))
    assert all(validate_event(e, demo_feature_set.event_schema).behavior == e["behavior"] for e in later)
