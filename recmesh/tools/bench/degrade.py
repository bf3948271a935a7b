"""`recmesh bench degrade`: the design notes' degradation table for recmesh.

For every level variant of one model version: holdout AUC and its change
against level 0 (the time-based holdout of the model card, rebuilt from the
card's demo configuration and scored by the exported ONNX files themselves),
p50/p99 scoring latency of `rows`-row requests in process (ONNX Runtime
session, as the service configures it) and over gRPC (the inference service
as its own process, default settings, one caller), and memory: ONNX file
bytes, and the resident-set growth of a fresh process while the variant's
session is created and warmed (one process per variant; the runtime's
one-time initialisation is paid beforehand on a trivial model, so it is
charged to no level).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from recmesh.clients.inference import InferenceClient
from recmesh.errors import FailedPrecondition
from recmesh.features.repository import FeatureSet, configured_feature_set
from recmesh.features.vectorize import transforms_from_card
from recmesh.modeldir import current_model
from recmesh.settings import CommonSettings, InferenceSettings
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit, plaintext_unless_set
from recmesh.tools.bench.inference import Config, start_service
from recmesh.tools.training.family import auc
from recmesh.tools.training.train import TrainConfig, build_dataset, demo_dataset, train
from services.inference.model import load, load_variant, session_options


def _rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def session_memory_child(path: str, level: int, width: int) -> None:
    """Runs in a fresh process: prints the RSS growth of one variant's session."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    trivial = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "warm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    trivial.ir_version = 8
    warm = ort.InferenceSession(
        trivial.SerializeToString(), session_options(), providers=["CPUExecutionProvider"]
    )
    warm.run(None, {"x": np.zeros(1, np.float32)})
    before = _rss_bytes()
    variant = load_variant(Path(path), level, "features", width, session_options())
    variant.score(np.zeros((200, width), np.float32))
    print(_rss_bytes() - before)


