"""A shop's implicit-feedback logs through a team's whole path (issue 31): a
generated purchase-only log (day-resolution dates, no texts, no users file, an
aisle for a tenth of the products) and a view/cart/purchase clickstream, each
with its repository file from examples/shop, are imported, checked, measured
by `train --ranking` (served must beat popularity), trained for serving, and
served by `recmesh up` with the log replayed as live events: a shopper gets a
recommendation over REST with nothing failed."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from recmesh.tools.demo.shop import write_shop
from recmesh.tools.up import DEMO_API_KEY
from tests.e2e.test_up import PORT_VARS
from tests.helpers import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {
    "purchases": ("purchases.csv", []),
    "funnel": ("events.csv", ["--target", "purchase"]),
}


def _cli(env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "recmesh.tools.cli.main", *args], env=env, check=False,
                         capture_output=True, text=True, timeout=400)  # fmt: skip
    assert out.returncode == 0, f"recmesh {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _check_ranking(env: dict[str, str], log: Path, target: list[str]) -> None:
    """`train --ranking` on the log: served beats popularity, and the fused learnt tables
    recall at least as well as the best one alone."""
    figures: dict[str, Any] = json.loads(
        _cli(
            env, "train", "--events", str(log), "--ranking", *target, "--epochs", "2", "--json"
        ).splitlines()[-1]
    )
    r = figures["ranking"]
    served, popularity = r["served"], r["popularity"]
    assert r["targets"] >= 250, r["targets"]
    assert served["hr@10"] > popularity["hr@10"] and served["ndcg@10"] > popularity["ndcg@10"], r
    # The learnt tables fused put the target among their first 500 at least as often as the best table alone.
    at = r["recall_at"]
    best_alone = max(at[name]["recall@500"] for name in ("knn", "ease"))
    assert at["learnt_fused"]["recall@500"] >= best_alone, at
    assert not [n for n in r["degraded"]["served"] if n.startswith("error")], r["degraded"]


def _recommend_once_ingested(port: int, shopper: str) -> dict[str, Any]:
    """The gateway's answer for `shopper` once it is not degraded (the replayed log ingested:
    the shopper's history seeds learnt retrieval), or the last one after 30 s."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        deadline = time.monotonic() + 30
        while True:
            resp = http.post("/v1/recommend", json={"user_id": shopper, "count": 10},
                             headers={"x-api-key": DEMO_API_KEY, "x-slo-class": "B"})  # fmt: skip
            assert resp.status_code == 200, resp.text
            body: dict[str, Any] = resp.json()
            if not body["degraded"] or time.monotonic() > deadline:
                return body
            time.sleep(1)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shop_log_is_imported_measured_trained_and_served(shape: str, tmp_path: Path) -> None:
    source, target = SHAPES[shape]
    repo = tmp_path / "shop"
    (repo / "data").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "shop" / f"{shape}.toml", repo / "recmesh.toml")
    write_shop(repo / "data", shoppers=300, products=500, days=120)
    state = tmp_path / "state"
    env = dict(os.environ, RECMESH_REPOSITORY=str(repo / "recmesh.toml"), RECMESH_STATE_DIR=str(state),
               RECMESH_MODEL_DIR=str(tmp_path / "models"))  # fmt: skip
    for var in ("REDIS_URL", "KAFKA_BOOTSTRAP", "RECMESH_TLS"):
        env.pop(var, None)
    log = tmp_path / "log.jsonl"
    _cli(env, "events", "import", str(repo / "data" / source), "--to", "log", "--out", str(log))
    checked = json.loads(_cli(env, "repository", "check", str(log), "--json").splitlines()[-1])
    assert checked["errors"] == [] and checked["events"] > 5_000, checked

    _check_ranking(env, log, target)

    _cli(env, "train", "--events", str(log), "--epochs", "1")
    ports = {name: free_port() for name in PORT_VARS}
    env.update({k: str(v) for k, v in ports.items()})
    up_log = tmp_path / "up.log"
    with up_log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "recmesh.tools.cli.main", "up"], stdout=fh,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "recmesh is up" not in up_log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, up_log.read_text()[-3000:]
            time.sleep(0.3)
        assert "no item texts" in up_log.read_text()  # said once, nothing waits for vectors
        pairs = (line.split("=", 1) for line in (state / "secrets" / "cli.env").read_text().splitlines())
        cli_env = {**env, "RECMESH_TLS": "on", **{k: shlex.split(v)[0] for k, v in pairs}}
        _cli(cli_env, "events", "import", str(repo / "data" / source), "--shift-to-now", "--rate", "50000")
        body = _recommend_once_ingested(ports["GATEWAY_HTTP_PORT"], "s7")
        assert len(body["items"]) == 10 and body["model_version"].startswith("ctr-"), body
        assert body["degraded"] == [], body
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
