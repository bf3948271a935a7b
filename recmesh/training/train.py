"""Build point-in-time rows from demo events, train, evaluate, export.

Every degradation variant of the model family (recmesh.training.family) is
exported into one version directory (layout: recmesh.modeldir). The model card
(card.json) records the version, the feature set it expects, its input schema,
the training data range, AUC on a time-based holdout for the full model and
for the same family trained without real-time features (so the lift from
real-time features is measured), and per variant: level, file, what it keeps,
weight bytes and holdout AUC.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.demo.generate import generate_events, make_catalog
from recmesh.features.backfill import training_examples
from recmesh.features.definitions import FEATURE_SET_VERSION
from recmesh.features.vectorize import COLUMNS, item_columns
from recmesh.modeldir import MODEL_NAME, variant_file
from recmesh.training.family import (
    OFFLINE_ONLY,
    PREFIX_DIMS,
    TRAINED,
    VARIANTS,
    Variant,
    auc,
    to_onnx,
    train_family,
    weight_bytes,
)

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 42
    sessions: int = 6000
    hours: float = 4.0
    epochs: int = 4  # passes over the training rows (mini-batch Adam)
    hidden: int = 32  # MLP hidden units (model size)
    holdout_fraction: float = 0.2
    # Training data ends this long before "now" (the demo start time is fixed
    # for determinism: 2026-01-01T00:00:00Z).
    start_ms: int = 1_767_225_600_000
    # Leakage control: move impression units to random times (see shuffle_event_times).
    shuffle_times: bool = False


def shuffle_event_times(events: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The leakage control: every impression unit (a view and the click, cart
    and purchase that follow it) moves, intact, to a random time in the same
    range. Labels survive; the temporal structure the real-time features
    exploit (session interest, trending items) does not."""
    rng = np.random.default_rng(seed)
    units: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        units.setdefault(e["event_id"][:-1], []).append(e)  # ids end in v/c/a/p per step
    lo = min(e["event_time"] for e in events)
    hi = max(e["event_time"] for e in events)
    out: list[dict[str, Any]] = []
    for unit in units.values():
        base = unit[0]["event_time"]
        start = int(rng.integers(lo, hi))
        out.extend({**e, "event_time": start + e["event_time"] - base} for e in unit)
    out.sort(key=lambda e: (e["event_time"], e["event_id"]))
    return out


def build_dataset(cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    catalog = make_catalog()
    duration = int(cfg.hours * HOUR_MS)
    events: Iterable[dict[str, Any]] = generate_events(
        catalog, cfg.start_ms, duration, cfg.sessions, seed=cfg.seed
    )
    if cfg.shuffle_times:
        events = shuffle_event_times(list(events), cfg.seed)
    users = {u["user_id"]: u for u in catalog.users}
    items = {i["item_id"]: i for i in catalog.items}
    rows, labels, times = [], [], []
    for ex in training_examples(events, users, items):
        rows.append(item_columns(ex.user, ex.item, ex.item_id))
        labels.append(ex.label)
        times.append(ex.as_of_ms)
    return np.array(rows, np.float32), np.array(labels, np.float32), np.array(times, np.int64)


def train(cfg: TrainConfig, model_dir: Path, progress: Callable[[str], None] = print) -> dict[str, Any]:
    started = time.perf_counter()
    progress(f"building point-in-time rows ({cfg.sessions} sessions over {cfg.hours} h) ...")
    x, y, t = build_dataset(cfg)
    split = int(np.quantile(t, 1 - cfg.holdout_fraction))
    tr, ho = t <= split, t > split
    progress(
        f"{len(y)} rows, positive rate {y.mean():.3f}; holdout = last {cfg.holdout_fraction:.0%} by time"
    )
    progress(f"training the model family ({len(TRAINED)} configurations, summed loss) ...")
    family = train_family(x[tr], y[tr], hidden=cfg.hidden, epochs=cfg.epochs, seed=cfg.seed)
    variant_auc = {v.level: auc(y[ho], family.predict(x[ho], v)) for v in VARIANTS}
    for v in VARIANTS:
        progress(f"  level {v.level} ({v.describe()}): holdout AUC {variant_auc[v.level]:.4f}")
    level1 = VARIANTS[1]
    prefix_auc = {
        d: auc(y[ho], family.predict(x[ho], Variant(1, level1.dense, d, True))) for d in PREFIX_DIMS
    }
    progress("  level 1 at embedding prefixes " + ", ".join(f"{d}: {a:.4f}" for d, a in prefix_auc.items()))
    auc_full = variant_auc[0]
    progress("training baseline (same family, offline features only) ...")
    base = train_family(x[tr], y[tr], (OFFLINE_ONLY,), hidden=cfg.hidden, epochs=cfg.epochs, seed=cfg.seed)
    auc_base = auc(y[ho], base.predict(x[ho], OFFLINE_ONLY))
    progress(f"  holdout AUC {auc_base:.4f}")

    blobs = {v.level: to_onnx(family, v).SerializeToString() for v in VARIANTS}
    digest = hashlib.sha256(b"".join(blobs[level] for level in sorted(blobs))).hexdigest()[:12]
    version = f"{MODEL_NAME}-{digest}"
    out = model_dir / MODEL_NAME / version
    out.mkdir(parents=True, exist_ok=True)
    for level, blob in blobs.items():
        (out / variant_file(level)).write_bytes(blob)
    card: dict[str, Any] = {
        "name": MODEL_NAME,
        "version": version,
        "feature_set_version": FEATURE_SET_VERSION,
        "input": {"name": "features", "columns": list(COLUMNS)},
        "output": {"name": "score", "meaning": "P(click within 10 s of the impression)"},
        "training_data": {
            # What regenerates these rows (demo events): recmesh bench degrade rebuilds the holdout.
            "demo": {
                "seed": cfg.seed,
                "sessions": cfg.sessions,
                "hours": cfg.hours,
                "start_ms": cfg.start_ms,
                "shuffle_times": cfg.shuffle_times,
            },
            "from_ms": int(t.min()),
            "to_ms": int(t.max()),
            "rows": len(y),
            "holdout_rows": int(ho.sum()),
            "holdout_from_ms": int(split) + 1,
            "positive_rate": round(float(y.mean()), 4),
        },
        "metrics": {
            "auc_holdout": round(auc_full, 4),
            "auc_holdout_offline_only": round(auc_base, 4),
            "auc_lift_from_realtime": round(auc_full - auc_base, 4),
            "auc_holdout_level1_by_embedding_dim": {str(d): round(a, 4) for d, a in prefix_auc.items()},
        },
        "variants": [
            {
                "level": v.level,
                "file": variant_file(v.level),
                "dense_columns": list(v.dense),
                "embedding_dim": v.dim,
                "cross_features": v.cross,
                "weight_bytes": weight_bytes(family, v),
                "file_bytes": len(blobs[v.level]),
                "auc_holdout": round(variant_auc[v.level], 4),
            }
            for v in VARIANTS
        ],
        "seed": cfg.seed,
        "train_seconds": round(time.perf_counter() - started, 2),
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (model_dir / MODEL_NAME / "CURRENT").write_text(version + "\n")
    progress(f"exported {len(VARIANTS)} variants to {out} in {card['train_seconds']} s")
    return card
