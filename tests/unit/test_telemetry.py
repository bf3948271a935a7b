"""recmesh.telemetry helpers that need no server."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from recmesh.telemetry import process_age_s


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_age_counts_from_process_start() -> None:
    """A child that sleeps 0.3 s before asking is at least that old, and no
    older than the time from spawning it to its exit (plus one 10 ms tick)."""
    code = "import time; time.sleep(0.3); from recmesh.telemetry import process_age_s; print(process_age_s())"
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    age = float(out.stdout)
    assert 0.3 <= age <= elapsed + 0.02
    mine = process_age_s()
    assert mine is not None and mine > age
