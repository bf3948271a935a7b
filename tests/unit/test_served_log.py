"""The served-feature log's request-path side: sampling and a queue that never blocks."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from services.feature.served_log import ServedLog
from services.feature.store import Lookup


def _never() -> AIOKafkaProducer:
    raise AssertionError("the request path must not touch the producer")


def test_sampling_follows_the_rate() -> None:
    draws = iter([0.1, 0.5, 0.2499, 0.25])
    log = ServedLog(_never, "served_features", rate=0.25, rand=lambda: next(draws))
    assert [log.sampled() for _ in range(4)] == [True, False, True, False]
    assert not ServedLog(_never, "t", rate=0.0).sampled()
    assert ServedLog(_never, "t", rate=1.0, rand=lambda: 0.999).sampled()


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    log = ServedLog(_never, "served_features", rate=1.0, queue_max=2)
    lookup = Lookup(user={}, item_columns={})
    for n in range(5):
        log.offer(request_id=f"r{n}", trace_id="", as_of_ms=1, user_id="u", item_ids=[], lookup=lookup)
    assert log.dropped == 3
    await asyncio.sleep(0)  # nothing was awaited by offer(): it returned at once every time
