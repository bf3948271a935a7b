"""The guard's decision, pure: promote a running experiment's candidate, roll it back, or wait.

What is compared (the sums of the minutes since the experiment started,
recmesh/evaluation/sums.py fields), on the metric `[evaluation.guard]` names:
- a model on a share of users: the `candidate` arm against the `control` arm,
  every model version, degradation level and SLO class of each arm merged;
- a model at share 0 with shadow scoring: the candidate's shadow rows (arm
  `shadow`, its model version) against the `control` arm, on AUC only (a shadow
  decided no order, so it earned no clicks: another metric is replaced by AUC,
  and the reason says so). The comparison leans the shadow's way: control's
  model chose the items (its highest scores), so its own scores spread least
  over them, and a weaker shadow can order them better — measured on
  MovieLens, where the offline-only baseline as a shadow beat the model that
  chose the list, 0.551 against 0.518, and the model as a shadow beat the
  baseline, 0.558 against 0.540 (docs/operations.md). So a shadow is only
  ever rolled back (worse even so) or validated, never promoted: serving it
  to a share decides;
- a degradation level: the `level:<n>` arm against `control`.

The test (Welch, normal approximation): d = mean(candidate) - mean(control),
se = sqrt(var_1/n_1 + var_0/n_0) from the sums of squares, z the one-sided
quantile of `confidence`. With `min_answers` answers carrying the metric in
each arm: roll back when d + z*se < -max_drop (confidently worse by more than
max_drop); promote when d - z*se > -max_drop (confidently not worse by more
than max_drop: non-inferiority). Still undecided when the candidate has
`max_answers` answers with the metric: roll back, keeping what is known.
Otherwise wait.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from recmesh.evaluation.experiment import Experiment
from recmesh.evaluation.impression import CONTROL
from recmesh.evaluation.sums import DIMENSIONS, SHADOW, Estimate, add, estimate, rows, variance
from recmesh.features.repository import Guard, GuardMetric

Verdict = Literal["promote", "rollback", "wait"]

_VERSION, _ARM = DIMENSIONS.index("model_version"), DIMENSIONS.index("arm")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    metric: GuardMetric  # the figure compared (AUC for a shadow, whatever the guard names)
    control: Estimate | None  # None: no answer with the metric
    candidate: Estimate | None
    difference: float | None = None  # candidate mean - control mean
    lower: float | None = None  # one-sided lower bound of the difference at the confidence
    upper: float | None = None  # one-sided upper bound


def shadow_only(experiment: Experiment) -> bool:
    """A candidate model no user is served: only its shadow scores of control answers tell."""
    return experiment.kind == "model" and experiment.share <= 0


Sums = dict[str, float]


def arm_sums(experiment: Experiment, fields: Mapping[str, float]) -> tuple[Sums, Sums]:
    """The summed fields of the control arm and of the candidate's (module docstring)."""
    control: Sums = {}
    candidate: Sums = {}
    shadow = shadow_only(experiment)
    for row in rows(fields, by=("model_version", "arm")):
        version, arm = row.key[_VERSION], row.key[_ARM]
        if shadow:
            candidates = arm == SHADOW and version == experiment.candidate
        else:
            candidates = arm == experiment.arm_name
        if arm == CONTROL:
            add(control, row.sums)
        elif candidates:
            add(candidate, row.sums)
    return control, candidate


def _figure(sums: Mapping[str, float], metric: str) -> tuple[Estimate | None, float]:
    """The arm's estimate of the metric and its sample variance."""
    n = sums.get("auc_n" if metric == "auc" else "n", 0.0)
    total, squares = sums.get(metric, 0.0), sums.get(metric + "2", 0.0)
    return estimate(total, squares, n), variance(total, squares, n)


def _percent(p: float) -> str:
    return f"{p * 100:g}%"


def decide(guard: Guard, experiment: Experiment, fields: Mapping[str, float]) -> Decision:
    """Promote, roll back or wait (module docstring), with the figures that decided."""
    metric: GuardMetric = guard.metric
    note = ""
    if shadow_only(experiment) and metric != "auc":
        metric, note = "auc", f" (a shadow earns no {guard.metric}: compared on AUC)"
    if shadow_only(experiment):
        note += " (a shadow is validated, never promoted: control chose the items, which favours the shadow)"
    if experiment.kind == "level":
        what = f"level {experiment.level}"
    else:
        what = f"candidate {experiment.candidate}" + (" (shadow)" if shadow_only(experiment) else "")
    control_sums, candidate_sums = arm_sums(experiment, fields)
    c0, var0 = _figure(control_sums, metric)
    c1, var1 = _figure(candidate_sums, metric)
    n0, n1 = (c0.n if c0 else 0), (c1.n if c1 else 0)
    counts = f"{n1} {what} and {n0} control answers with {metric}"
    if c0 is None or c1 is None or n0 < 2 or n1 < 2:
        if n1 >= guard.max_answers:
            reason = f"still undecided after {counts} (max_answers {guard.max_answers}): no comparison"
            return Decision("rollback", reason + note, metric, c0, c1)
        reason = f"waiting: {counts}, {guard.min_answers} needed in each"
        return Decision("wait", reason + note, metric, c0, c1)

    diff = c1.mean - c0.mean
    z = NormalDist().inv_cdf(guard.confidence)
    se = math.sqrt(var1 / n1 + var0 / n0)
    lower, upper = diff - z * se, diff + z * se
    floor = -guard.max_drop
    enough = n0 >= guard.min_answers and n1 >= guard.min_answers
    figures = (
        f"{what} {metric} {c1.mean:.4f} vs control {c0.mean:.4f} ({n1} and {n0} answers): "
        f"difference {diff:+.4f}, one-sided {_percent(guard.confidence)} bounds [{lower:+.4f}, {upper:+.4f}]"
    )

    def decision(verdict: Verdict, reason: str) -> Decision:
        return Decision(verdict, reason + note, metric, c0, c1, diff, lower, upper)

    drop = f"max_drop {guard.max_drop:g}"
    if enough and upper < floor:
        return decision("rollback", f"worse than control by more than {drop}: {figures}")
    if enough and lower > floor:
        return decision("promote", f"not worse than control by more than {drop}: {figures}")
    if n1 >= guard.max_answers:
        undecided = f"still undecided after max_answers {guard.max_answers} ({drop})"
        return decision("rollback", f"{undecided}, keeping what is known: {figures}")
    if not enough:
        return decision("wait", f"waiting: {counts}, {guard.min_answers} needed in each; {figures}")
    return decision("wait", f"undecided ({drop}): {figures}")
