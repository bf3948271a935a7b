"""The model directory layout, shared by training and serving (no heavy imports,
so the inference service starts fast).

    MODEL_DIR/<name>/CURRENT            names the served version
    MODEL_DIR/<name>/<version>/
        card.json                       model card; "variants" lists every file below
        model.onnx                      level 0: the full model
        model-l1.onnx                   level 1: feature sampling (half the dense columns, IDs kept)
        model-l2.onnx                   level 2: level 1 with 64-d embedding prefixes
        model-l3.onnx                   level 3: level 2 at 16-d, no cross features

Every variant reads the same input (the card's columns) and writes one score
per row; a version is served only as a whole (all its variants load before
CURRENT takes effect). A version without some variant files (an older export)
serves the nearest available level below the requested one, and says so.
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_NAME = "ctr"
# The sentence encoder: MODEL_DIR/embedder/{encoder.onnx, tokenizer.json, card.json}
# (written by recmesh.tools.embedding.export, read by recmesh.embedding.encoder).
EMBEDDER_DIR = "embedder"
ENCODER_FILE = "encoder.onnx"
LEVELS = (0, 1, 2, 3)


def variant_file(level: int) -> str:
    return "model.onnx" if level == 0 else f"model-l{level}.onnx"


def current_model(model_dir: Path, name: str = MODEL_NAME) -> Path | None:
    pointer = model_dir / name / "CURRENT"
    if not pointer.exists():
        return None
    path = model_dir / name / pointer.read_text().strip()
    return path if (path / variant_file(0)).exists() and (path / "card.json").exists() else None


def point_current(model_dir: Path, version: str, name: str = MODEL_NAME) -> Path:
    """Point CURRENT at `version` (a version directory with its card and level-0 model:
    FileNotFoundError otherwise), atomically: a follower never reads half a name."""
    path = model_dir / name / version
    if not ((path / variant_file(0)).exists() and (path / "card.json").exists()):
        raise FileNotFoundError(f"{path} holds no model version (card.json and {variant_file(0)})")
    pointer = model_dir / name / "CURRENT"
    tmp = pointer.with_name(f".CURRENT.{os.getpid()}.tmp")  # a writer of its own: no two share one
    tmp.write_text(version + "\n")
    tmp.replace(pointer)
    return path
