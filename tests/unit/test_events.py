from __future__ import annotations

import json
import re

import pytest

from recmesh.errors import InvalidArgument
from recmesh.events import Event, parse_event

GOOD = (
    b'{"event_id": "e1", "user_id": "u1", "item_id": "i1", "behavior": "view", '
    b'"event_time": 1767225600000, "x": 1}'
)


def test_good_event_with_extra_fields() -> None:
    e = parse_event(GOOD)
    assert (e.user_id, e.behavior, e.event_time) == ("u1", "view", 1767225600000)


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
def test_bad_events_name_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_event(raw)


def test_event_time_is_an_integer_as_json_schema_reads_one() -> None:
    # The gateway publishes Event's JSON Schema, where 1767225600000.0 is an integer.
    raw = GOOD.replace(b'"event_time": 1767225600000', b'"event_time": 1767225600000.0')
    assert parse_event(raw).event_time == 1767225600000


@pytest.mark.parametrize("space", ["\x85", "\ufeff", "\x1c", "\xa0", "\u2028", "\t"])
def test_ids_refuse_whitespace_as_every_regex_dialect_reads_it(space: str) -> None:
    # With `\s`, pydantic (Rust regex) refused U+0085 while the published schema
    # (ECMA-262) allowed it, and the other way round for U+FEFF.
    for field in ("event_id", "user_id", "item_id"):
        event = {**json.loads(GOOD), field: f"a{space}1"}
        raw = json.dumps(event).encode()  # escaped as JSON requires of control characters
        with pytest.raises(InvalidArgument, match=field):
            parse_event(raw)
        schema = Event.model_json_schema()["properties"][field]["pattern"]
        assert not re.search(schema, "a" + space + "1")
