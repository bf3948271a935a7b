"""Embed the catalog's item texts once and write them in the item-vector format
(recmesh/vectors.py) that the ranker's semantic recall reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from recmesh.embedding.encoder import TextEncoder
from recmesh.modeldir import EMBEDDER_DIR
from recmesh.tools.embedding.export import export
from recmesh.vectors import load_item_vectors, save_item_vectors


def ensure_encoder(model_dir: Path, progress: Callable[[str], None] = print) -> TextEncoder:
    if not (model_dir / EMBEDDER_DIR / "encoder.onnx").exists():
        progress("exporting all-MiniLM-L6-v2 to ONNX from the packaged weights ...")
        export(model_dir)
    return TextEncoder.from_model_dir(model_dir)


def embed_items(
    model_dir: Path,
    texts: dict[str, str],
    batch: int = 64,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Embed `texts` (item_id -> text) and save them; returns the card written."""
    encoder = ensure_encoder(model_dir, progress)
    ids = list(texts)
    started = time.perf_counter()
    parts = [encoder.encode([texts[i] for i in ids[k : k + batch]]) for k in range(0, len(ids), batch)]
    matrix = np.concatenate(parts) if parts else np.zeros((0, encoder.dim), dtype=np.float32)
    seconds = time.perf_counter() - started
    card = {"model": encoder.model, "source": "item title + description", "embed_seconds": round(seconds, 2)}
    save_item_vectors(model_dir, ids, matrix, card)
    progress(f"embedded {len(ids)} item texts in {seconds:.1f} s")
    return card


def ensure_item_vectors(
    model_dir: Path, texts: dict[str, str], progress: Callable[[str], None] = print
) -> None:
    """Embed the items when no vectors exist (what `recmesh up` calls after training)."""
    if load_item_vectors(model_dir) is None:
        embed_items(model_dir, texts, progress=progress)
