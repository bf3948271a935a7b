"""Lane admission (pure) and the lane itself with real worker threads."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from recmesh.errors import DeadlineExceeded, ResourceExhausted
from services.inference.lanes import Lane, LaneLimits, admit


def test_admit_counts_free_slots_then_queue_room() -> None:
    limits = LaneLimits(concurrency=2, max_queue=1)
    assert admit(0, 1, limits)
    assert admit(0, 2, limits)  # slots full, queue has room
    assert not admit(1, 2, limits)
    # A burst in one loop turn: nothing runs yet, but the waiters already fill slots and queue.
    assert admit(2, 0, limits)
    assert not admit(3, 0, limits)


async def test_full_lane_sheds_at_once_and_deadline_in_queue_is_refused() -> None:
    lane = Lane("t", LaneLimits(concurrency=1, max_queue=1))
    release = threading.Event()
    first = asyncio.create_task(lane.run(lambda: release.wait(5), 5.0))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(lane.run(lambda: "second", 0.2))
    await asyncio.sleep(0.05)
    with pytest.raises(ResourceExhausted, match="t lane full"):
        await lane.run(lambda: "third", 5.0)
    with pytest.raises(DeadlineExceeded):
        await waiting
    release.set()
    assert await first is True
    assert await lane.run(lambda: "after", 1.0) == "after"
    assert (lane.running, lane.waiting) == (0, 0)
    lane.close()


async def test_work_runs_off_the_event_loop() -> None:
    lane = Lane("t2", LaneLimits(concurrency=1, max_queue=0))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        for _ in range(20):
            await asyncio.sleep(0.005)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    await lane.run(lambda: threading.Event().wait(0.15), 1.0)
    await ticking
    assert ticks == 20  # the loop kept running while the lane's thread was busy
    lane.close()


async def test_lane_threads_run_at_the_configured_niceness() -> None:
    lane = Lane("t3", LaneLimits(concurrency=1, max_queue=0, nice=7))
    base = os.getpriority(os.PRIO_PROCESS, 0)
    got = await lane.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), 1.0)
    assert got == max(7, base)  # raising niceness needs no privilege; lowering it would
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the event loop's thread is untouched
    lane.close()
