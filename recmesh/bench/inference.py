"""`recmesh bench inference`: dynamic batching on vs off, and cold start.

The inference service runs as its own process (the way it is deployed), once
with batching and once without, with the same model and the same offered
load: `concurrency` callers each sending requests of `rows` rows back to back
for `seconds`. Cold start is process start -> grpc.health SERVING (model
loaded and warmed), measured for every start.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.bench.common import emit, free_port, percentile
from recmesh.clients import InferenceClient
from recmesh.features.definitions import FEATURE_SET_VERSION
from recmesh.features.vectorize import COLUMNS
from recmesh.modeldir import current_model
from recmesh.training.train import TrainConfig, train


async def _start(model_dir: Path, batching: bool, log: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    env = dict(os.environ, INFERENCE_PORT=str(port), INFERENCE_METRICS_PORT=str(free_port()),
               RECMESH_MODEL_DIR=str(model_dir), RECMESH_INFERENCE_BATCHING=str(batching).lower(),
               RECMESH_LOG_LEVEL="WARNING")  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once)
        [sys.executable, "-m", "services.inference"], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    addr = f"127.0.0.1:{port}"
    probe = InferenceClient(addr, "bench")
    try:
        while not await probe.health(0.2):
            if proc.poll() is not None:
                raise RuntimeError(f"inference did not start, see {log}")
            await asyncio.sleep(0.005)
    finally:
        await probe.close()
    return proc, addr, time.perf_counter() - started


async def _load(addr: str, rows: int, concurrency: int, seconds: float) -> dict[str, float]:
    client = InferenceClient(addr, "bench")
    values = np.random.default_rng(0).random((rows, len(COLUMNS))).astype(np.float32).ravel().tolist()
    cols = list(COLUMNS)
    for _ in range(50):
        await client.score(FEATURE_SET_VERSION, cols, values, cap_s=5.0)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            await client.score(FEATURE_SET_VERSION, cols, values, cap_s=5.0)
            latencies.append(time.perf_counter() - t)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await client.close()
    return {
        "rps": len(latencies) / elapsed,
        "rows_per_s": len(latencies) * rows / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


async def run(model_dir: Path | None, rows: int, concurrency: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-") as tmp:
        work = Path(tmp)
        if model_dir is None or current_model(model_dir) is None:
            model_dir = work / "models"
            train(TrainConfig(sessions=1500, hours=2.0, epochs=3), model_dir, progress=lambda _: None)
        results: dict[str, dict[str, float]] = {}
        cold: list[float] = []
        for mode in ("off", "on"):
            proc, addr, cold_s = await _start(model_dir, mode == "on", work / f"inference-{mode}.log")
            cold.append(cold_s)
            try:
                results[mode] = await _load(addr, rows, concurrency, seconds)
            finally:
                proc.terminate()
                proc.wait(10)
    off, on = results["off"], results["on"]
    figures: dict[str, Any] = {"rows_per_request": rows, "concurrency": concurrency}
    for mode, res in results.items():
        for key in ("rps", "p50_ms", "p99_ms"):
            figures[f"batching_{mode}_{key}"] = round(res[key], 3)
    figures["throughput_ratio"] = round(on["rps"] / off["rps"], 3)
    figures["cold_start_s"] = round(min(cold), 3)
    figures["cold_start_max_s"] = round(max(cold), 3)
    return figures


def table(f: dict[str, Any]) -> str:
    return (
        f"recmesh bench inference ({f['concurrency']} concurrent callers, "
        f"{f['rows_per_request']} rows/request)\n"
        f"  batching off  {f['batching_off_rps']:>9.1f} req/s  p50 {f['batching_off_p50_ms']} ms  "
        f"p99 {f['batching_off_p99_ms']} ms\n"
        f"  batching on   {f['batching_on_rps']:>9.1f} req/s  p50 {f['batching_on_p50_ms']} ms  "
        f"p99 {f['batching_on_p99_ms']} ms\n"
        f"  ratio         x{f['throughput_ratio']} throughput\n"
        f"  cold start    {f['cold_start_s']} s (process start -> SERVING, model loaded and warmed; "
        f"worst of 2: {f['cold_start_max_s']} s)"
    )


def main(args: Any) -> int:
    model_dir = Path(args.model_dir) if args.model_dir else None
    figures = asyncio.run(run(model_dir, args.rows, args.concurrency, args.seconds))
    emit(figures, args.json, table(figures))
    return 0
