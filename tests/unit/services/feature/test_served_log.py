"""The served-feature log's request-path side: sampling and a queue that never
blocks; the record it produces, and the offline check of such records."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson
from aiokafka import AIOKafkaProducer

from recmesh.events import Event, validate_event
from recmesh.features.repository import FeatureSet
from recmesh.features.served import compare, served_record
from recmesh.features.wire import Column
from services.feature.served_log import ServedLog
from services.feature.store import Lookup

T0 = 1_767_225_600_000


def _never() -> AIOKafkaProducer:
    raise AssertionError("the request path must not touch the producer")


def test_sampling_follows_the_rate() -> None:
    draws = iter([0.1, 0.5, 0.2499, 0.25])
    log = ServedLog(_never, "served_features", rate=0.25, rand=lambda: next(draws), feature_version="fs-1")
    assert [log.sampled() for _ in range(4)] == [True, False, True, False]
    assert not ServedLog(_never, "t", rate=0.0, feature_version="fs-1").sampled()
    assert ServedLog(_never, "t", rate=1.0, rand=lambda: 0.999, feature_version="fs-1").sampled()


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    log = ServedLog(_never, "served_features", rate=1.0, queue_max=2, feature_version="fs-1")
    lookup = Lookup(user={}, item_columns={})
    for n in range(5):
        log.offer(request_id=f"r{n}", trace_id="", as_of_ms=1, user_id="u", item_ids=[], lookup=lookup)
    assert log.dropped == 3
    await asyncio.sleep(0)  # nothing was awaited by offer(): it returned at once every time


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes, headers: Any = None) -> None:
        self.sent.append((topic, value, key))


async def test_queued_lookups_are_produced_with_the_feature_set_version() -> None:
    producer = FakeProducer()
    log = ServedLog(lambda: cast(AIOKafkaProducer, producer), "served", rate=1.0, feature_version="fs-abc")
    lookup = Lookup(
        user={"clicks_5m": (2, "realtime", 1000)},
        item_columns={"views_10m": Column([3, 0], ["realtime", "default"], [5, -1])},
        degraded=["related_timeout"],
    )
    log.offer(request_id="r1", trace_id="t1", as_of_ms=T0, user_id="u1", item_ids=["i1", "i2"], lookup=lookup)
    stop = asyncio.Event()
    stop.set()  # flushes what is queued, then returns
    await asyncio.wait_for(log.run(stop), 5)
    assert log.sent == 1 and len(producer.sent) == 1
    topic, value, key = producer.sent[0]
    record = orjson.loads(value)
    assert (topic, key) == ("served", b"u1")
    assert record["feature_version"] == "fs-abc" and record["request_id"] == "r1"
    assert record["user"] == {"clicks_5m": [2, "realtime", 1000]}
    assert record["items"] == {
        "views_10m": {"values": [3, 0], "sources": ["realtime", "default"], "ages": [5, -1]}
    }
    assert record["item_ids"] == ["i1", "i2"] and record["degraded"] == ["related_timeout"]


def _event(feature_set: FeatureSet, eid: str, behavior: str, t: int, item: str = "i1") -> Event:
    obj = {"event_id": eid, "user_id": "u1", "item_id": item, "behavior": behavior, "event_time": t}
    return validate_event(obj, feature_set.event_schema)


def _row(feature_set: FeatureSet, clicks_5m: int, clicks_10m: int, *, version: str | None = None,
         degraded: tuple[str, ...] = (), category: str = "news") -> dict[str, Any]:  # fmt: skip
    return served_record(
        feature_version=version or feature_set.version, request_id="r", trace_id="", as_of_ms=T0 + 2000,
        user_id="u1", user={"clicks_5m": (clicks_5m, "realtime", 1000), "age_band": ("25-34", "offline", -1)},
        item_ids=["i1"], served_at_ms=T0 + 2000,
        item_columns={"clicks_10m": Column([clicks_10m], ["realtime"], [1000]),
                      "category": Column([category], ["offline"], [-1])},
        degraded=degraded,
    )  # fmt: skip


def test_compare_recomputes_served_rows_with_the_replay(demo_feature_set: FeatureSet) -> None:
    events = [
        _event(demo_feature_set, "c1", "click", T0 + 1000),
        _event(demo_feature_set, "c2", "click", T0 + 5000),
    ]
    users = {"u1": {"age_band": "25-34"}}
    items = {"i1": {"category": "news"}}
    good = compare(demo_feature_set, [_row(demo_feature_set, 1, 1)], events, users, items)
    assert good.rows == 1 and good.mismatches == 0
    assert {n: t.compared for n, t in good.features.items()} == dict.fromkeys(
        ("clicks_5m", "age_band", "clicks_10m", "category"), 1
    )
    # The click after the as-of time is not counted; a served 2 is a mismatch, with an example.
    bad = compare(demo_feature_set, [_row(demo_feature_set, 2, 1, category="food")], events, users, items)
    assert bad.mismatches == 2
    assert bad.features["clicks_5m"].examples == [
        {"request_id": "r", "as_of_ms": T0 + 2000, "user_id": "u1", "served": 2, "replay": 1}
    ]
    assert bad.features["category"].mismatched == 1
    other = compare(
        demo_feature_set, [_row(demo_feature_set, 9, 9, version="fs-other")], events, users, items
    )
    assert (other.rows, other.skipped_version, other.mismatches) == (1, 1, 0)
    # A degraded row served defaults on purpose: its real-time values are not compared.
    degraded = compare(
        demo_feature_set,
        [_row(demo_feature_set, 0, 0, degraded=("realtime_store_timeout",))],
        events,
        users,
        items,
    )
    assert degraded.skipped_degraded == 1 and degraded.mismatches == 0
    assert degraded.features["clicks_5m"].compared == 0 and degraded.features["category"].compared == 1
