"""`recmesh bench graph` with no mesh to record from: a clear error that says what to start, at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from recmesh.tools.localinfra import free_port


def test_no_running_mesh_is_a_clear_error_that_says_what_to_start(tmp_path: Path) -> None:
    nothing = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = {**os.environ, "RECMESH_TLS": "off", "FEATURE_ADDR": nothing, "INFERENCE_ADDR": nothing,
           "RECMESH_MODEL_DIR": str(tmp_path)}  # fmt: skip
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "recmesh.tools.cli.main", "bench", "graph", "--sample", "3", "--repeat", "1",
         "--passes", "1"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("recmesh: Unavailable:") and "`recmesh up`" in last and nothing in last, last
    assert time.monotonic() - started < 30, "a refused connection fails fast, not after every deadline"
