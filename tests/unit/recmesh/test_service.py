"""recmesh.service.serve: the one start and stop sequence, with a recording server."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from recmesh.service import Job, Parts, Step, serve


class Recorder:
    def __init__(self) -> None:
        self.steps: list[str] = []

    async def start(self) -> None:
        self.steps.append("start")

    async def set_serving(self) -> None:
        self.steps.append("serving")

    async def stop(self, grace_s: float) -> None:
        self.steps.append(f"stop {grace_s}")

    def step(self, name: str, wait: bool = False) -> Step:
        async def run() -> None:
            self.steps.append(name)
            if wait:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.steps.append(f"{name} cancelled")
                    raise

        return run


async def _signal_soon() -> None:
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


async def test_start_and_stop_run_in_their_order_on_a_signal() -> None:
    r = Recorder()
    parts = Parts(r, warm=r.step("warm"), background=[r.step("loop", wait=True)],
                  after_serving=[Job("job", r.step("job", wait=True))],
                  closers=[r.step("close 1"), r.step("close 2")])  # fmt: skip
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(_signal_soon()))
    await asyncio.wait_for(serve(parts, 0.5), 5)
    # The loop starts with the server (it runs at the first suspension) and stops after it.
    assert r.steps.index("loop") < r.steps.index("job")
    r.steps.remove("loop")
    assert r.steps == ["start", "warm", "serving", "job", "job cancelled", "stop 0.5", "loop cancelled",
                       "close 1", "close 2"]  # fmt: skip


async def test_a_failed_job_stops_the_service_and_is_raised_after_teardown() -> None:
    r = Recorder()

    async def fails() -> None:
        raise RuntimeError("text models")

    parts = Parts(r, after_serving=[Job("text", fails)], closers=[r.step("close")])
    with pytest.raises(RuntimeError, match="text models"):
        await asyncio.wait_for(serve(parts, 0.1), 5)
    assert r.steps == ["start", "serving", "stop 0.1", "close"]


async def test_a_job_that_may_end_does_not_stop_it_one_marked_until_stop_does() -> None:
    r = Recorder()

    async def done() -> None:
        r.steps.append("loaded")

    async def http() -> None:
        await asyncio.sleep(0.05)
        r.steps.append("http ended")

    parts = Parts(r, after_serving=[Job("load", done), Job("http", http, until_stop=True)])
    await asyncio.wait_for(serve(parts, 0.1), 5)
    assert r.steps == ["start", "serving", "loaded", "http ended", "stop 0.1"]
