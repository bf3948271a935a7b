"""Micro-batching: the pure batch decision, and the batcher with a NumPy scorer."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np
import pytest

from recmesh.errors import DeadlineExceeded, ResourceExhausted
from services.inference.batcher import F32, Job, MicroBatcher, take_batch


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
