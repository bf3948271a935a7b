"""The impression record and the log's bounded queue (no broker: pure logic)."""

from __future__ import annotations

import orjson
from aiokafka import AIOKafkaProducer

from recmesh.evaluation import impression
from services.gateway.impressions import ImpressionLog, impression_record
from services.gateway.recommend import Recommendation


def _never() -> AIOKafkaProducer:
    raise AssertionError("no producer is made without run()")


def _rec(degraded: list[str]) -> Recommendation:
    return Recommendation([("i9", 0.9), ("i3", 0.5)], "A", "t" * 32, "ctr-1", "fs-1", degraded, "r1")


def test_the_record_says_what_was_shown_where_and_by_which() -> None:
    log = ImpressionLog(_never, "impressions", 1.0)
    log.offer("u1", _rec(["ladder:no_crosses", "slo_class_downgraded:A->B"]), 1_000)
    (entry,) = [log._queue.get_nowait()]
    record = impression_record(entry)
    assert record["items"] == [{"item_id": "i9", "position": 1, "score": 0.9},
                               {"item_id": "i3", "position": 2, "score": 0.5}]  # fmt: skip
    assert (record["request_id"], record["user_id"], record["model_version"]) == ("r1", "u1", "ctr-1")
    assert record["ladder"] == "no_crosses" and record["arm"] == "control" and record["as_of_ms"] == 1_000
    assert orjson.loads(ImpressionLog._record(entry).value) == orjson.loads(orjson.dumps(record))
    shown = impression.parse(ImpressionLog._record(entry).value)  # what attribution reads back
    assert (shown.items, shown.scores, shown.as_of_ms) == (("i9", "i3"), (0.9, 0.5), 1_000)
    assert shown.group == impression.Group("ctr-1", "no_crosses", "A", "control")


def test_a_full_queue_drops_and_counts_and_a_zero_rate_logs_nothing() -> None:
    log = ImpressionLog(_never, "impressions", 1.0, queue_max=1)
    for _ in range(3):
        log.offer("u1", _rec([]), 1)
    assert log.dropped == 2 and log._queue.qsize() == 1
    off = ImpressionLog(_never, "impressions", 0.0)
    off.offer("u1", _rec([]), 1)
    assert off._queue.qsize() == 0 and off.dropped == 0


def test_each_answer_has_its_own_id() -> None:
    a = Recommendation([], "B", "", "m", "f")
    b = Recommendation([], "B", "", "m", "f")
    assert len(a.request_id) == 32 and a.request_id != b.request_id
