"""Outcomes added up per group, and read back as means with confidence intervals.

A group is (model version, degradation level, SLO class, arm). Per group the
sums are kept as flat fields (one Redis hash per time bucket holds them, so
adding an answer is a handful of HINCRBYFLOATs and any window is the sum of
its buckets): `n` answers, and per figure its sum and sum of squares (the
interval needs them), `auc_n` answers with an AUC, `clicks` credited items,
`p<k>` credits at position k. A shadow model's answers are a group of their own
(arm `shadow`) with `n` and the AUC fields only: it decided no order, so it
earned no clicks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from recmesh.evaluation.impression import Group, Shown
from recmesh.evaluation.outcome import Outcome

SEP = "\x1f"  # between a field's group parts and its figure
DIMENSIONS = ("model_version", "ladder", "slo_class", "arm")
FIGURES = ("ctr", "hit", "ndcg", "auc")
SHADOW = "shadow"
Z95 = 1.959963984540054


def _field(group: Group, name: str) -> str:
    return SEP.join((group.model_version, group.ladder, group.slo_class, group.arm, name))


def increments(shown: Shown, served: Outcome, shadow: Outcome | None) -> list[tuple[str, float]]:
    """The (field, amount) pairs one finalised answer adds."""
    g = shown.group
    out = [(_field(g, "n"), 1.0), (_field(g, "clicks"), float(len(served.positions)))]
    for name in ("ctr", "hit", "ndcg"):
        value = getattr(served, name)
        out += [(_field(g, name), value), (_field(g, name + "2"), value * value)]
    out += [(_field(g, f"p{p}"), 1.0) for p in served.positions]
    out += _auc_fields(g, served.auc)
    if shadow is not None and shown.shadow is not None:
        sg = Group(shown.shadow.model_version, g.ladder, g.slo_class, SHADOW)
        out += [(_field(sg, "n"), 1.0), *_auc_fields(sg, shadow.auc)]
    return [(f, v) for f, v in out if v != 0.0]


def _auc_fields(group: Group, value: float | None) -> list[tuple[str, float]]:
    if value is None:
        return []
    return [
        (_field(group, "auc_n"), 1.0),
        (_field(group, "auc"), value),
        (_field(group, "auc2"), value * value),
    ]


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    half_width: float  # of the 95% interval (normal approximation)
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        """{mean, ci95 (None: one answer gives no interval), n}: valid JSON (no Infinity)."""
        return {
            "mean": self.mean,
            "ci95": None if math.isinf(self.half_width) else self.half_width,
            "n": self.n,
        }

    def __str__(self) -> str:
        if math.isinf(self.half_width):
            return f"{self.mean:.4f} ± —"  # one answer: no interval
        return f"{self.mean:.4f} ± {self.half_width:.4f}"


def variance(total: float, squares: float, n: float) -> float:
    """The sample variance of n values from their sum and sum of squares (0 below two values)."""
    if n <= 1:
        return 0.0
    mean = total / n
    return max(0.0, squares - n * mean * mean) / (n - 1)


def estimate(total: float, squares: float, n: float) -> Estimate | None:
    if n <= 0:
        return None
    var = variance(total, squares, n)
    return Estimate(total / n, Z95 * math.sqrt(var / n) if n > 1 else math.inf, int(n))


@dataclass(frozen=True)
class Row:
    """One group's figures (dimensions not grouped by are "*")."""

    key: tuple[str, ...]
    sums: dict[str, float]

    @property
    def answers(self) -> int:
        return int(self.sums.get("n", 0))

    def figure(self, name: str) -> Estimate | None:
        n = self.sums.get("auc_n", 0.0) if name == "auc" else self.sums.get("n", 0.0)
        if name != "auc" and self.key[DIMENSIONS.index("arm")] == SHADOW:
            return None  # a shadow decided no order: only its AUC means something
        return estimate(self.sums.get(name, 0.0), self.sums.get(name + "2", 0.0), n)

    def position_ctr(self, position: int) -> float:
        return self.sums.get(f"p{position}", 0.0) / max(1.0, self.sums.get("n", 0.0))


def rows(fields: Mapping[str, float], by: Iterable[str] = DIMENSIONS) -> list[Row]:
    """The summed fields, grouped by the dimensions `by` (others merged), largest first.
    A shadow arm is never merged with served ones."""
    keep = [DIMENSIONS.index(d) for d in by]
    arm = DIMENSIONS.index("arm")
    merged: dict[tuple[str, ...], dict[str, float]] = {}
    for name, value in fields.items():
        *parts, figure = name.split(SEP)
        if len(parts) != len(DIMENSIONS):
            continue
        key = tuple(p if i in keep or (i == arm and p == SHADOW) else "*" for i, p in enumerate(parts))
        sums = merged.setdefault(key, {})
        sums[figure] = sums.get(figure, 0.0) + value
    return sorted((Row(k, v) for k, v in merged.items()), key=lambda r: (-r.answers, r.key))


def add(into: dict[str, float], fields: Mapping[str, float]) -> dict[str, float]:
    for name, value in fields.items():
        into[name] = into.get(name, 0.0) + value
    return into
