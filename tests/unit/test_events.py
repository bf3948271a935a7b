from __future__ import annotations

import pytest

from recmesh.errors import InvalidArgument
from recmesh.events import parse_event

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
    ],
)
def test_bad_events_name_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_event(raw)
