"""A team's own records -> canonical events, mapped by the repository."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from recmesh.errors import InvalidArgument
from recmesh.features.importer import BadRecord, EventMapper, good_events, scan
from recmesh.features.repository import FeatureSet, parse_feature_set

REPO = """
[repository]
name = "shop"

[events]
event_id = "id"
user_id = "visitorid"
item_id = "itemid"
behavior = "event"
event_time = "timestamp"
time_unit = "s"
behaviors = ["view", "add_to_cart", "purchase"]
values = { price = "amount" }

[events.aliases]
addtocart = "add_to_cart"
transaction = "purchase"
"""


def feature_set(text: str = REPO) -> FeatureSet:
    return parse_feature_set(text, Path("shop/recmesh.toml"))


def write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_fields_units_and_aliases_are_mapped() -> None:
    mapper = EventMapper(feature_set())
    (event,) = mapper.map(
        {"id": "r1", "visitorid": "257597", "itemid": "355908", "event": "addtocart",
         "timestamp": "1433221332.117", "amount": "9.5"}
    )  # fmt: skip
    assert (event.event_id, event.user_id, event.item_id, event.behavior) == (
        "r1",
        "257597",
        "355908",
        "add_to_cart",
    )
    assert event.event_time == 1_433_221_332_117 and event.values == {"price": 9.5}


@pytest.mark.parametrize(
    ("unit", "raw", "ms"),
    [
        ("ms", "1433221332117", 1_433_221_332_117),
        ("us", "1433221332117000", 1_433_221_332_117),
        ("ns", "1433221332117000000", 1_433_221_332_117),
        ("iso8601", "2015-06-02T05:02:12.117Z", 1_433_221_332_117),
        ("iso8601", "2015-06-02T07:02:12.117+02:00", 1_433_221_332_117),
    ],
)
def test_time_units(unit: str, raw: str, ms: int) -> None:
    mapper = EventMapper(feature_set(REPO.replace('time_unit = "s"', f'time_unit = "{unit}"')))
    (event,) = mapper.map({"id": "r", "visitorid": "u", "itemid": "i", "event": "view", "timestamp": raw})
    assert event.event_time == ms


def test_an_iso_time_without_a_zone_is_refused() -> None:
    mapper = EventMapper(feature_set(REPO.replace('time_unit = "s"', 'time_unit = "iso8601"')))
    with pytest.raises(ValueError, match="no time zone"):
        mapper.map(
            {"id": "r", "visitorid": "u", "itemid": "i", "event": "view", "timestamp": "2015-06-02T05:02:12"}
        )


def test_without_ids_the_same_record_gets_the_same_id_and_derived_events() -> None:
    text = REPO.replace('event_id = "id"', 'event_id = ""').replace(
        'values = { price = "amount" }',
        'values = { price = "amount" }\n'
        'derive = [{ behavior = "purchase", when = { field = "price", above = 100 } }]',
    )
    mapper = EventMapper(feature_set(text))
    record = {"visitorid": "u1", "itemid": "i1", "event": "view", "timestamp": "1433221332", "amount": "150"}
    first, derived = mapper.map(record)
    again, _ = mapper.map(dict(record))
    assert first.event_id == again.event_id and first.event_id.startswith("imp-")
    assert (derived.event_id, derived.behavior) == (f"{first.event_id}:purchase", "purchase")
    assert derived.event_time == first.event_time and derived.values == {"price": 150.0}
    other = mapper.map({**record, "amount": "99"})
    assert len(other) == 1 and other[0].event_id != first.event_id, "another record, another id"


def test_bad_records_are_counted_with_their_lines_and_nothing_else_is_lost(tmp_path: Path) -> None:
    good = {
        "id": "r1",
        "visitorid": "u1",
        "itemid": "i1",
        "event": "view",
        "timestamp": "1433221332",
        "amount": "",
    }
    rows = [
        good,
        {**good, "id": "r2", "event": "like"},  # unknown behaviour
        {**good, "id": "r3", "timestamp": "soon"},  # not a time
        {**good, "id": "r4", "visitorid": ""},  # no user
        {**good, "id": "r5", "amount": "cheap"},  # not a number
        {**good, "id": "r6", "event": "transaction"},
    ]
    path = write(tmp_path / "events.csv", rows)
    mapper = EventMapper(feature_set())
    found = scan(mapper, path)
    assert (found.records, found.events, found.bad) == (6, 2, 4)
    assert [b.line for b in found.first_bad] == [3, 4, 5, 6]
    reasons = " | ".join(b.reason for b in found.first_bad)
    assert "unknown behaviour 'like'" in reasons and "'visitorid'" in reasons and "'amount'" in reasons
    assert [e.event_id for e in good_events(mapper, path)] == ["r1", "r6"]
    assert "line 3:" in found.describe_bad(path)


def test_json_lines_and_a_wrong_header_are_read_and_named(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        json.dumps({"id": "j1", "visitorid": 7, "itemid": 9, "event": "view", "timestamp": 1433221332}) + "\n"
    )
    (event,) = [
        e
        for _, got in EventMapper(feature_set()).records(path)
        if not isinstance(got, BadRecord)
        for e in got
    ]
    assert (event.user_id, event.item_id) == ("7", "9")
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"id": 1}\n[1, 2]\n')
    with pytest.raises(InvalidArgument, match=r"broken.jsonl:2: a line must hold a JSON object"):
        list(EventMapper(feature_set()).records(bad))
