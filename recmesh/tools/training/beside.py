"""Work run beside the caller's: a function in a forked child process, its
result (or its exception) sent back through a pipe.

`recmesh train --events` builds learnt retrieval this way while it replays the
log and trains the model: the two share only the event log, which the child
inherits from the fork (nothing is copied or pickled on the way in), and the
build's result is small (its card and the tuning users' candidates). On a
machine without `fork` (or with `jobs=1`), `run_beside` runs the function at
once, in this process, and the caller's code is the same.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from recmesh.heap import give_back

T = TypeVar("T")


class Done(Generic[T]):
    """A result computed already (the function ran in this process)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def ready(self) -> bool:
        return True

    def result(self) -> T:
        return self._value

    def cancel(self) -> None:
        return None


class Forked(Generic[T]):
    """`fn()` running in a forked child; `result()` waits for it. A thread of
    this process takes the answer as soon as it is sent, so the child ends (and
    gives its memory back) when its work is done, not when the caller asks."""

    def __init__(self, fn: Callable[[], T], what: str) -> None:
        self.what = what
        for stream in (sys.stdout, sys.stderr):  # or the child would print the parent's buffered lines again
            stream.flush()
        give_back()  # or both processes would count the heaps' free pages
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(fn, send, recv), name=what, daemon=True)
        self._proc.start()
        send.close()
        self._outcome: tuple[str, Any] = ("error", RuntimeError(f"{what}: no answer"))
        self._taker = threading.Thread(target=self._take, args=(recv,), name=f"{what} (answer)", daemon=True)
        self._taker.start()

    def _take(self, recv: Connection) -> None:
        try:
            self._outcome = recv.recv()
        except EOFError:  # killed (out of memory, a signal) before it could answer
            self._proc.join()
            code = self._proc.exitcode
            self._outcome = ("error", RuntimeError(f"{self.what}: its process died (exit code {code})"))
        except Exception as err:  # an answer that does not unpickle here
            self._outcome = ("error", RuntimeError(f"{self.what}: its answer could not be read: {err!r}"))
        finally:
            recv.close()
            self._proc.join()

    def ready(self) -> bool:
        return not self._taker.is_alive()

    def result(self) -> T:
        self._taker.join()
        kind, value = self._outcome
        if kind == "error":
            raise value
        return value  # type: ignore[no-any-return]

    def cancel(self) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._taker.join()


def _child(fn: Callable[[], Any], send: Connection, parents_end: Connection) -> None:
    # What the fork inherited is out of the collector's reach: a cycle of the caller's
    # that had become garbage would otherwise be finalized here, by objects whose
    # threads did not come with the fork. A gRPC object left by a mesh the caller had
    # run in-process joined its poller thread in its finalizer and spun for ever (the
    # child at 100 % CPU in the collector, the caller waiting for its answer: seen in
    # tests/integration/test_movielens.py after a test that served from this process).
    gc.freeze()
    # The caller's end of the pipe, inherited: closed, so that a caller that is
    # gone (killed) makes the send below fail instead of blocking for ever.
    parents_end.close()
    for stream in (sys.stdout, sys.stderr):  # progress lines as they come, not when the child ends
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    try:
        outcome: tuple[str, Any] = ("ok", fn())
    except BaseException as err:  # every failure goes back to the caller, which raises it
        err.add_note(f"in a process beside the caller's:\n{traceback.format_exc()}")
        outcome = ("error", err)
    try:
        try:
            send.send(outcome)
        except (BrokenPipeError, ConnectionResetError):  # the caller is gone: nobody to answer
            return
        except Exception as err:  # a result or exception that does not pickle
            send.send(("error", RuntimeError(f"{type(err).__name__}: {err}\n{traceback.format_exc()}")))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def can_fork() -> bool:
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system says)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def run_beside(fn: Callable[[], T], what: str, jobs: int) -> Done[T] | Forked[T]:
    """`fn` in a forked child when `jobs` > 1 and this system forks safely (Linux),
    else run now in this process."""
    if jobs > 1 and can_fork():
        return Forked(fn, what)
    return Done(fn())
