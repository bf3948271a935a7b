"""Overload at twice the measured capacity against a mesh started as a user
would (`recmesh up`, real processes): class A keeps >= 95% goodput inside its
budget while class C is shed with 429 + Retry-After."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from recmesh.tools.bench.loadgen import LoadSpec, closed_loop, offer, summarise
from recmesh.tools.up import DEMO_API_KEY
from tests.e2e.test_up import PORT_VARS
from tests.helpers import free_port, own_model_dir, poll_until

# Timing-sensitive: it needs the two cores to itself. Alone on the 2-core box
# class A kept 100% goodput (p99 206-263 ms) in three runs while C was 67-83%
# shed; with other heavy work on the same cores it fell to 49-73%. It runs in
# the suite (which runs tests one at a time); RECMESH_OVERLOAD_TEST=0 skips it
# on a machine that is busy with other work, `make overload` runs it alone.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("RECMESH_OVERLOAD_TEST") == "0",
        reason="RECMESH_OVERLOAD_TEST=0: timing-sensitive overload test skipped on a busy machine",
    ),
]


@pytest.fixture(scope="module")
def mesh_url(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, embed_model_dir: Path
) -> Iterator[tuple[str, str]]:
    """The gateway's public URL and its metrics port's."""
    state = tmp_path_factory.mktemp("overload")
    own = own_model_dir(model_dir, embed_model_dir, state / "models")
    ports = {name: free_port() for name in PORT_VARS}
    env = dict(os.environ, RECMESH_STATE_DIR=str(state), RECMESH_MODEL_DIR=str(own),
               RECMESH_CONTROLLER_WINDOW_S="2", **{k: str(v) for k, v in ports.items()})  # fmt: skip
    log = state / "up.log"
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recmesh.tools.cli.main", "up", "--demo-events", "500"],
            env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{ports['GATEWAY_HTTP_PORT']}"
    try:
        deadline_s = 120.0

        async def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                async with httpx.AsyncClient(timeout=2) as http:
                    return (await http.get(f"{url}/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        asyncio.run(poll_until(ready, "mesh ready", deadline_s, interval=0.5))
        yield url, f"http://127.0.0.1:{ports['GATEWAY_METRICS_PORT']}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(40)


async def test_class_a_keeps_its_goodput_at_twice_capacity_while_c_is_shed(
    mesh_url: tuple[str, str],
) -> None:
    url, metrics_url = mesh_url
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    keys = {"A": DEMO_API_KEY, "C": None}
    await offer(host, port, LoadSpec(rate=30, seconds=2, mix={"A": 0.5, "C": 0.5}, api_keys=keys))  # warm-up
    capacity = await closed_loop(host, port, concurrency=8, seconds=4, slo_class="A", api_key=DEMO_API_KEY)
    rate = 2 * capacity
    spec = LoadSpec(rate=rate, seconds=6, mix={"A": 0.25, "C": 0.75}, api_keys=keys, seed=5)
    outcomes, lag_ms = await offer(host, port, spec)
    result = summarise(outcomes, rate, spec.seconds)
    a, c = result.classes["A"], result.classes["C"]
    print(
        f"\ncapacity {capacity:.1f}/s; offered {rate:.1f}/s (A {a.offered}, C {c.offered} requests); "
        f"A goodput {100 * a.goodput_ratio:.1f}% p50 {a.p50_ms:.0f} ms p99 {a.p99_ms:.0f} ms "
        f"shed {100 * a.shed_rate:.1f}%; C shed {100 * c.shed_rate:.1f}% "
        f"goodput {100 * c.goodput_ratio:.1f}%; "
        f"generator lag p99 {lag_ms:.0f} ms"
    )
    failed = [(o.slo_class, o.status, o.error) for o in outcomes if o.status not in (200, 429)]
    assert not failed, f"overload answers 200 or 429, never 5xx or nothing: {failed[:5]}"
    assert a.goodput_ratio >= 0.95, f"class A goodput {a.goodput_ratio:.3f} < 95% within 300 ms"
    assert c.shed_rate >= 0.2, f"class C shed only {c.shed_rate:.3f}"
    async with httpx.AsyncClient(base_url=metrics_url) as http:
        metrics = (await http.get("/metrics")).text
    assert 'recmesh_admission_shed_total{reason="limit",service="gateway",slo_class="C"}' in metrics
