"""Extractive summary by sentence centrality over sentence embeddings.

Each sentence's score is its mean cosine similarity to the other sentences
(the degree centrality of the similarity graph, as in LexRank without the
power iteration); the `k` most central sentences are returned in their
original order, so the summary reads as the text does.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

# A sentence ends at . ! or ? (optionally followed by quotes/brackets) before whitespace, or at a line break.
_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+|\n+")


def split_sentences(text: str, max_sentences: int) -> tuple[list[str], bool]:
    """(sentences, truncated): non-blank sentences, at most `max_sentences`."""
    parts = [p.strip() for p in _SPLIT.split(text)]
    sentences = [p for p in parts if p and any(c.isalnum() for c in p)]
    return sentences[:max_sentences], len(sentences) > max_sentences


def centrality(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Mean cosine similarity of each (unit) row to the other rows."""
    n = matrix.shape[0]
    if n <= 1:
        return np.ones(n)
    sims = matrix.astype(np.float64) @ matrix.T.astype(np.float64)
    np.fill_diagonal(sims, 0.0)
    return np.asarray(sims.sum(axis=1) / (n - 1), dtype=np.float64)


def pick(scores: npt.NDArray[np.float64], k: int) -> list[int]:
    """Indexes of the k best scores (ties: earlier first), in original order."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[: max(1, k)])


def lead(sentences: list[str], k: int) -> list[int]:
    """The fallback when no embeddings can be had: the first k sentences."""
    return list(range(min(max(1, k), len(sentences))))
