from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from recmesh.errors import InvalidArgument
from recmesh.events import Event, EventSchema, conform, parse_event, validate_event
from recmesh.features.repository import FeatureSet, parse_feature_set

GOOD = (
    b'{"event_id": "e1", "user_id": "u1", "item_id": "i1", "behavior": "view", '
    b'"event_time": 1767225600000, "x": 1}'
)

RATED = """
[repository]
name = "rated"

[events]
behaviors = ["view", "click"]
aliases = { play = "view" }
values = ["rating"]
"""


@pytest.fixture(scope="module")
def rated() -> EventSchema:
    return parse_feature_set(RATED, Path("rated.toml")).event_schema


def test_good_event_with_extra_fields(demo_feature_set: FeatureSet) -> None:
    e = parse_event(GOOD, demo_feature_set.event_schema)
    assert (e.user_id, e.behavior, e.event_time) == ("u1", "view", 1767225600000)
    assert e.values == {} and "x" not in e.to_dict()  # undeclared extras are not carried on


def test_aliases_map_onto_the_vocabulary(demo_feature_set: FeatureSet) -> None:
    e = parse_event(GOOD.replace(b'"view"', b'"addtocart"'), demo_feature_set.event_schema)
    assert e.behavior == "add_to_cart"
    assert e.to_dict()["behavior"] == "add_to_cart"


def test_declared_values_travel_with_the_event(rated: EventSchema) -> None:
    e = parse_event(GOOD.replace(b'"x": 1', b'"rating": 4'), rated)
    assert e.values == {"rating": 4.0} and e.to_dict()["rating"] == 4.0
    assert parse_event(GOOD, rated).values == {}  # optional
    with pytest.raises(InvalidArgument, match="rating: must be a finite number"):
        parse_event(GOOD.replace(b'"x": 1', b'"rating": "high"'), rated)
    with pytest.raises(InvalidArgument, match=r"events\[2\]\.rating"):
        validate_event({**Event.model_validate_json(GOOD).to_dict(), "rating": True}, rated, "events[2]")


def test_conform_checks_an_event_parsed_without_a_schema(rated: EventSchema) -> None:
    loose = Event.model_validate_json(GOOD.replace(b'"view"', b'"play"').replace(b'"x": 1', b'"rating": 2'))
    assert loose.behavior == "play" and loose.values == {}  # no schema: taken as it is
    e = conform(loose, rated)
    assert (e.behavior, e.values) == ("view", {"rating": 2.0})
    unknown = Event.model_validate_json(GOOD.replace(b'"view"', b'"like"'))
    with pytest.raises(InvalidArgument, match=r"events\[0\]\.behavior: unknown behaviour 'like'"):
        conform(unknown, rated, "events[0]")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1]", "JSON object"),
        (GOOD.replace(b'"view"', b'"like"'), "behavior"),
        (GOOD.replace(b'"event_time": 1767225600000', b'"event_time": "1767225600000"'), "event_time"),
        (GOOD.replace(b'"event_time": 1767225600000', b'"event_time": 1767225600'), "looks like seconds"),
        (GOOD.replace(b'"user_id": "u1", ', b""), "user_id"),
        (GOOD.replace(b'"u1"', b'"u|1"'), "user_id"),
        (GOOD.replace(b'"event_time": 1767225600000', b'"event_time": 1767225600000.5'), "event_time"),
        # Past the year 9999: was accepted by the gateway, then could not be written (a 500).
        (
            GOOD.replace(b'"event_time": 1767225600000', b'"event_time": 4227021035137881925582623604736'),
            "event_time",
        ),
    ],
)
def test_bad_events_name_the_problem(demo_feature_set: FeatureSet, raw: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_event(raw, demo_feature_set.event_schema)


def test_an_unknown_behaviour_names_the_vocabulary_and_aliases(demo_feature_set: FeatureSet) -> None:
    with pytest.raises(InvalidArgument, match="unknown behaviour 'like'") as err:
        parse_event(GOOD.replace(b'"view"', b'"like"'), demo_feature_set.event_schema)
    assert "view, click, add_to_cart, purchase" in str(err.value) and "addtocart" in str(err.value)


def test_event_time_is_an_integer_as_json_schema_reads_one(demo_feature_set: FeatureSet) -> None:
    # The gateway publishes Event's JSON Schema, where 1767225600000.0 is an integer.
    raw = GOOD.replace(b'"event_time": 1767225600000', b'"event_time": 1767225600000.0')
    assert parse_event(raw, demo_feature_set.event_schema).event_time == 1767225600000


@pytest.mark.parametrize("space", ["\x85", "\ufeff", "\x1c", "\xa0", "\u2028", "\t"])
def test_ids_refuse_whitespace_as_every_regex_dialect_reads_it(
    demo_feature_set: FeatureSet, space: str
) -> None:
    # With `\s`, pydantic (Rust regex) refused U+0085 while the published schema
    # (ECMA-262) allowed it, and the other way round for U+FEFF.
    for field in ("event_id", "user_id", "item_id"):
        event = {**json.loads(GOOD), field: f"a{space}1"}
        raw = json.dumps(event).encode()  # escaped as JSON requires of control characters
        with pytest.raises(InvalidArgument, match=field):
            parse_event(raw, demo_feature_set.event_schema)
        schema = Event.model_json_schema()["properties"][field]["pattern"]
        assert not re.search(schema, "a" + space + "1")


@pytest.mark.parametrize("request_id", [None, "r-7"])
@pytest.mark.parametrize("values", [{}, {"rating": 4.0, "price": 0.5}])
def test_an_event_of_validated_fields_is_the_one_model_construct_makes(
    request_id: str | None, values: dict[str, float]
) -> None:
    fields: dict[str, Any] = {"event_id": "e-1", "user_id": "u1", "item_id": "i9", "behavior": "rate",
              "event_time": 1_767_225_600_000, "request_id": request_id}  # fmt: skip
    want = Event.model_construct(**fields)
    want._values = dict(values)
    got = Event.of_validated(**fields, values=dict(values))
    for part in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
        assert getattr(got, part) == getattr(want, part), part
    assert got == want and hash(got) == hash(want) and got.to_json() == want.to_json()
    assert got.values == want.values == values
    assert got.model_copy() == want and got.with_values({"rating": 1.0}).values == {"rating": 1.0}
    with pytest.raises(ValidationError):  # frozen, as a validated event is
        got.user_id = "u2"  # type: ignore[misc]
