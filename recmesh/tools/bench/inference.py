"""`recmesh bench inference`: dynamic batching on vs off, and cold start.

The inference service runs as its own process (the way it is deployed), once
with batching and once without, with the same model and the same offered
load: `concurrency` callers each sending requests of `rows` rows back to back
for `seconds`. Cold start is process start -> grpc.health SERVING (model
loaded and warmed), measured for every start, and process start -> the
first Score answered (a new client connecting after SERVING).

It also times the model alone (the level-0 ONNX session in this process, as
the service configures it): one request's rows, and a full batch of
concurrent requests per request. Batching can save at most the difference,
per request. Set against a request's cost with batching off -- the service
process's CPU time per request (from /proc; wall-clock throughput on a
shared machine counts everyone else's load), else 1 / throughput -- that
bounds the throughput ratio that saved model time can explain. A ratio of x5
needs batching to save 80% of a request's cost, so a model run of at least
80% of it. On CPU it is a few percent: a model run is ~10 us for one row
(~50 us for the ranker's 200 candidates, where ORT's per-call overhead is
already amortised and batching saves nothing), while a unary call through
grpc.aio alone costs ~160-200 us of server CPU, and tracing, the interceptor
and the handler add ~250-300 us more -- all per request, batched or not. A measured
ratio above the bound comes from elsewhere (handlers that yield while a batch
forms let the event loop take in and answer more calls per turn: the server
CPU figure shows it) or from noise on a shared machine.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.clients.base import HealthProbe
from recmesh.clients.inference import InferenceClient
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.modeldir import current_model
from recmesh.settings import InferenceSettings
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit, free_port, plaintext_unless_set, process_cpu_s
from recmesh.tools.bench.repeat import Spread, round_order, spread
from recmesh.tools.training.train import TrainConfig, train


async def start_service(
    model_dir: Path, config: Config, log: Path, rows: int
) -> tuple[subprocess.Popen[bytes], str, float, float]:
    """Start the service; seconds from spawn to grpc.health SERVING, and to the
    first Score (`rows` rows, level 0) answered on a new client's connection."""
    port = free_port()
    env = dict(os.environ, INFERENCE_PORT=str(port), INFERENCE_METRICS_PORT=str(free_port()),
               RECMESH_MODEL_DIR=str(model_dir), RECMESH_LOG_LEVEL="WARNING", **config.env())  # fmt: skip
    started = time.perf_counter()
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
            [sys.executable, "-m", "services.inference"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    addr = f"127.0.0.1:{port}"
    # Polled every 5 ms on a channel that retries a refused connection every
    # 10-20 ms (a default channel waits 1 s, then 1.6 s: seconds of error).
    probe = HealthProbe(addr)
    try:
        while not await probe.serving(0.2):
            if proc.poll() is not None:
                raise RuntimeError(f"inference did not start, see {log}")
            if time.perf_counter() - started > 60:
                raise TimeoutError(f"inference not SERVING in 60 s, see {log}")
            await asyncio.sleep(0.005)
        serving_s = time.perf_counter() - started
    finally:
        await probe.close()
    client = InferenceClient(addr, "bench")
    try:
        version, cols = await schema(client)
        await client.score(version, cols, _values(rows, len(cols)), cap_s=5.0)
    finally:
        await client.close()
    return proc, addr, serving_s, time.perf_counter() - started


async def schema(client: InferenceClient) -> tuple[str, list[str]]:
    """The served model's feature-set version and input columns (rows built by the caller)."""
    info = await client.model_info()
    return info.feature_version, list(info.feature_names)


def _values(rows: int, width: int) -> list[float]:
    return np.random.default_rng(0).random((rows, width)).astype(np.float32).ravel().tolist()


async def _load(addr: str, rows: int, concurrency: int, seconds: float, pid: int) -> dict[str, float]:
    """Closed-loop load; also the service process's CPU time per request
    (robust to a shared machine, where wall-clock throughput is not)."""
    client = InferenceClient(addr, "bench")
    version, cols = await schema(client)
    values = _values(rows, len(cols))
    for _ in range(50):
        await client.score(version, cols, values, cap_s=5.0)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await client.score(version, cols, values, cap_s=5.0)
            latencies.append(time.perf_counter() - t)

    cpu_before = process_cpu_s(pid)
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu_after = process_cpu_s(pid)
    await client.close()
    cpu_s = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else float("nan")
    return {
        "server_cpu_us": cpu_s / max(1, len(latencies)) * 1e6,
        "rps": len(latencies) / elapsed,
        "rows_per_s": len(latencies) * rows / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def model_costs(model_dir: Path, rows: int, concurrency: int) -> dict[str, float]:
    """Median seconds of one model run for one request's rows, and per request
    within the batch the batcher would form from `concurrency` such requests."""
    from services.inference.model import load

    path = current_model(model_dir)
    assert path is not None
    settings = InferenceSettings()
    model = load(path, settings.intra_op_threads)
    variant = model.variant(0)
    width = len(model.columns)
    per_batch = max(1, min(concurrency, settings.batch_max_rows // max(1, rows)))

    def median_run(n: int) -> float:
        x = np.random.default_rng(0).random((n, width)).astype(np.float32)
        samples = []
        for _ in range(max(20, 20_000 // n)):
            t = time.perf_counter()
            variant.score(x)
            samples.append(time.perf_counter() - t)
        return percentile(samples, 50)

    return {"single_s": median_run(rows), "batched_per_request_s": median_run(rows * per_batch) / per_batch,
            "requests_per_batch": per_batch}  # fmt: skip


@dataclass(frozen=True)
class Config:
    """One way the service runs: batching off, or on with a batch wait (None: the service's default)."""

    batching: bool
    max_delay_us: int | None = None

    @property
    def name(self) -> str:
        if not self.batching:
            return "off"
        return "on" if self.max_delay_us is None else f"on_wait{self.max_delay_us}us"

    def env(self) -> dict[str, str]:
        env = {"RECMESH_INFERENCE_BATCHING": str(self.batching).lower()}
        if self.max_delay_us is not None:
            env["RECMESH_BATCH_MAX_DELAY_US"] = str(self.max_delay_us)
        return env


def configs(max_delays_us: list[int] | None) -> list[Config]:
    """Batching off, then on at the default wait, or at each wait given."""
    ons = [Config(True, d) for d in max_delays_us] if max_delays_us else [Config(True)]
    return [Config(False), *ons]


async def run(
    model_dir: Path | None,
    rows: int,
    concurrency: int,
    seconds: float,
    repeat: int = 1,
    max_delays_us: list[int] | None = None,
) -> dict[str, Any]:
    """Each configuration's service started once; then `repeat` rounds, each
    loading every configuration in turn, in alternating order."""
    compared = configs(max_delays_us)
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-") as tmp:
        work = Path(tmp)
        if model_dir is None or current_model(model_dir) is None:
            model_dir = work / "models"
            feature_set = load_feature_set(DEMO_REPOSITORY)
            train(
                TrainConfig(sessions=1500, hours=2.0, epochs=3),
                model_dir,
                feature_set,
                progress=lambda _: None,
            )
        started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        cold: list[float] = []
        first_score: list[float] = []
        rounds: list[dict[str, dict[str, float]]] = []
        try:
            for config in compared:
                log = work / f"{config.name}.log"
                proc, addr, cold_s, first_s = await start_service(model_dir, config, log, rows)
                started[config.name] = (proc, addr)
                cold.append(cold_s)
                first_score.append(first_s)
            for r in range(repeat):
                results: dict[str, dict[str, float]] = {}
                for config in round_order(compared, r):
                    proc, addr = started[config.name]
                    results[config.name] = await _load(addr, rows, concurrency, seconds, proc.pid)
                rounds.append(results)
        finally:
            for proc, _ in started.values():
                proc.terminate()
            for proc, _ in started.values():
                proc.wait(10)
        costs = model_costs(model_dir, rows, concurrency)
    return figures_of(compared, rounds, costs, cold, first_score, rows, concurrency)


def figures_of(
    compared: list[Config],
    rounds: list[dict[str, dict[str, float]]],
    costs: dict[str, float],
    cold: list[float],
    first_score: list[float],
    rows: int,
    concurrency: int,
) -> dict[str, Any]:
    figures: dict[str, Any] = {"rows_per_request": rows, "concurrency": concurrency, "rounds": len(rounds)}
    names = [c.name for c in compared]
    for name in names:
        for key in ("rps", "p50_ms", "p99_ms", "server_cpu_us"):
            figures[f"batching_{name}_{key}"] = round(spread([r[name][key] for r in rounds]).median, 3)
    ratios: dict[str, Spread] = {}
    for name in names[1:]:
        ratios[f"throughput_ratio_{name}"] = spread([r[name]["rps"] / r["off"]["rps"] for r in rounds])
        ratios[f"server_cpu_ratio_{name}"] = spread(
            [r["off"]["server_cpu_us"] / r[name]["server_cpu_us"] for r in rounds]
        )
    figures["ratios"] = {k: v.as_dict() for k, v in ratios.items()}
    figures["throughput_ratio"] = round(ratios[f"throughput_ratio_{names[1]}"].median, 3)
    figures["server_cpu_ratio"] = round(ratios[f"server_cpu_ratio_{names[1]}"].median, 3)
    figures["cold_start_s"] = round(min(cold), 3)
    figures["cold_start_max_s"] = round(max(cold), 3)
    figures["first_score_s"] = round(min(first_score), 3)
    figures["first_score_max_s"] = round(max(first_score), 3)
    # A request's cost with batching off: the service's CPU per request where
    # /proc gives it (wall time per request, 1/throughput, counts the machine's
    # other load and the load generator too), else 1/throughput.
    cpu_off = figures["batching_off_server_cpu_us"] / 1e6
    by_cpu = math.isfinite(cpu_off) and cpu_off > 0
    per_request_off = cpu_off if by_cpu else 1 / figures["batching_off_rps"]
    figures["request_cost_basis"] = "service CPU per request" if by_cpu else "1/throughput"
    saved = max(0.0, costs["single_s"] - costs["batched_per_request_s"])
    figures["model_us_per_request"] = round(costs["single_s"] * 1e6, 1)
    figures["model_us_per_request_batched"] = round(costs["batched_per_request_s"] * 1e6, 1)
    figures["requests_per_batch"] = costs["requests_per_batch"]
    figures["model_share_of_request_cost"] = round(costs["single_s"] / per_request_off, 4)
    figures["model_time_ratio_bound"] = round(per_request_off / max(1e-9, per_request_off - saved), 3)
    # What x5 would take: batching must save 80% of a request's cost, so the
    # model run it amortizes must be at least that large a share.
    figures["model_share_needed_for_x5"] = 0.8
    figures["configs"] = names
    return figures


def table(f: dict[str, Any]) -> str:
    names: list[str] = f["configs"]
    lines = [
        f"recmesh bench inference ({f['concurrency']} concurrent callers, {f['rows_per_request']} "
        f"rows/request, {f['rounds']} alternating round(s); medians)"
    ]
    for name in names:
        fig = {key: f[f"batching_{name}_{key}"] for key in ("rps", "p50_ms", "p99_ms", "server_cpu_us")}
        lines.append(
            f"  batching {name:<13} {fig['rps']:>9.1f} req/s  p50 {fig['p50_ms']} ms  "
            f"p99 {fig['p99_ms']} ms  server CPU {fig['server_cpu_us']:.0f} us/request"
        )
    for name in names[1:]:
        tput = Spread.of(f["ratios"][f"throughput_ratio_{name}"])
        cpu = Spread.of(f["ratios"][f"server_cpu_ratio_{name}"])
        lines.append(
            f"  {name} / off  throughput {tput.text(3)} (wall clock); less CPU per request {cpu.text(3)}"
        )
    lines += [
        f"  model alone   {f['model_us_per_request']} us per request; "
        f"{f['model_us_per_request_batched']} us per request in batches of {f['requests_per_batch']} "
        f"(in process)",
        f"  bound         the model is {f['model_share_of_request_cost']:.1%} of a request's cost with "
        f"batching off ({f['request_cost_basis']}): saved model time explains at most "
        f"x{f['model_time_ratio_bound']}.",
        f"                x5 needs batching to save 80% of a request's cost, i.e. a model run of at least "
        f"{f['model_share_needed_for_x5']:.0%} of it; the rest (gRPC, protobuf, tracing, the handler) is per "
        f"request, batched or not.",
        f"  cold start    {f['cold_start_s']} s (process start -> SERVING, model loaded and warmed; "
        f"worst of {len(names)}: {f['cold_start_max_s']} s)",
        f"  first score   {f['first_score_s']} s (process start -> first Score answered on a new "
        f"connection; worst of {len(names)}: {f['first_score_max_s']} s)",
    ]
    return "\n".join(lines)


def main(args: Any) -> int:
    plaintext_unless_set()
    model_dir = Path(args.model_dir) if args.model_dir else None
    figures = asyncio.run(
        run(model_dir, args.rows, args.concurrency, args.seconds, args.repeat, args.max_delay_us)
    )
    emit(figures, args.json, table(figures))
    return 0
