"""The guard: ends a running experiment by itself, promoting its candidate or rolling it back.

Every GUARD_EVERY_S, in the attribution process (`watch`): read the experiment on
file (MODEL_DIR/ctr/EXPERIMENT); unless it runs and the repository declares
`[evaluation.guard]`, nothing more. Otherwise read the sums of every minute of
as-of time since it started (store.read_sums_since), decide
(recmesh/evaluation/guard.py: promote, roll back or wait), and act:
- promote: a candidate model becomes CURRENT (the inference service follows
  it), then the experiment is written `promoted`; a degradation level, and a
  candidate only shadow-scored (no user served it: its AUC on control's
  answers leans its way, recmesh/evaluation/guard.py), are written
  `validated` (nothing served changes: it was only shown to hold);
- rollback: the experiment is written `rolled_back` (the inference service
  stops splitting traffic; CURRENT is left as it was).
CURRENT is written before the experiment, so a failure between the two is
decided and done again at the next check. Every decision is a log line
(`guard_decision`: info for promote, warning for rollback, debug for wait) and
counted in `recmesh_guard_decisions_total{decision}`; `recmesh_experiment_running`
says whether an experiment runs, `recmesh_experiment_difference` the last
difference measured (candidate - control). A check that fails (Redis, a file
that does not parse, a model directory not writable) is logged and tried again
at the next one; it never ends the process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from recmesh.evaluation.experiment import Experiment, read_experiment, write_experiment
from recmesh.evaluation.guard import Decision, decide, shadow_only
from recmesh.features.repository import Guard
from recmesh.modeldir import point_current
from recmesh.redis_client import AnyRedis
from services.attribution.store import MINUTE_MS, read_sums_since

_log = structlog.get_logger("recmesh.attribution.guard")

GUARD_EVERY_S = 10.0

DECISIONS = Counter(
    "recmesh_guard_decisions_total", "The guard's decisions on a running experiment.", ("decision",)
)
for _verdict in ("promote", "rollback", "wait"):
    DECISIONS.labels(_verdict)  # at 0 from the start: the first rollback is an increase Prometheus sees
RUNNING = Gauge("recmesh_experiment_running", "1 while an experiment runs (MODEL_DIR/ctr/EXPERIMENT).")
DIFFERENCE = Gauge(
    "recmesh_experiment_difference", "The guard's last difference of the metric: candidate - control."
)


def _figures(decision: Decision) -> dict[str, Any]:
    out: dict[str, Any] = {"metric": decision.metric}
    for arm, e in (("control", decision.control), ("candidate", decision.candidate)):
        out[f"{arm}_mean"] = None if e is None else round(e.mean, 6)
        out[f"{arm}_half_width"] = None if e is None else round(e.half_width, 6)
        out[f"{arm}_n"] = 0 if e is None else e.n
    for name in ("difference", "lower", "upper"):
        value = getattr(decision, name)
        out[name] = None if value is None else round(value, 6)
    return out


class ExperimentGuard:
    def __init__(self, client: AnyRedis, model_dir: Path, guard: Guard | None) -> None:
        self.client = client
        self.model_dir = model_dir
        self.guard = guard

    async def check(self) -> Decision | None:
        """Decide on the running experiment and act (module docstring); None: nothing to decide."""
        experiment = await asyncio.to_thread(read_experiment, self.model_dir)
        running = experiment is not None and experiment.running
        RUNNING.set(1 if running else 0)
        if experiment is None or not running or self.guard is None:
            return None
        fields = await read_sums_since(self.client, experiment.started_ms // MINUTE_MS)
        decision = decide(self.guard, experiment, fields)
        DECISIONS.labels(decision.verdict).inc()
        if decision.difference is not None:
            DIFFERENCE.set(decision.difference)
        say = {"promote": _log.info, "rollback": _log.warning}.get(decision.verdict, _log.debug)
        say(
            "guard_decision", experiment=experiment.id, kind=experiment.kind, verdict=decision.verdict,
            reason=decision.reason, **_figures(decision),
        )  # fmt: skip
        if decision.verdict != "wait":
            await asyncio.to_thread(self._act, experiment, decision)
        return decision

    def _act(self, experiment: Experiment, decision: Decision) -> None:
        now = read_experiment(self.model_dir)
        if now is None or now.id != experiment.id or not now.running:
            _log.info("guard_decision_superseded", experiment=experiment.id, verdict=decision.verdict)
            return  # ended (or replaced) by hand while this check ran: theirs stands
        reason = f"guard: {decision.reason}"
        if decision.verdict == "rollback":
            ended = experiment.ended("rolled_back", reason)
        elif experiment.kind == "model" and not shadow_only(experiment):
            point_current(self.model_dir, experiment.candidate)
            ended = experiment.ended("promoted", reason)
        else:
            ended = experiment.ended("validated", reason)
        write_experiment(self.model_dir, ended)
        RUNNING.set(0)


async def watch(guard: ExperimentGuard, every_s: float = GUARD_EVERY_S) -> None:
    """`guard.check()` every `every_s` until cancelled; a check that fails is logged, and
    the next one tries again."""
    while True:
        try:
            await guard.check()
        except Exception as err:  # anything: the consumer beside it must go on
            _log.warning("guard_check_failed", error=repr(err))
        await asyncio.sleep(every_s)
