"""The ONNX sentence encoder against sentence-transformers' own output.

tests/data/minilm_reference.json holds the token ids and embeddings that
sentence-transformers 6.3 (torch 2.13 CPU) produced from the same packaged
weights (scripts/make_minilm_reference.py). Tolerance: cosine > 0.99999 and
max absolute difference < 1e-5 per component (measured: ~2e-7).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recmesh.embedding.encoder import TextEncoder
from recmesh.embedding.weights import packaged_model_dir, read_config, read_safetensors
from recmesh.modeldir import EMBEDDER_DIR

REFERENCE = json.loads((Path(__file__).parents[3] / "data" / "minilm_reference.json").read_text())


@pytest.fixture(scope="module")
def encoder(embed_model_dir: Path) -> TextEncoder:
    return TextEncoder.from_model_dir(embed_model_dir)


def test_packaged_weights_are_minilm() -> None:
    src = packaged_model_dir()
    cfg = read_config(src)
    assert (cfg.hidden, cfg.heads, cfg.layers, cfg.max_seq_length) == (384, 12, 6, 256)
    tensors = read_safetensors(src / "model.safetensors")
    assert tensors["embeddings.word_embeddings.weight"].shape == (30522, 384)


def test_tokenizer_matches_the_reference(encoder: TextEncoder) -> None:
    encoded = encoder.tokenize(REFERENCE["sentences"])
    for row, ids in enumerate(REFERENCE["input_ids"]):
        assert encoded.input_ids[row, : len(ids)].tolist() == ids
        assert encoded.attention_mask[row].sum() == len(ids)


def test_embeddings_match_sentence_transformers(encoder: TextEncoder) -> None:
    got = encoder.encode(REFERENCE["sentences"])
    ref = np.asarray(REFERENCE["embeddings"], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    assert got.shape == ref.shape
    cosine = (got * ref).sum(axis=1)
    assert cosine.min() > 0.99999, cosine
    assert np.abs(got - ref).max() < 1e-5


def test_padding_does_not_change_a_vector(encoder: TextEncoder) -> None:
    short, long = "x", REFERENCE["sentences"][-1]
    alone = encoder.encode([short])[0]
    in_batch = encoder.encode([long, short])[1]
    assert np.abs(alone - in_batch).max() < 1e-5
    np.testing.assert_allclose(np.linalg.norm(encoder.encode([long, short]), axis=1), 1.0, atol=1e-5)


def test_truncates_to_the_model_limit(encoder: TextEncoder) -> None:
    assert encoder.count_tokens("word " * 1000) == 256
    assert encoder.encode(["word " * 1000]).shape == (1, 384)


def test_empty_batch_and_missing_export(encoder: TextEncoder, tmp_path: Path) -> None:
    assert encoder.encode([]).shape == (0, 384)
    with pytest.raises(FileNotFoundError, match="recmesh embed export"):
        TextEncoder(tmp_path / EMBEDDER_DIR)


def test_similar_texts_are_closer(encoder: TextEncoder) -> None:
    a, b, c = encoder.encode(["wireless headphones", "bluetooth earbuds", "vegetarian cookbook"])
    assert float(a @ b) > float(a @ c) + 0.2