def session_memory(path: Path, level: int, width: int) -> int:
    code = (
        "from recmesh.tools.bench.degrade import session_memory_child as m; "
        f"m({str(path)!r}, {level}, {width})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout.strip().splitlines()[-1])


def holdout(card: dict[str, Any], feature_set: FeatureSet) -> tuple[np.ndarray, np.ndarray]:
    """The card's time-based holdout, rebuilt from what it was trained on (the
    demo generator's configuration, or the event log and catalog files) with
    the model's own inputs."""
    data = card["training_data"]
    if card["feature_set_version"] != feature_set.version:
        raise FailedPrecondition(
            f"model {card['version']} was built on {card['feature_set_version']}, the repository "
            f"{feature_set.path} is {feature_set.version}: point RECMESH_REPOSITORY at the one it was "
            "trained with"
        )
    transforms = transforms_from_card(card["input"]["transforms"])
    if "demo" in data:
        demo = data["demo"]
        cfg = TrainConfig(seed=demo["seed"], sessions=demo["sessions"], hours=demo["hours"],
                          start_ms=demo["start_ms"], shuffle_times=demo["shuffle_times"])  # fmt: skip
        ds = demo_dataset(feature_set, cfg, transforms)
    else:
        from recmesh.features.eventlog import sorted_events
        from recmesh.features.tabular import read_catalog

        users, items = read_catalog(feature_set, data.get("users"), data.get("items"))
        ds = build_dataset(
            feature_set,
            sorted_events(Path(data["events"]), feature_set.event_schema),
            users,
            items,
            transforms,
        )
    ho = ds.t >= data["holdout_from_ms"]
    return ds.x[ho], ds.y[ho]


def in_process(path: Path, x: np.ndarray, rows: int, repeats: int) -> dict[int, dict[str, float]]:
    model = load(path)
    batch = np.ascontiguousarray(x[:rows])
    out: dict[int, dict[str, float]] = {}
    for level, variant in sorted(model.variants.items()):
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            variant.score(batch)
            samples.append(time.perf_counter() - t)
        out[level] = {
            "p50_ms": percentile(samples, 50) * 1000,
            "p99_ms": percentile(samples, 99) * 1000,
            "session_rss_bytes": float(session_memory(path, level, x.shape[1])),
            "file_bytes": float(variant.file_bytes),
        }
    return out


async def over_grpc(
    model_dir: Path, card: dict[str, Any], x: np.ndarray, rows: int, repeats: int, work: Path
) -> dict[int, dict[str, float]]:
    proc, addr, _, _ = await start_service(
        model_dir, Config(InferenceSettings().batching), work / "inference.log", rows
    )
    client = InferenceClient(addr, "bench")
    cols = list(card["input"]["columns"])
    values = np.ascontiguousarray(x[:rows]).ravel().tolist()
    out: dict[int, dict[str, float]] = {}
    try:
        for variant in card["variants"]:
            level = int(variant["level"])
            samples = []
            for i in range(repeats + 20):
                t = time.perf_counter()
                reply = await client.score(card["feature_set_version"], cols, values, level=level, cap_s=5.0)
                if i >= 20:  # the first calls warm the channel
                    samples.append(time.perf_counter() - t)
                if reply.level != level:
                    raise RuntimeError(f"asked for level {level}, served {reply.level}")
            out[level] = {"p50_ms": percentile(samples, 50) * 1000, "p99_ms": percentile(samples, 99) * 1000}
    finally:
        await client.close()
        proc.terminate()
        proc.wait(10)
    return out


async def run(model_dir: Path | None, rows: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recmesh-bench-") as tmp:
        work = Path(tmp)
        path = current_model(model_dir) if model_dir is not None else None
        feature_set = configured_feature_set(CommonSettings().repository)
        if model_dir is None or path is None:
            model_dir = work / "models"
            train(TrainConfig(), model_dir, feature_set, progress=lambda _: None)
            path = current_model(model_dir)
        assert path is not None
        card: dict[str, Any] = json.loads((path / "card.json").read_text())
        x, y = holdout(card, feature_set)
        local = in_process(path, x, rows, repeats)
        remote = await over_grpc(model_dir, card, x, rows, repeats, work)
        model = load(path)
    levels = []
    base_auc = base_bytes = base_rss = 0.0
    for variant in card["variants"]:
        level = int(variant["level"])
        score = auc(y, model.variant(level).score(x))
        if level == 0:
            base_auc, base_bytes, base_rss = score, local[0]["file_bytes"], local[0]["session_rss_bytes"]
        levels.append({
            "level": level,
            "embedding_dim": variant["embedding_dim"],
            "dense_columns": len(variant["dense_columns"]),
            "cross_features": variant["cross_features"],
            "auc": round(score, 4),
            "auc_change": round(score - base_auc, 4),
            "auc_change_pct": round(100 * (score - base_auc) / base_auc, 2),
            "p50_ms_in_process": round(local[level]["p50_ms"], 3),
            "p99_ms_in_process": round(local[level]["p99_ms"], 3),
            "p50_ms_grpc": round(remote[level]["p50_ms"], 3),
            "p99_ms_grpc": round(remote[level]["p99_ms"], 3),
            "file_bytes": int(local[level]["file_bytes"]),
            "file_saved_pct": round(100 * (1 - local[level]["file_bytes"] / base_bytes), 1),
            "session_rss_bytes": int(local[level]["session_rss_bytes"]),
            "session_rss_saved_pct": round(100 * (1 - local[level]["session_rss_bytes"] / base_rss), 1)
            if base_rss
            else None,
        })  # fmt: skip
    return {"model_version": card["version"], "rows_per_request": rows, "holdout_rows": len(y),
            "repeats": repeats, "levels": levels}  # fmt: skip


def table(f: dict[str, Any]) -> str:
    lines = [
        f"recmesh bench degrade (model {f['model_version']}, {f['holdout_rows']} holdout rows, "
        f"{f['rows_per_request']}-row requests x {f['repeats']})",
        "  level  dim  dense  cross    AUC   change   in-process p50/p99    gRPC p50/p99       model bytes  "
        "saved  session RSS  saved",
    ]
    for r in f["levels"]:
        rss_saved = "n/a" if r["session_rss_saved_pct"] is None else f"{r['session_rss_saved_pct']:.0f}%"
        lines.append(
            f"  {r['level']:>5}  {r['embedding_dim']:>3}  {r['dense_columns']:>5}  "
            f"{'yes' if r['cross_features'] else 'no':>5}  {r['auc']:.4f}  {r['auc_change_pct']:+.2f}%  "
            f"{r['p50_ms_in_process']:>6.3f}/{r['p99_ms_in_process']:<7.3f} ms  "
            f"{r['p50_ms_grpc']:>5.2f}/{r['p99_ms_grpc']:<6.2f} ms  {r['file_bytes']:>11,}  "
            f"{r['file_saved_pct']:>4.0f}%  {r['session_rss_bytes']:>11,}  {rss_saved:>5}"
        )
    return "\n".join(lines)


def main(args: Any) -> int:
    plaintext_unless_set()
    model_dir = Path(args.model_dir) if args.model_dir else InferenceSettings().model_dir
    figures = asyncio.run(run(model_dir, args.rows, args.repeats))
    emit(figures, args.json, table(figures))
    return 0
