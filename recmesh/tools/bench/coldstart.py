"""`recmesh bench coldstart`: process start -> SERVING, and the first requests.

Each service is started as its own process, the way a scaled-to-zero replica
starts (Redis and the broker already up), in dependency order: feature,
inference (once per model size), ranker, gateway. For each: seconds from
process start to grpc.health SERVING (the gateway: to /readyz 200), then the
latency of its first request and of a warm one. This is the figure that says
whether a class with a ~1 s budget may call a scaled-to-zero service.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from recmesh.clients.base import HealthProbe
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.tools.bench.common import Infra, emit, free_port, infrastructure, plaintext_unless_set
from recmesh.tools.bench.inference import schema
from recmesh.tools.demo.generate import make_catalog, offline_rows
from recmesh.tools.training.train import TrainConfig, train
from services.feature.catalog import load_catalog

SIZES = {"small": 32, "large": 512}  # MLP hidden units (every level variant is loaded)


async def _serving(
    module: str, env: dict[str, str], address: str, log: Path
) -> tuple[subprocess.Popen[bytes], float]:
    """_started for a gRPC service: polls grpc.health on a channel that retries a
    refused connection every 10-20 ms (a client channel backs off for up to 1 s)."""
    probe = HealthProbe(address)
    try:
        return await _started(module, env, lambda: probe.serving(0.2), log)
    finally:
        await probe.close()


async def _started(
    module: str, env: dict[str, str], ready: Callable[[], Awaitable[bool]], log: Path
) -> tuple[subprocess.Popen[bytes], float]:
    t0 = time.perf_counter()
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [sys.executable, "-m", module], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    while not await ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{module} exited during start, see {log}")
        if time.perf_counter() - t0 > 60:
            raise TimeoutError(f"{module} not ready in 60 s, see {log}")
        await asyncio.sleep(0.005)
    return proc, time.perf_counter() - t0


async def _twice(call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    out = []
    for _ in range(2):
        t = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t) * 1000)
    return out[0], out[1]


_Row = dict[str, Any]
_Procs = list[subprocess.Popen[bytes]]


async def run(model_root: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    procs: _Procs = []
    async with infrastructure({"user_behavior": 3, "user_behavior.dlq": 1}) as infra:
        await _load_demo_catalog(infra.redis_url)
        base, http_port = _environment(infra)
        try:
            rows.append(await _feature(base, infra.workdir, procs))
            rows += await _inference(base, model_root, infra.workdir, procs)
            rows.append(await _ranker(base, infra.workdir, procs))
            rows.append(await _gateway(base, http_port, infra.workdir, procs))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(10)
    return [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


async def _load_demo_catalog(redis_url: str) -> None:
    client = connect(redis_url, 4)
    users, items = offline_rows(make_catalog())
    await load_catalog(client, load_feature_set(DEMO_REPOSITORY), users, items)
    await client.aclose()


def _environment(infra: Infra) -> tuple[dict[str, str], int]:
    """The environment every service starts with (ports and addresses of all four), and the
    gateway's HTTP port."""
    base = dict(os.environ, REDIS_URL=infra.redis_url, KAFKA_BOOTSTRAP=infra.kafka_bootstrap,
                RECMESH_REPOSITORY=str(DEMO_REPOSITORY),
                RECMESH_LOG_LEVEL="WARNING", FEATURE_METRICS_PORT=str(free_port()),
                RANKER_METRICS_PORT=str(free_port()), GATEWAY_METRICS_PORT=str(free_port()))  # fmt: skip
    ports = {n: free_port() for n in ("feature", "ranker", "http", "grpc")}
    base.update(FEATURE_PORT=str(ports["feature"]), FEATURE_ADDR=f"127.0.0.1:{ports['feature']}",
                RANKER_PORT=str(ports["ranker"]), RANKER_ADDR=f"127.0.0.1:{ports['ranker']}",
                GATEWAY_HTTP_PORT=str(ports["http"]), GATEWAY_GRPC_PORT=str(ports["grpc"]))  # fmt: skip
    return base, ports["http"]


