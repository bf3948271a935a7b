"""The generated shop (recmesh.tools.demo.shop): seeded, in a team's own shapes, and
read the same way every time even though a day's purchases share one time."""

from __future__ import annotations

from pathlib import Path

from recmesh.features.backfill import LabelRule
from recmesh.features.eventlog import sort_events
from recmesh.features.importer import EventMapper, good_events
from recmesh.features.repository import load_feature_set
from recmesh.tools.demo.shop import write_shop
from recmesh.tools.training.ranking import leave_last_out

ROOT = Path(__file__).resolve().parents[5]


def test_the_shop_is_seeded_and_its_day_resolution_log_splits_the_same_every_time(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    counts = write_shop(one, shoppers=60, products=120, days=60)
    write_shop(two, shoppers=60, products=120, days=60)
    for name in ("purchases.csv", "events.csv", "products.csv"):
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert counts["events"] > counts["purchases"] > 100
    header, first = (one / "purchases.csv").read_text().splitlines()[:2]
    assert header == "shopper,product,day" and len(first.split(",")[2]) == 10  # a date alone
    products = (one / "products.csv").read_text().splitlines()[1:]
    assert 0 < sum(1 for p in products if not p.endswith(",")) < len(products) / 3  # few aisles known

    feature_set = load_feature_set(ROOT / "examples" / "shop" / "purchases.toml")
    events = list(sort_events(good_events(EventMapper(feature_set), one / "purchases.csv")))
    again = list(sort_events(reversed(list(good_events(EventMapper(feature_set), two / "purchases.csv")))))
    assert [e.event_id for e in events] == [e.event_id for e in again]  # ties in time: by event id
    assert len({e.event_time for e in events}) < len(events) / 2  # many purchases share a day
    split = leave_last_out(LabelRule.of(feature_set), events)
    twice = leave_last_out(LabelRule.of(feature_set), again)
    assert [(t.user_id, t.item_id) for t in split.targets] == [(t.user_id, t.item_id) for t in twice.targets]
    assert len(split.targets) > 40
