"""The one percentile recmesh computes over samples, with one convention.

Nearest rank: the p-th percentile of n samples is the sample of rank
⌈p/100 · n⌉ in ascending order (the first for p = 0). It is always a value
that was observed, never one between two samples: a hedge delay, a controller
window's p95 and a benchmark's p99 are latencies that happened.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], p: float, *, ordered: bool = False) -> float:
    """The nearest-rank `p`-th percentile (p in 0..100) of `samples`; NaN for
    none. `ordered`: the samples are already in ascending order (a caller that
    keeps a sorted copy spares the sort)."""
    n = len(samples)
    if n == 0:
        return math.nan
    values = samples if ordered else sorted(samples)
    rank = math.ceil(p * n / 100)  # p * n first: exact for whole p and n (0.07 * 100 is not 7)
    return values[min(n, max(1, rank)) - 1]
