"""TopicLog's sends: entries that queue while a send lingers go out together
(a stand-in producer records the sends: pure logic, no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from recmesh.topiclog import Record, TopicLog


class Producer:
    def __init__(self) -> None:
        self.sends: list[list[bytes]] = []
        self._pending: list[bytes] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes, headers: Any) -> asyncio.Future[None]:
        self._pending.append(value)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def flush_send(self) -> None:
        if self._pending:
            self.sends.append(self._pending)
            self._pending = []


def _log(producer: Producer, linger_s: float) -> TopicLog[bytes]:
    outcomes = Counter("t", "t", ("outcome",), registry=CollectorRegistry())

    def encode(entry: bytes) -> Record:
        producer.flush_send()  # a new send starts with its first encoded entry
        return Record(b"k", entry, None, "B")

    return TopicLog(lambda: producer, "t", 1.0, encode, outcomes, linger_s=linger_s)


async def _offer_over(log: TopicLog[bytes], n: int, gap_s: float) -> None:
    for k in range(n):
        log.put(str(k).encode())
        await asyncio.sleep(gap_s)


async def test_entries_offered_within_the_linger_go_in_one_send() -> None:
    for linger_s, most_sends in ((0.5, 1), (0.0, 10)):
        producer = Producer()
        log = _log(producer, linger_s)
        stop = asyncio.Event()
        running = asyncio.create_task(log.run(stop))
        await _offer_over(log, 10, 0.01)
        await asyncio.sleep(0.6 if linger_s else 0.05)
        stop.set()
        await asyncio.wait_for(running, 5)
        producer.flush_send()
        assert log.sent == 10
        assert sum(len(s) for s in producer.sends) == 10
        if linger_s:
            assert len(producer.sends) == most_sends
        else:
            assert len(producer.sends) > 1  # one send per entry that found the queue empty


async def test_a_stop_ends_the_linger_and_flushes() -> None:
    producer = Producer()
    log = _log(producer, 30.0)
    stop = asyncio.Event()
    running = asyncio.create_task(log.run(stop))
    await _offer_over(log, 3, 0.0)
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(running, 2)  # not 30 s
    assert log.sent == 3
