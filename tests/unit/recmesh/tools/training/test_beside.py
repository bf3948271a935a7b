"""Work beside the caller's: a forked child's result, its exception and its death
reach the caller; with one job the work runs at once in the caller's process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from recmesh.errors import InvalidArgument
from recmesh.tools.training.beside import Done, Forked, can_fork, run_beside

pytestmark = pytest.mark.skipif(not can_fork(), reason="forks on Linux only")


def test_the_result_comes_back_from_another_process(capfd: pytest.CaptureFixture[str]) -> None:
    table = list(range(100_000))  # inherited by the fork, not sent

    def work() -> tuple[int, int]:
        print("a progress line from the child")
        return os.getpid(), sum(table)

    pending = run_beside(work, "the sum", jobs=2)
    assert isinstance(pending, Forked)
    pid, total = pending.result()
    assert pid != os.getpid() and total == sum(table)
    assert pending.result() == (pid, total)  # asked again: the same answer, no second wait
    assert "a progress line from the child" in capfd.readouterr().out


def test_the_child_ends_when_its_work_is_done_not_when_the_answer_is_asked_for() -> None:
    import time

    pending = Forked(lambda: list(range(200_000)), "a large answer")  # far more than a pipe holds
    deadline = time.monotonic() + 30
    while not pending.ready() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pending.ready() and not pending._proc.is_alive()  # gone, its memory with it
    assert pending.result()[-1] == 199_999


def test_one_job_runs_the_work_here_and_now() -> None:
    calls: list[int] = []

    def work() -> int:
        calls.append(os.getpid())
        return 7

    pending = run_beside(work, "here", jobs=1)
    assert isinstance(pending, Done) and calls == [os.getpid()] and pending.result() == 7


def test_the_childs_exception_is_raised_in_the_caller_with_its_message() -> None:
    def refuse() -> None:
        raise InvalidArgument("no event of the learnt behaviours ['view'] in the log")

    pending = Forked(refuse, "learnt retrieval's build")
    with pytest.raises(InvalidArgument, match=r"no event of the learnt behaviours") as err:
        pending.result()
    assert any("in a process beside the caller's" in note for note in err.value.__notes__)


def test_a_child_that_dies_is_an_error_naming_the_work() -> None:
    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(RuntimeError, match=r"learnt retrieval's build: its process died \(exit code -9\)"):
        Forked(die, "learnt retrieval's build").result()


def test_cancel_stops_a_child_still_working() -> None:
    import time

    pending = Forked(lambda: time.sleep(60), "a long build")
    assert not pending.ready()
    started = time.perf_counter()
    pending.cancel()
    assert time.perf_counter() - started < 5


class _Finalized:
    """A cycle whose finalizer says where it ran (a file: the child's memory is its own)."""

    def __init__(self, mark: str) -> None:
        self.me = self
        self.mark = mark

    def __del__(self) -> None:
        with open(self.mark, "a") as fh:
            fh.write(f"{os.getpid()}\n")


def test_the_child_never_finalizes_what_it_inherited(tmp_path: Path) -> None:
    """The caller's garbage (a cycle not yet collected when the child is forked) is
    not collected in the child: its finalizer may need threads the fork did not
    copy (a gRPC object's joins its poller thread, and the child spun for ever)."""
    import gc

    mark = str(tmp_path / "finalized")
    gc.disable()
    try:
        _Finalized(mark)  # garbage at once: only the collector can free it
        pending = run_beside(lambda: (gc.collect(), os.getpid())[1], "a collection", jobs=2)
    finally:
        gc.enable()
    child = pending.result()
    gc.collect()  # the caller's own collection finalizes it, here
    with open(mark) as fh:
        ran_in = [int(line) for line in fh]
    assert ran_in == [os.getpid()] and child != os.getpid()