async def _feature(base: dict[str, str], workdir: Path, procs: _Procs) -> _Row:
    item_ids = [f"i{i}" for i in range(200)]
    fc = FeatureClient(base["FEATURE_ADDR"], "bench")
    proc, ready_s = await _serving("services.feature", base, fc.address, workdir / "f.log")
    procs.append(proc)
    first, warm = await _twice(lambda: fc.get_features("u1", item_ids, 0, cap_s=10))
    await fc.close()
    return {"service": "feature", "ready_s": ready_s, "first_ms": first, "warm_ms": warm}


async def _inference(base: dict[str, str], model_root: Path, workdir: Path, procs: _Procs) -> list[_Row]:
    """One inference process per model size; the small one stays up (INFERENCE_ADDR) for the ranker."""
    rows: list[_Row] = []
    for size, hidden in SIZES.items():
        port = free_port()
        env = dict(base, INFERENCE_PORT=str(port), INFERENCE_METRICS_PORT=str(free_port()),
                   RECMESH_MODEL_DIR=str(model_root / size))  # fmt: skip
        ic = InferenceClient(f"127.0.0.1:{port}", "bench")

        async def score(c: InferenceClient = ic) -> object:
            version, cols = await schema(c)
            return await c.score(version, cols, [0.1] * (len(cols) * 200), cap_s=10)

        proc, ready_s = await _serving("services.inference", env, ic.address, workdir / f"i-{size}.log")
        procs.append(proc)
        first, warm = await _twice(score)
        rows.append({"service": f"inference ({size} model, {hidden} hidden)", "ready_s": ready_s,
                     "first_ms": first, "warm_ms": warm})  # fmt: skip
        await ic.close()
        if size != "small":
            proc.terminate()
            proc.wait(10)
        else:
            base["INFERENCE_ADDR"] = f"127.0.0.1:{port}"
    return rows


async def _ranker(base: dict[str, str], workdir: Path, procs: _Procs) -> _Row:
    rc = RankerClient(base["RANKER_ADDR"], "bench")
    proc, ready_s = await _serving("services.ranker", base, rc.address, workdir / "r.log")
    procs.append(proc)
    first, warm = await _twice(lambda: rc.rank("u1", 10, {}, 0))
    await rc.close()
    return {"service": "ranker", "ready_s": ready_s, "first_ms": first, "warm_ms": warm}


async def _gateway(base: dict[str, str], http_port: int, workdir: Path, procs: _Procs) -> _Row:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=10) as http:

        async def gateway_ready() -> bool:
            try:
                return (await http.get("/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        proc, ready_s = await _started("services.gateway", base, gateway_ready, workdir / "g.log")
        procs.append(proc)
        first, warm = await _twice(lambda: http.post("/v1/recommend", json={"user_id": "u1", "count": 10}))
        return {"service": "gateway", "ready_s": ready_s, "first_ms": first, "warm_ms": warm}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["recmesh bench coldstart (process start -> SERVING; first and warm request)",
             f"  {'service':<36} {'ready s':>8} {'first ms':>9} {'warm ms':>8}"]  # fmt: skip
    lines += [
        f"  {r['service']:<36} {r['ready_s']:>8.3f} {r['first_ms']:>9.2f} {r['warm_ms']:>8.2f}" for r in rows
    ]
    return "\n".join(lines)


def main(args: Any) -> int:
    plaintext_unless_set()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="recmesh-models-") as tmp:
        root = Path(tmp)
        for size, hidden in SIZES.items():
            train(
                TrainConfig(sessions=1500, hours=2.0, epochs=1, hidden=hidden),
                root / size,
                load_feature_set(DEMO_REPOSITORY),
                progress=lambda _: None,
            )
        rows = asyncio.run(run(root))
    emit({"services": rows}, args.json, table(rows))
    return 0
