"""The gateway's readiness with real processes: it follows what this gateway
can answer, not the health of the mesh behind it (services/gateway/readiness.py).

Kill the ranker: the gateway stays ready and answers 200 from its popular
fallback, `degraded` naming it. A gateway that never got its fallback list
(the feature service down since it started) and has no ranker cannot answer
anything but 503: it reports unready, and turns ready the moment the feature
service is back and the list arrives."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.tools.demo.generate import make_catalog, offline_rows
from recmesh.tools.localinfra import ManagedProcess
from services.feature.catalog import load_catalog
from tests.helpers import free_port, poll_until

HEADERS = {"x-api-key": "demo-interactive", "x-slo-class": "B"}
KEYS = '{"demo-interactive": {"tenant": "demo", "max_class": "A", "trusted_context": true}}'


class Mesh:
    """Feature, ranker and gateways as processes; inference is never started
    (the ranker falls back to its recall order), nor the broker (readiness
    does not depend on it)."""

    def __init__(self, redis_url: str, model_dir: Path, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = {n: free_port() for n in ("FEATURE_PORT", "RANKER_PORT", "FEATURE_METRICS_PORT",
                                               "RANKER_METRICS_PORT")}  # fmt: skip
        dead = f"127.0.0.1:{free_port()}"
        self.env = dict(
            os.environ, REDIS_URL=redis_url, KAFKA_BOOTSTRAP=dead, INFERENCE_ADDR=dead,
            FEATURE_ADDR=f"127.0.0.1:{self.ports['FEATURE_PORT']}", RECMESH_MODEL_DIR=str(model_dir),
            RANKER_ADDR=f"127.0.0.1:{self.ports['RANKER_PORT']}", RECMESH_API_KEYS=KEYS,
            **{k: str(v) for k, v in self.ports.items()},
        )  # fmt: skip
        self.procs: dict[str, ManagedProcess] = {}

    def start(self, name: str, module: str, **env: str) -> ManagedProcess:
        proc = ManagedProcess(name, [sys.executable, "-m", module], self.workdir / f"{name}.log",
                              dict(self.env, **env))  # fmt: skip
        proc.start()
        self.procs[name] = proc
        return proc

    def gateway(self, name: str) -> str:
        http = free_port()
        self.start(name, "services.gateway", GATEWAY_HTTP_PORT=str(http),
                   GATEWAY_GRPC_PORT=str(free_port()), GATEWAY_METRICS_PORT=str(free_port()))  # fmt: skip
        return f"http://127.0.0.1:{http}"

    def kill(self, name: str) -> None:
        managed = self.procs.pop(name)
        assert managed.proc is not None
        managed.proc.send_signal(signal.SIGKILL)
        managed.proc.wait(10)
        managed.stop()  # closes its log

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in self.procs.values())

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop(timeout_s=10)


@pytest.fixture
async def mesh(redis_url: str, model_dir: Path, tmp_path: Path) -> AsyncIterator[Mesh]:
    url = redis_url.rsplit("/", 1)[0] + "/4"  # a database of its own, with the demo catalog
    client = connect(url, 4)
    try:
        await client.flushdb()
        await load_catalog(client, load_feature_set(DEMO_REPOSITORY), *offline_rows(make_catalog()))
    finally:
        await client.aclose()
    m = Mesh(url, model_dir, tmp_path)
    try:
        yield m
    finally:
        m.stop()


async def _ready(http: httpx.AsyncClient) -> httpx.Response:
    return await http.get("/readyz")


async def test_the_gateway_stays_ready_without_the_ranker_and_answers_degraded(mesh: Mesh) -> None:
    mesh.start("feature", "services.feature")
    mesh.start("ranker", "services.ranker")
    url = mesh.gateway("gateway")
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:

        async def all_up() -> bool:
            try:
                r = await _ready(http)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and r.json()["checks"]["ranker"] and r.json()["fallback"]["items"] > 0

        await poll_until(all_up, f"gateway ready with ranker and fallback\n{mesh.logs()}", timeout=60)
        served = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5}, headers=HEADERS)
        assert served.status_code == 200, served.text
        assert "ranker_unavailable" not in served.json()["degraded"]

        mesh.kill("ranker")

        async def ranker_seen_down() -> bool:
            return (await _ready(http)).json()["checks"]["ranker"] is False

        await poll_until(ranker_seen_down, "the ranker's death seen by /readyz", timeout=10)
        ready = await _ready(http)
        assert ready.status_code == 200, ready.text
        body = ready.json()
        # Downstream health is reported, not obeyed: ranker down, inference never started, no broker.
        assert body["ready"] is True and body["checks"]["feature"] is True
        assert body["checks"]["inference"] is False and body["checks"]["event_broker"] is False
        served = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5}, headers=HEADERS)
        assert served.status_code == 200, served.text
        assert "ranker_unavailable" in served.json()["degraded"]
        assert served.json()["model_version"] == "popularity" and len(served.json()["items"]) == 5


async def test_a_gateway_that_cannot_answer_is_unready_until_its_fallback_arrives(mesh: Mesh) -> None:
    url = mesh.gateway("gateway")  # no ranker, no feature service: nothing to answer with
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:

        async def answering() -> bool:
            try:
                await _ready(http)
            except httpx.HTTPError:
                return False
            return True

        await poll_until(answering, f"the gateway's HTTP port\n{mesh.logs()}", timeout=60)
        unready = await _ready(http)
        assert unready.status_code == 503, unready.text
        assert unready.json()["fallback"] == {"items": 0, "age_s": None}
        served = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5}, headers=HEADERS)
        assert served.status_code == 503, "what the readiness said: nothing to answer with"

        mesh.start("feature", "services.feature")  # the fallback's source, the ranker still down

        async def ready() -> bool:
            return (await _ready(http)).status_code == 200

        await poll_until(ready, f"ready once the popular list arrived\n{mesh.logs()}", timeout=60)
        served = await http.post("/v1/recommend", json={"user_id": "u1", "count": 5}, headers=HEADERS)
        assert served.status_code == 200 and "ranker_unavailable" in served.json()["degraded"]
