"""Repeated, alternating comparisons: the order of configurations per round,
and the median and range of each figure over the rounds.

A shared machine drifts (up to 2x here) between one minute and the next, so
a comparison measured once, A then B, says as much about the drift as about
A and B. Benchmarks that compare configurations run `--repeat N` rounds,
reversing the order every other round (A B, B A, A B, ...), take each round's
ratio, and print the median with the lowest and highest: a ratio whose range
straddles 1 is not a difference.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def round_order(configs: Sequence[T], round_index: int) -> list[T]:
    """The configurations in the order round `round_index` (0-based) runs them:
    as given on even rounds, reversed on odd ones, so neither always goes first."""
    return list(configs) if round_index % 2 == 0 else list(reversed(configs))


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    rounds: int

    def text(self, digits: int = 2, unit: str = "x") -> str:
        if self.rounds == 1:
            return f"{self.median:.{digits}f}{unit}"
        return (
            f"{self.median:.{digits}f}{unit} (range {self.low:.{digits}f}-{self.high:.{digits}f}, "
            f"{self.rounds} rounds)"
        )

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high, "rounds": self.rounds}

    @classmethod
    def of(cls, d: Mapping[str, float]) -> Spread:
        """Back from `as_dict` (figures travel as JSON)."""
        return cls(d["median"], d["low"], d["high"], int(d["rounds"]))


def spread(values: Sequence[float]) -> Spread:
    """Median, lowest and highest of the finite values (NaN where none is)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        nan = float("nan")
        return Spread(nan, nan, nan, 0)
    return Spread(statistics.median(finite), min(finite), max(finite), len(finite))


def spreads(rounds: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Each figure's spread over the rounds (a figure missing from a round is skipped there)."""
    names = dict.fromkeys(name for r in rounds for name in r)
    return {name: spread([r[name] for r in rounds if name in r]) for name in names}
