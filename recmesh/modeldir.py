"""The model directory layout, shared by training and serving (no heavy imports,
so the inference service starts fast).

MODEL_DIR/<name>/<version>/{model.onnx, card.json}; MODEL_DIR/<name>/CURRENT
names the served version.
"""

from __future__ import annotations

from pathlib import Path

MODEL_NAME = "ctr"


def current_model(model_dir: Path, name: str = MODEL_NAME) -> Path | None:
    pointer = model_dir / name / "CURRENT"
    if not pointer.exists():
        return None
    path = model_dir / name / pointer.read_text().strip()
    return path if (path / "model.onnx").exists() and (path / "card.json").exists() else None
