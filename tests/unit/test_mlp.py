from __future__ import annotations

import numpy as np
import onnxruntime as ort

from recmesh.training.mlp import auc, to_onnx, train_mlp


def test_auc_matches_definition() -> None:
    y = np.array([0, 0, 1, 1], np.float32)
    assert auc(y, np.array([0.1, 0.4, 0.35, 0.8], np.float32)) == 0.75
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5], np.float32)) == 0.5


def test_training_is_deterministic_and_onnx_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 5)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.standard_normal(2000) * 0.5 > 0).astype(np.float32)
    a = train_mlp(x, y, hidden=8, epochs=60, seed=3)
    b = train_mlp(x, y, hidden=8, epochs=60, seed=3)
    assert np.array_equal(a.w1, b.w1)
    assert auc(y, a.predict(x)) > 0.85
    session = ort.InferenceSession(to_onnx(a).SerializeToString(), providers=["CPUExecutionProvider"])
    onnx_scores = session.run(None, {"features": x[:50]})[0]
    assert onnx_scores.shape == (50,)
    np.testing.assert_allclose(onnx_scores, a.predict(x[:50]), rtol=1e-4, atol=1e-5)
