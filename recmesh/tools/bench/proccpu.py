"""CPU time per request of each process of a mesh (psutil).

`recmesh bench e2e` reads, for every step, the CPU seconds (user + system) the
children of the `recmesh up` process used (`recmesh bench floor`: its four
skeleton processes), and divides by the recommendations
the step answered (shed requests' CPU counts as a cost of those served): the
cost of one recommendation per process (gateway, ranker,
feature, inference, Redis, ...), which does not depend on how busy the shared
machine was the way latency does. A process that cannot be read (gone, or not
this user's) is left out; where none can, the bench prints no CPU line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

from recmesh.tools.bench.common import process_cpu_s


def process_name(pid: int) -> str:
    """A short name: `python -m services.ranker` -> ranker, else the program's name."""
    try:
        args = [a for a in psutil.Process(pid).cmdline() if a]
    except psutil.Error:
        return f"pid{pid}"
    if "-m" in args[:-1]:
        module = args[args.index("-m") + 1]
        return module.removeprefix("services.").replace(".", "_")
    return Path(args[0].split()[0]).name.split("-v")[0] if args and args[0].strip() else f"pid{pid}"


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (none when it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def named(pids: list[int]) -> dict[str, int]:
    """`pids` by name (a repeated name gets its pid appended)."""
    out: dict[str, int] = {}
    for kid in pids:
        name = process_name(kid)
        out[name if name not in out else f"{name}:{kid}"] = kid
    return out


@dataclass
class CpuMeter:
    """CPU of the children of one process (`parent`), or of exactly the
    processes `names` lists, between `start` and `per_request`.

    Children are remembered by pid and named only when asked: a process that
    has just been started can show an empty command line for a moment.
    """

    parent: int | None = None
    # pid -> name: measure exactly these (processes `process_name` cannot tell apart).
    names: dict[int, str] = field(default_factory=dict)
    _before: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        pids = list(self.names) or (child_pids(self.parent) if self.parent is not None else [])
        self._before = {p: c for p in pids if (c := process_cpu_s(p)) is not None}

    def per_request(self, requests: int) -> dict[str, float]:
        """CPU milliseconds per request of each child since `start`."""
        out: dict[str, float] = {}
        for name, pid in named(list(self._before)).items():
            after = process_cpu_s(pid)
            if after is not None and requests > 0:
                out[self.names.get(pid, name)] = (after - self._before[pid]) * 1000 / requests
        return out
