"""`recmesh bench floor` on a short run: the four skeleton processes make the
mesh's calls over real sockets, every request is answered, and the CPU line
names each role (figures, not stopwatches: no speed is asserted)."""

from __future__ import annotations

import argparse

from recmesh.tools.bench.floor import ROLES, TITLE, run
from recmesh.tools.bench.sweep import table


async def test_the_skeleton_answers_every_request_and_names_each_role() -> None:
    steps = await run(argparse.Namespace(rates="100", seconds=1.0))
    assert [s.rate for s in steps] == [20, 100], "the unloaded step, then each offered rate"
    for step in steps:
        a = step.classes["A"]
        assert a.ok == a.offered > 0 and a.errors == 0, a
        assert set(step.cpu_ms_per_request) == set(ROLES), "the four processes, nothing else"
    # /proc counts CPU in 10 ms ticks: only the loaded step is sure to show every role.
    assert all(ms > 0 for ms in steps[-1].cpu_ms_per_request.values()), steps[-1].cpu_ms_per_request
    text = table(steps, title=TITLE)
    assert text.splitlines()[0] == TITLE and "cpu ms/request: " in text
