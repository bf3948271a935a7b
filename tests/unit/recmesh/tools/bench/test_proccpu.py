"""The bench's CPU meter on real child processes (psutil)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from recmesh.tools.bench.common import process_cpu_s
from recmesh.tools.bench.loadgen import StepResult
from recmesh.tools.bench.proccpu import CpuMeter, child_pids, named, process_name
from recmesh.tools.bench.sweep import cpu_line

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kills its process group (os.killpg)")

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
# The idle child first, given a second to start (its interpreter and imports cost ~50 ms of
# CPU on a slow box, which fell inside the measured window and made it look busy), then the
# spinner, whose start-up and 0.3 s of spinning are what the window measures.
PARENT = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-m", "timeit", "-n", "1", "import time; time.sleep(30)"])
time.sleep(1.0)
subprocess.Popen([sys.executable, "-c", {SPIN!r}])
print("ready", flush=True)
time.sleep(30)
"""


def test_the_meter_charges_each_child_its_own_cpu() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        meter = CpuMeter(parent.pid)
        meter.start()
        time.sleep(1.0)  # the spinning child spins
        by_name = named(child_pids(parent.pid))
        assert "timeit" in by_name, f"a `python -m module` child is named after its module: {by_name}"
        per = meter.per_request(10)
        assert 10 <= max(per.values()) <= 35, per  # up to 0.3 s over 10 requests
        assert per["timeit"] < 5, per
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the group this test started
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    assert process_cpu_s(parent.pid) is None, "a reaped process has no CPU to read"


def test_process_names_and_the_cpu_line() -> None:
    assert process_name(os.getpid())  # whatever runs the tests has a name
    step = StepResult(100.0, 1.0, cpu_ms_per_request={"ranker": 3.0, "gateway": 1.0})
    assert cpu_line(step) == (
        f"{'':>9} {'cpu':>5} ms/request: ranker 3.00 gateway 1.00; all 4.00 (2-core ceiling ~500/s)"
    )
    assert cpu_line(StepResult(100.0, 1.0)) == ""
