"""Pure summarize policies: sentence split and centrality."""

from __future__ import annotations

import numpy as np

from recmesh.aitools import summarize


def test_split_sentences_keeps_order_and_caps() -> None:
    text = 'First one. Second one! "Third?" he asked.\nFourth line\n\n...'
    sentences, truncated = summarize.split_sentences(text, 10)
    assert sentences == ["First one.", "Second one!", '"Third?"', "he asked.", "Fourth line"]
    assert not truncated
    assert summarize.split_sentences(text, 2) == (["First one.", "Second one!"], True)


def test_centrality_picks_the_central_sentences_in_text_order() -> None:
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.9, 0.1, 0.0])
    outlier = np.array([0.0, 0.0, 1.0])
    matrix = np.stack([outlier, a, b, a]).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    scores = summarize.centrality(matrix)
    assert int(np.argmin(scores)) == 0
    assert summarize.pick(scores, 2) == [1, 3]
    assert summarize.pick(summarize.centrality(matrix[:1]), 3) == [0]
    assert summarize.lead(["x", "y", "z"], 2) == [0, 1]
