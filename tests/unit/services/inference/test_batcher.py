"""Micro-batching: the pure batch decision, and the batcher with a NumPy scorer."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

from recmesh.errors import DeadlineExceeded, ResourceExhausted
from services.inference.batcher import (
    F32,
    GAP_CAP,
    Job,
    MicroBatcher,
    expect_company,
    smoothed_gap,
    take_batch,
)


async def _job(n: int, deadline: float | None = None, model: object = "m1") -> Job:
    return Job(model, np.zeros((n, 3), np.float32), deadline)


async def test_take_batch_fills_up_to_max_rows_and_drops_expired() -> None:
    q = deque([await _job(4), await _job(3, deadline=5.0), await _job(5), await _job(2)])
    batch, expired = take_batch(q, max_rows=10, now=10.0)
    assert [j.n for j in batch] == [4, 5] and [j.n for j in expired] == [3]
    assert [j.n for j in q] == [2]


async def test_take_batch_takes_an_oversized_job_alone_and_never_mixes_models() -> None:
    q = deque([await _job(50), await _job(1)])
    batch, _ = take_batch(q, max_rows=10, now=0.0)
    assert [j.n for j in batch] == [50]
    q = deque([await _job(1, model="v1"), await _job(1, model="v2")])
    batch, _ = take_batch(q, max_rows=10, now=0.0)
    assert len(batch) == 1 and len(q) == 1


async def test_take_batch_groups_interleaved_models_and_keeps_the_others_in_order() -> None:
    a1, b1, a2, b2, a3 = [await _job(1, model=m) for m in ("v1", "v2", "v1", "v2", "v1")]
    q = deque([a1, b1, a2, b2, a3])
    batch, _ = take_batch(q, max_rows=10, now=0.0)
    assert batch == [a1, a2, a3] and list(q) == [b1, b2]
    batch, _ = take_batch(q, max_rows=10, now=0.0)
    assert batch == [b1, b2] and not q


class Scorer:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, model: Any, rows: F32) -> F32:
        self.calls.append(rows.shape[0])
        out: F32 = rows.sum(axis=1).astype(np.float32)
        return out


async def test_every_request_gets_its_own_scores_back_under_concurrency() -> None:
    scorer = Scorer()
    batcher = MicroBatcher(scorer, max_rows=64, max_delay_us=2000, max_queue=1000)
    worker = asyncio.create_task(batcher.run())
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((int(rng.integers(1, 20)), 3)).astype(np.float32) for _ in range(200)]
    try:
        results = await asyncio.gather(*(batcher.submit("m", x, 5.0) for x in inputs))
    finally:
        worker.cancel()
    for x, got in zip(inputs, results, strict=True):
        np.testing.assert_allclose(got, x.sum(axis=1), rtol=1e-6)
    assert sum(scorer.calls) == sum(len(x) for x in inputs)
    assert len(scorer.calls) < len(inputs) / 3, "requests were batched together"
    assert max(scorer.calls) <= 64 + 19


async def test_full_queue_is_refused_and_expired_requests_are_not_scored() -> None:
    scorer = Scorer()
    batcher = MicroBatcher(scorer, max_rows=8, max_delay_us=100, max_queue=2)
    first = asyncio.create_task(batcher.submit("m", np.ones((1, 3), np.float32), 0.001))
    second = asyncio.create_task(batcher.submit("m", np.ones((1, 3), np.float32), 0.001))
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted, match="queue full"):
        await batcher.submit("m", np.ones((1, 3), np.float32), 1.0)
    await asyncio.sleep(0.01)  # both deadlines pass before the worker starts
    worker = asyncio.create_task(batcher.run())
    try:
        for t in (first, second):
            with pytest.raises(DeadlineExceeded):
                await t
        assert scorer.calls == []
    finally:
        worker.cancel()


def test_company_is_expected_only_when_requests_arrive_within_the_wait() -> None:
    delay = 0.0005
    gap = GAP_CAP * delay  # the starting point: nobody expected
    assert not expect_company(gap, delay)
    for _ in range(5):  # a burst 100 us apart
        gap = smoothed_gap(gap, 0.0001, delay)
    assert expect_company(gap, delay)
    idle = smoothed_gap(gap, 30.0, delay)  # one long idle spell counts as GAP_CAP x delay
    assert not expect_company(idle, delay)
    again = smoothed_gap(smoothed_gap(idle, 0.0001, delay), 0.0001, delay)
    assert expect_company(again, delay), "busy again after two close arrivals"
    assert not expect_company(smoothed_gap(smoothed_gap(gap, 0.05, delay), 0.05, delay), delay)  # 20/s


async def test_a_lone_request_does_not_wait_for_company() -> None:
    scorer = Scorer()
    batcher = MicroBatcher(scorer, max_rows=64, max_delay_us=100_000, max_queue=10)
    worker = asyncio.create_task(batcher.run())
    try:
        for _ in range(4):  # 250 ms apart: nobody is due within the 100 ms wait
            start = time.monotonic()
            await batcher.submit("m", np.ones((2, 3), np.float32), 5.0)
            assert time.monotonic() - start < 0.06, "scored at once, not after the 100 ms wait"
            await asyncio.sleep(0.25)
    finally:
        worker.cancel()
    assert scorer.calls == [2, 2, 2, 2]


async def test_requests_arriving_within_the_wait_share_a_batch() -> None:
    scorer = Scorer()
    batcher = MicroBatcher(scorer, max_rows=64, max_delay_us=100_000, max_queue=100)
    worker = asyncio.create_task(batcher.run())
    try:
        tasks = []
        for _ in range(12):  # 1 ms apart: well within the 100 ms wait
            tasks.append(asyncio.create_task(batcher.submit("m", np.ones((1, 3), np.float32), 5.0)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
    finally:
        worker.cancel()
    assert sum(scorer.calls) == 12
    assert len(scorer.calls) < 12 and max(scorer.calls) >= 2, scorer.calls  # a few alone, then together


async def test_a_large_request_is_scored_at_once_in_its_own_call() -> None:
    scorer = Scorer()
    batcher = MicroBatcher(scorer, max_rows=1024, max_delay_us=100_000, max_queue=100, solo_rows=100)
    # No worker runs: a request that went through the queue would never be answered.
    scores = await asyncio.wait_for(batcher.submit("m", np.ones((200, 3), np.float32), 5.0), 1.0)
    assert scores.shape == (200,) and scorer.calls == [200]
    assert batcher.depth == 0
