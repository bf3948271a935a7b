"""State that survives a restart: `recmesh up` stopped with SIGINT and started again
on the same state directory still holds the catalog and the real-time features
its ingest wrote (the embedded Redis's append-only file), with new credentials
and a new, empty broker; `recmesh up --fresh` starts empty."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_up import PORT_VARS
from tests.helpers import free_port, own_model_dir, poll_until

pytestmark = pytest.mark.e2e

USER = "restart-user"


class Up:
    """One `recmesh up --demo-events 0` on `state`, on ports of its own."""

    def __init__(self, state: Path, model_dir: Path, run: int, *args: str) -> None:
        self.state = state
        self.ports = {name: free_port() for name in PORT_VARS}
        env = dict(os.environ, RECMESH_STATE_DIR=str(state), RECMESH_MODEL_DIR=str(model_dir),
                   **{k: str(v) for k, v in self.ports.items()})  # fmt: skip
        for var in ("REDIS_URL", "KAFKA_BOOTSTRAP", "RECMESH_TLS"):
            env.pop(var, None)
        self.log = state / f"up-{run}.log"
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "recmesh.tools.cli.main", "up", "--demo-events", "0", *args],
                stdout=fh, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while "recmesh is up" not in self.text():
            assert self.proc.poll() is None, f"recmesh up exited early:\n{self.text()}"
            assert time.monotonic() < deadline, f"mesh not up in 120 s:\n{self.text()}"
            time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=40) == 0, self.text()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    async def post(self, ids: list[str]) -> None:
        now = int(time.time() * 1000)
        events = [{"event_id": eid, "user_id": USER, "item_id": f"i{n}", "behavior": "click",
                   "event_time": now - n * 1000} for n, eid in enumerate(ids)]  # fmt: skip
        async with httpx.AsyncClient(timeout=5) as http:
            posted = await http.post(
                f"http://127.0.0.1:{self.ports['GATEWAY_HTTP_PORT']}/v1/events", json={"events": events}
            )
        assert posted.status_code == 202, posted.text

    def clicks(self) -> dict[str, object]:
        """clicks_5m of USER as `recmesh features get` shows it, with this run's cli.env."""
        pairs = (line.split("=", 1) for line in (self.state / "secrets" / "cli.env").read_text().splitlines())
        env = {**os.environ, "RECMESH_TLS": "on", **{k: shlex.split(v)[0] for k, v in pairs}}
        out = subprocess.run(
            [sys.executable, "-m", "recmesh.tools.cli.main", "features", "get", "--user", USER],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        feature: dict[str, object] = json.loads(out.stdout)["user"]["features"]["clicks_5m"]
        return feature

    def duplicates(self) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.ports['INGEST_METRICS_PORT']}/metrics", timeout=5).text
        name = "recmesh_ingest_duplicate_events_total"
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith((f"{name} ", f"{name}{{")))


async def test_redis_state_survives_a_restart_and_fresh_starts_empty(
    tmp_path: Path, model_dir: Path, embed_model_dir: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    model_dir = own_model_dir(model_dir, embed_model_dir, tmp_path / "models")
    first = Up(state, model_dir, 1)
    try:
        assert "nothing from earlier runs" in first.text()
        await first.post(["r-0", "r-1", "r-2"])

        async def applied() -> bool:
            return first.clicks()["value"] == 3

        await poll_until(applied, "3 clicks applied", timeout=20, interval=0.3)
        first.stop()
    finally:
        first.kill()
    redis_logs = "".join(p.read_text() for p in (state / "logs").glob("redis-*.log"))
    assert "Saving the final RDB snapshot before exiting" in redis_logs, "SIGTERM reached Redis, which saved"

    second = Up(state, model_dir, 2)
    try:
        text = second.text()
        assert "keys read back from earlier runs" in text, text
        assert "already in Redis" in text and "not loaded again" in text, text
        assert "cleared the ingest's offsets of the last run's broker" in text, text
        kept = second.clicks()
        assert kept["value"] == 3 and kept["source"] == "realtime", kept
        # The last run's ids are still known (dropped as duplicates); a new one is applied,
        # read from the new broker's first offset.
        await second.post(["r-0", "r-1", "r-2", "r-3"])

        async def deduplicated() -> bool:
            return second.duplicates() == 3 and second.clicks()["value"] == 4

        await poll_until(deduplicated, "3 known ids dropped, the new one applied", timeout=20, interval=0.3)
        second.stop()
    finally:
        second.kill()

    third = Up(state, model_dir, 3, "--fresh")
    try:
        text = third.text()
        assert "--fresh: deleted the embedded Redis's data from earlier runs (dump.rdb" in text, text
        assert "nothing from earlier runs" in text and "loaded (no catalog in Redis)" in text, text
        assert third.clicks()["value"] == 0
        third.stop()
    finally:
        third.kill()
