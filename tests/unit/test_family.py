"""The embedding model family: ONNX exports match the NumPy model per variant,
training is deterministic, prefixes and masks really shrink each variant."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from recmesh.features.vectorize import CATEGORY_VOCAB, COLUMNS, ITEM_BUCKETS
from recmesh.training.family import (
    LEVEL1_DENSE,
    VARIANTS,
    auc,
    to_onnx,
    train_family,
    variant_weights,
)


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows in COLUMNS layout: dense noise, valid ids and category shares; the
    label depends on a dense column and on the user's share of the item's category."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, len(COLUMNS))).astype(np.float32)
    cats = rng.integers(0, len(CATEGORY_VOCAB), n)
    x[:, COLUMNS.index("i_id_bucket")] = rng.integers(0, ITEM_BUCKETS, n)
    x[:, COLUMNS.index("i_category_index")] = cats
    shares = rng.dirichlet(np.ones(len(CATEGORY_VOCAB)), n).astype(np.float32)
    x[:, COLUMNS.index("u_intent_unknown") :] = shares
    match = shares[np.arange(n), cats]
    logit = 3 * (x[:, COLUMNS.index("i_ctr_10m")] - 0.5) + 8 * (match - match.mean())
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return x, y


def test_auc_matches_definition() -> None:
    y = np.array([0, 0, 1, 1], np.float32)
    assert auc(y, np.array([0.1, 0.4, 0.35, 0.8], np.float32)) == 0.75
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5], np.float32)) == 0.5


def test_training_is_deterministic_and_every_export_matches_numpy() -> None:
    x, y = synthetic(3000, 0)
    a = train_family(x, y, epochs=2, seed=3)
    b = train_family(x, y, epochs=2, seed=3)
    for key, value in a.params.items():
        assert np.array_equal(value, b.params[key]), key
    probe = x[:64].copy()
    probe[0, COLUMNS.index("i_id_bucket")] = 1e9  # out-of-range ids are clipped, never an error
    for variant in VARIANTS:
        session = ort.InferenceSession(
            to_onnx(a, variant).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        got = session.run(None, {"features": probe})[0]
        assert got.shape == (64,)
        np.testing.assert_allclose(got, a.predict(probe, variant), rtol=1e-4, atol=1e-5)
    assert auc(y, a.predict(x, VARIANTS[0])) > 0.65  # learns the planted signal (chance is 0.5)


def test_variants_carry_only_what_they_use() -> None:
    x, y = synthetic(500, 1)
    model = train_family(x, y, epochs=1)
    full, sampled, small, nocross = (variant_weights(model, v) for v in VARIANTS)
    assert full["e_item"].shape == (ITEM_BUCKETS, 128) and small["e_item"].shape == (ITEM_BUCKETS, 64)
    assert nocross["e_item"].shape == (ITEM_BUCKETS, 16) and "u_cat" not in nocross
    assert sampled["w_dense"].shape[0] == len(LEVEL1_DENSE) == full["w_dense"].shape[0] // 2
    # A prefix is a slice of the one trained table, not a separate model.
    assert np.array_equal(small["e_item"], full["e_item"][:, :64])
