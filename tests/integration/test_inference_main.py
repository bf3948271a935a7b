"""`python -m services.inference` as a process: the start-up order (Score is
SERVING before the text models are in), the cold-start log line, and a failed
text-model load stopping the process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recmesh.clients.base import HealthProbe
from recmesh.clients.inference import InferenceClient
from services.inference.server import TEXT_HEALTH_NAME
from tests.helpers import card_schema, free_port, own_model_dir, poll_until


def _spawn(model_dir: Path, log: Path, **extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, INFERENCE_PORT=str(port), INFERENCE_METRICS_PORT=str(free_port()),
               RECMESH_MODEL_DIR=str(model_dir), RECMESH_LOG_LEVEL="INFO", **extra)  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.inference"], env=env, stdout=out, stderr=out)
    return proc, f"127.0.0.1:{port}"


def _events(log: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return {str(r["event"]): r for r in rows}


async def test_serving_then_text_models(model_dir: Path, embed_model_dir: Path, tmp_path: Path) -> None:
    own = own_model_dir(model_dir, embed_model_dir, tmp_path / "models")
    log = tmp_path / "inference.log"
    proc, addr = _spawn(own, log, RECMESH_TEXT_BACKEND="onnx")
    probe, client = HealthProbe(addr), InferenceClient(addr, "test")
    try:
        await poll_until(probe.serving, "inference SERVING", timeout=60, interval=0.01)
        version, columns = card_schema(own)
        rows = np.random.default_rng(0).random((4, len(columns))).astype(np.float32).ravel().tolist()
        scored = await client.score(version, columns, rows, cap_s=5)
        assert len(scored.scores) == 4 and scored.model_version.startswith("ctr-")
        await poll_until(lambda: probe.serving(service=TEXT_HEALTH_NAME), "text models loaded", timeout=60)
        assert (await client.embed(["a text"], cap_s=10)).matrix.shape == (1, 384)
        events = _events(log)
        cold, loaded = events["cold_start"], events["text_models_loaded"]
        # Counted from process start (interpreter and imports included), not from main().
        assert cold["seconds"] > cold["after_imports_s"] > 0
        assert cold["timestamp"] < loaded["timestamp"], "SERVING comes before the text models"
    finally:
        await probe.close()
        await client.close()
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, log.read_text()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
async def test_failed_text_model_load_stops_the_process(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "inference.log"
    proc, _ = _spawn(model_dir, log, RECMESH_TEXT_BACKEND="vllm")  # asked for, not installed
    try:
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0
    events = _events(log)
    assert "vllm" in events["text_models_failed"]["error"], log.read_text()
    assert "stopped" in events, "the server stops cleanly before the process exits"
