"""recmesh.features.check: a repository held against a log and a catalog, each
finding naming the repository file's line of its key."""

from __future__ import annotations

from pathlib import Path

from recmesh.events import Event
from recmesh.features.check import Finding, check_log, errors
from recmesh.features.eventlog import EventTable
from recmesh.features.repository import parse_feature_set

DAY = 86_400_000
T0 = 1_767_225_600_000

SHOP = """
[repository]
name = "shop"

[events]
behaviors = ["view", "purchase", "return"]

[items.features]
aisle = { type = "categorical", missing = [""] }

[realtime.sales_30d]
entity = "item"
aggregate = "count"
behaviors = ["purchase"]
window = "30d"

[recall]
category = "aisle"

[training]
examples = ["purchase"]
label = { implicit = true }
negatives = 4
"""


def _feature_set(tmp_path: Path, text: str = SHOP) -> object:
    path = tmp_path / "recmesh.toml"
    path.write_text(text)
    return parse_feature_set(text, path)


def _ev(n: int, user: str, item: str, t: int, behavior: str = "purchase") -> Event:
    return Event.model_construct(
        event_id=f"e{n}", user_id=user, item_id=item, behavior=behavior, event_time=t
    )


def _checked(feature_set: object, log: list[Event], *args: object) -> list[Finding]:
    """check_log of the events, the same as of their table (its columns: no event made)."""
    found = check_log(feature_set, log, *args)  # type: ignore[arg-type]
    assert [f.text() for f in check_log(feature_set, EventTable.of(log), *args)] == [  # type: ignore[arg-type]
        f.text() for f in found
    ]
    return found


def test_a_valid_log_passes_with_the_warnings_a_team_should_read(tmp_path: Path) -> None:
    feature_set = _feature_set(tmp_path)
    log = [
        _ev(n, f"u{n % 3}", f"p{n % 5}", T0 + n * DAY // 4, "purchase" if n % 4 else "view")
        for n in range(24)
    ]
    items = {f"p{n}": {"aisle": "a1" if n == 0 else "unknown"} for n in range(20)}
    found = _checked(feature_set, log, {}, items)
    assert errors(found) == []
    text = [f.text() for f in found]
    line = {f.key: f.where.rsplit(":", 1)[1] for f in found}
    assert any("['return'] declared and never seen" in t for t in text), text
    assert any(
        "realtime.sales_30d.window: 30 days is longer than the log's span (5.8 days)" in t for t in text
    )
    assert any("recall.category: 'aisle' is empty for 19 of 20 items" in t for t in text), text
    assert line["realtime.sales_30d.window"] == "15" and line["recall.category"] == "18"


def test_ids_that_match_nothing_in_the_items_file_are_named(tmp_path: Path) -> None:
    feature_set = _feature_set(tmp_path)
    log = [_ev(n, f"u{n % 2}", f"p{n}", T0 + n) for n in range(4)]
    found = _checked(feature_set, log, {}, {"P-1": {"aisle": "a"}})
    assert any(f.key == "items.id" and "none of the log's 4 item ids" in f.message for f in found)


def test_the_refusals_come_before_anything_else_and_name_the_label_line(tmp_path: Path) -> None:
    feature_set = _feature_set(
        tmp_path,
        SHOP.replace("label = { implicit = true }", 'label = { behaviors = ["purchase"], within = "0s" }'),
    )
    log = [_ev(n, "u1", f"p{n}", T0 + n) for n in range(3)]
    (err,) = errors(_checked(feature_set, log))
    assert err.key == "training.label" and err.where.endswith(":22")
    assert "write label = { implicit = true }" in err.message
