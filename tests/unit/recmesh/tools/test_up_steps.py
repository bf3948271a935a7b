"""`recmesh up`'s start-up steps run in a forked child (`in_child`): the answer
or the error comes back, what the step imports stays in the child, a Ctrl-C
on the terminal is the supervisor's to act on, and a cancelled step's child
is terminated."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from recmesh.tools.training.beside import can_fork
from recmesh.tools.up import in_child

pytestmark = pytest.mark.skipif(not can_fork(), reason="the steps run on a thread where fork is unsafe")

# A module nothing in the suite imports: a stand-in for training and ONNX.
UNUSED = "tabnanny"


def _imports_and_says_where() -> tuple[int, bool]:
    __import__(UNUSED)
    return os.getpid(), UNUSED in sys.modules


async def test_a_step_answers_from_another_process_and_leaves_its_imports_there() -> None:
    assert UNUSED not in sys.modules
    pid, imported = await in_child(_imports_and_says_where, "a step")
    assert pid != os.getpid()
    assert imported
    assert UNUSED not in sys.modules


def _fails() -> None:
    raise RuntimeError("no model for repository 'shop'")


async def test_a_failing_step_raises_its_error_in_the_supervisor() -> None:
    with pytest.raises(RuntimeError, match="no model for repository 'shop'"):
        await in_child(_fails, "a step")


def _interrupted() -> str:
    os.kill(os.getpid(), signal.SIGINT)  # as a Ctrl-C reaches the terminal's whole process group
    time.sleep(0.2)
    return "went on"


async def test_a_ctrl_c_is_left_to_the_supervisor() -> None:
    # The supervisor's loop turns SIGINT into a stop; the child inherits that
    # handling (and the loop's wake-up pipe) unless the step resets it.
    loop = asyncio.get_running_loop()
    stops: list[int] = []
    loop.add_signal_handler(signal.SIGINT, stops.append, 1)
    try:
        assert await in_child(_interrupted, "a step") == "went on"
        await asyncio.sleep(0.3)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    assert stops == [], "the child's signal reached the supervisor's handler"


def _waits(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    time.sleep(60)


async def test_a_cancelled_step_terminates_its_child(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: None)  # as `recmesh up`'s, inherited by the fork
    try:
        task = asyncio.create_task(in_child(lambda: _waits(marker), "a step"))
        for _ in range(200):
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.05)
        child = int(marker.read_text())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
