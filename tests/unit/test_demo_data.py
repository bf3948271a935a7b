"""The shipped demo CSVs are exactly what the seeded generator writes."""

from __future__ import annotations

from pathlib import Path

from recmesh.demo.generate import generate_events, make_catalog, offline_rows
from recmesh.features.offline import read_entities, write_csv
from recmesh.up import DEMO_DATA_DIR


def test_shipped_csv_matches_generator(tmp_path: Path) -> None:
    users, items = offline_rows(make_catalog())
    for entity, rows in (("user", users), ("item", items)):
        fresh = write_csv(tmp_path, entity, rows)
        assert fresh.read_text() == (DEMO_DATA_DIR / fresh.name).read_text()


def test_offline_rows_are_typed_by_the_registry() -> None:
    users = dict(read_entities(DEMO_DATA_DIR, "user"))
    items = dict(read_entities(DEMO_DATA_DIR, "item"))
    assert len(users) == 2000 and len(items) == 3000
    assert isinstance(users["u0"]["interest_tags"], list)
    assert isinstance(items["i0"]["length"], int) and isinstance(items["i0"]["popularity"], float)


def test_events_are_sorted_unique_and_seeded() -> None:
    cat = make_catalog()
    a = list(generate_events(cat, 0, 3_600_000, 200, seed=5))
    assert a == list(generate_events(cat, 0, 3_600_000, 200, seed=5))
    assert [e["event_time"] for e in a] == sorted(e["event_time"] for e in a)
    assert len({e["event_id"] for e in a}) == len(a)
    assert {e["behavior"] for e in a} >= {"view", "click"}
