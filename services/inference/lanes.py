"""Hard isolation per task type inside the inference service (design notes:
separate queues and concurrency limits per task type).
Each lane's threads may also run at a lower CPU priority (LaneLimits.nice).

A `Lane` owns a bounded wait queue, a concurrency limit and its own worker
threads: embedding (and generation) work runs on the lane's threads, never on
the event loop that serves CTR `Score`, and a full lane answers
RESOURCE_EXHAUSTED at once instead of queueing without bound. A request whose
deadline cannot be met while waiting is dropped (DEADLINE_EXCEEDED) before it
costs any model time. The admission rule is the pure function `admit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter, Gauge

from recmesh.errors import DeadlineExceeded, ResourceExhausted

T = TypeVar("T")

LANE_WAITING = Gauge("recmesh_inference_lane_waiting", "Requests waiting for a lane slot.", ["lane"])
LANE_RUNNING = Gauge("recmesh_inference_lane_running", "Requests running in a lane.", ["lane"])
LANE_SHED = Counter(
    "recmesh_inference_lane_shed_total", "Requests a lane refused or dropped.", ["lane", "reason"]
)


@dataclass(frozen=True)
class LaneLimits:
    concurrency: int  # requests running at once (= worker threads)
    max_queue: int  # requests allowed to wait for a slot
    # Linux niceness of the lane's threads (0-19): with a positive value the
    # kernel gives CPU to the event loop (Score) first when cores are scarce.
    nice: int = 0


def lower_priority(nice: int) -> None:
    if nice > 0 and hasattr(os, "setpriority"):
        # On Linux PRIO_PROCESS with a thread id sets that thread alone.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def admit(waiting: int, running: int, limits: LaneLimits) -> bool:
    """A request may enter while running + waiting is under slots + queue room.
    Counting both together matters: admitted requests sit in `waiting` until
    the event loop hands them a slot, and `running < concurrency` alone would
    let a burst arriving in one loop turn past the queue bound."""
    return waiting + running < limits.concurrency + limits.max_queue


class Lane:
    def __init__(self, name: str, limits: LaneLimits) -> None:
        if limits.concurrency < 1 or limits.max_queue < 0:
            raise ValueError(f"lane {name}: concurrency >= 1 and max_queue >= 0 required, got {limits}")
        self.name = name
        self.limits = limits
        self._slots = asyncio.Semaphore(limits.concurrency)
        self._pool = ThreadPoolExecutor(
            limits.concurrency,
            thread_name_prefix=f"lane-{name}",
            initializer=lower_priority,
            initargs=(limits.nice,),
        )
        self.waiting = 0
        self.running = 0

    def _gauges(self) -> None:
        LANE_WAITING.labels(self.name).set(self.waiting)
        LANE_RUNNING.labels(self.name).set(self.running)

    async def run(self, fn: Callable[[], T], timeout_s: float | None) -> T:
        """Run `fn` on the lane's threads within `timeout_s` of waiting."""
        if not admit(self.waiting, self.running, self.limits):
            LANE_SHED.labels(self.name, "queue_full").inc()
            raise ResourceExhausted(
                f"{self.name} lane full ({self.running} running, {self.waiting} waiting); retry later"
            )
        started = time.monotonic()
        self.waiting += 1
        self._gauges()
        try:
            try:
                await asyncio.wait_for(self._slots.acquire(), timeout_s)
            except TimeoutError:
                LANE_SHED.labels(self.name, "deadline_in_queue").inc()
                raise DeadlineExceeded(
                    f"{self.name} lane: no slot within {1000 * (time.monotonic() - started):.0f} ms"
                ) from None
        finally:
            self.waiting -= 1
            self._gauges()
        self.running += 1
        self._gauges()
        work = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        # The slot is held until the thread is done, even when the caller gives
        # up: a cancelled request must not let more work in than there are threads.
        work.add_done_callback(lambda _: self._finish())
        return await asyncio.shield(work)

    def _finish(self) -> None:
        self.running -= 1
        self._gauges()
        self._slots.release()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._pool.shutdown(wait=False, cancel_futures=True)
