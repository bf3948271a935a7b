"""Dynamic micro-batching: concurrent Score requests share one model run.

Requests queue up (bounded: a full queue answers RESOURCE_EXHAUSTED at once);
one worker takes the oldest, then keeps collecting until the batch holds
`max_rows` rows or `max_delay_us` has passed since the first was taken --
but only while requests arrive, on average, within that wait
(`expect_company`): at a few hundred requests per second the next one is
milliseconds away, and waiting for it only added the delay (rounded up to
the event loop's 1 ms timer) to every answer.
A request of `solo_rows` rows or more is scored in its own handler, as
with batching off: it already amortises the model's per-run cost (on CPU a
128-row run costs as much per request alone as in a batch), and the queue
only added the hand-over to the worker: `bench inference --rows 200
--concurrency 16 --repeat 3` measured queued 200-row requests at 0.97x the
throughput of no batching.
Requests whose deadline has passed are dropped before scoring
(DEADLINE_EXCEEDED), so an overloaded queue never spends the model on answers
nobody waits for. The decision of what goes into a batch is the pure function
`take_batch`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import Counter, Gauge, Histogram

from recmesh.errors import DeadlineExceeded, ResourceExhausted

F32 = npt.NDArray[np.float32]

BATCH_ROWS = Histogram(
    "recmesh_inference_batch_rows",
    "Rows per model run.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
)
BATCH_REQUESTS = Histogram(
    "recmesh_inference_batch_requests", "Requests per model run.", buckets=(1, 2, 4, 8, 16, 32, 64, 128)
)
QUEUE_DEPTH = Gauge("recmesh_inference_queue_depth", "Requests waiting to be batched.")
EXPIRED = Counter("recmesh_inference_expired_total", "Requests dropped in the queue after their deadline.")
REJECTED = Counter("recmesh_inference_rejected_total", "Requests refused because the queue was full.")


@dataclass(eq=False)
class Job:
    model: Any  # what the request was validated against; a batch never mixes models
    rows: F32
    deadline: float | None  # time.monotonic() by which the caller stops waiting
    future: asyncio.Future[F32] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])


def take_batch(queue: deque[Job], max_rows: int, now: float) -> tuple[list[Job], list[Job]]:
    """Pop the next batch: (to score, expired). The oldest live job picks the
    model (a version and degradation level); later jobs for that model join
    it, jobs for other models keep their place in the queue for the next
    batch, so requests at mixed levels still batch per level. Always takes
    at least one live job, even if it alone exceeds max_rows; stops at the
    first job of the batch's model that would overflow it."""
    batch: list[Job] = []
    expired: list[Job] = []
    others: list[Job] = []
    rows = 0
    while queue:
        job = queue[0]
        if job.deadline is not None and job.deadline <= now:
            expired.append(queue.popleft())
            continue
        if batch and job.model is not batch[0].model:
            others.append(queue.popleft())
            continue
        if batch and rows + job.n > max_rows:
            break
        batch.append(queue.popleft())
        rows += job.n
    queue.extendleft(reversed(others))
    return batch, expired


# Arrival gaps are smoothed exponentially; one gap counts at most
# GAP_CAP x max_delay, so after an idle spell two close arrivals bring the waiting back.
GAP_SMOOTHING = 0.3
GAP_CAP = 4.0


def expect_company(mean_gap_s: float, max_delay_s: float) -> bool:
    """Whether waiting up to `max_delay_s` for more requests should pay: the
    next one is, on average, due within it."""
    return mean_gap_s < max_delay_s


def smoothed_gap(mean_gap_s: float, gap_s: float, max_delay_s: float) -> float:
    """The mean arrival gap after one more arrival `gap_s` after the last."""
    gap = min(gap_s, GAP_CAP * max_delay_s)
    return GAP_SMOOTHING * gap + (1 - GAP_SMOOTHING) * mean_gap_s


class MicroBatcher:
    def __init__(
        self,
        score: Callable[[Any, F32], F32],
        *,
        max_rows: int = 1024,
        max_delay_us: int = 500,
        max_queue: int = 256,
        solo_rows: int | None = None,
    ) -> None:
        self._score = score
        self._max_rows = max_rows
        self._solo_rows = solo_rows if solo_rows is not None else max_rows + 1
        self._max_delay_s = max_delay_us / 1e6
        self._max_queue = max_queue
        self._queue: deque[Job] = deque()
        self._wakeup = asyncio.Event()
        self._last_arrival = float("-inf")
        self._mean_gap_s = GAP_CAP * self._max_delay_s  # no company expected yet

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def submit(self, model: Any, rows: F32, timeout_s: float | None) -> F32:
        if rows.shape[0] >= self._solo_rows:
            # Already a batch's worth: scored here, as with batching off. Queued, it
            # would only pay the hand-over to the worker and the copy into a batch.
            BATCH_ROWS.observe(rows.shape[0])
            BATCH_REQUESTS.observe(1)
            return self._score(model, rows)
        if len(self._queue) >= self._max_queue:
            REJECTED.inc()
            raise ResourceExhausted(f"inference queue full ({self._max_queue} requests)")
        now = time.monotonic()
        self._mean_gap_s = smoothed_gap(self._mean_gap_s, now - self._last_arrival, self._max_delay_s)
        self._last_arrival = now
        job = Job(model, rows, None if timeout_s is None else now + timeout_s)
        self._queue.append(job)
        QUEUE_DEPTH.set(len(self._queue))
        self._wakeup.set()
        return await job.future

    async def run(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            first_seen = time.monotonic()
            # Give concurrent requests up to max_delay to join, unless the batch
            # is already full or none is due within it.
            while (
                expect_company(self._mean_gap_s, self._max_delay_s)
                and len(self._queue) < self._max_queue  # a full queue admits nobody to wait for
                and sum(j.n for j in self._queue) < self._max_rows
            ):
                left = self._max_delay_s - (time.monotonic() - first_seen)
                if left <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except TimeoutError:
                    break
            batch, expired = take_batch(self._queue, self._max_rows, time.monotonic())
            QUEUE_DEPTH.set(len(self._queue))
            for job in expired:
                EXPIRED.inc()
                if not job.future.done():
                    job.future.set_exception(DeadlineExceeded("deadline passed while queued for inference"))
            if not batch:
                continue
            self._run_batch(batch)
            await asyncio.sleep(0)  # let the answers go out before the next batch

    def _run_batch(self, batch: list[Job]) -> None:
        rows = batch[0].rows if len(batch) == 1 else np.concatenate([j.rows for j in batch])
        BATCH_ROWS.observe(rows.shape[0])
        BATCH_REQUESTS.observe(len(batch))
        try:
            scores = self._score(batch[0].model, rows)
        except Exception as err:
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        start = 0
        for job in batch:
            if not job.future.done():
                job.future.set_result(scores[start : start + job.n])
            start += job.n
