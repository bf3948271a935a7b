"""An experiment on live traffic: a candidate model, or a degradation level, for a share of users.

    MODEL_DIR/ctr/EXPERIMENT     one JSON object (absent: no experiment)

`recmesh models activate VERSION --share 10 [--shadow]` starts one with a
candidate model version; `recmesh models experiment --level 2 --share 10` one
that serves the current model at degradation level 2 to its arm; the guard
(services/attribution/guard.py) or `recmesh models experiment --stop` ends it.
The inference service follows the file as it follows CURRENT.

Arms. A user is in the candidate arm when the hash of the experiment id and the
user id falls in the first `share` percent: sticky (one user sees one arm for
the whole experiment) and drawn afresh per experiment (another experiment
splits users anew). The arm's name is `candidate` (a model) or `level:<n>`;
everyone else is `control`. With `shadow`, a control answer is scored by the
candidate too and its scores logged, never served: the candidate's online AUC
is known before any user sees its order.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from recmesh.evaluation.impression import CONTROL
from recmesh.modeldir import MODEL_NAME

EXPERIMENT_FILE = "EXPERIMENT"
CANDIDATE = "candidate"
State = Literal["running", "promoted", "rolled_back", "stopped", "validated"]
Kind = Literal["model", "level"]


def bucket(experiment_id: str, user_id: str) -> float:
    """The user's place in [0, 100) for this experiment (sticky, uniform)."""
    digest = hashlib.blake2b(f"{experiment_id}|{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * 100.0


@dataclass(frozen=True)
class Experiment:
    id: str
    kind: Kind
    share: float  # percent of users in the candidate arm
    started_ms: int
    candidate: str = ""  # kind "model": the candidate version
    level: int = 0  # kind "level": the level its arm is served at
    shadow: bool = False  # kind "model": control answers scored by the candidate too
    state: State = "running"
    decided_ms: int | None = None
    reason: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def arm_name(self) -> str:
        return CANDIDATE if self.kind == "model" else f"level:{self.level}"

    def arm(self, user_id: str) -> str:
        """The user's arm while the experiment runs (control otherwise, or without a user)."""
        if not self.running or not user_id or self.share <= 0:
            return CONTROL
        return self.arm_name if bucket(self.id, user_id) < self.share else CONTROL

    def ended(self, state: State, reason: str) -> Experiment:
        return replace(self, state=state, reason=reason, decided_ms=int(time.time() * 1000))

    def describe(self) -> str:
        what = f"model {self.candidate}" if self.kind == "model" else f"level {self.level}"
        shadow = ", shadow-scoring control answers" if self.shadow else ""
        return f"{self.id}: {what} for {self.share:g}% of users{shadow} ({self.state})"


def experiment_path(model_dir: Path) -> Path:
    return model_dir / MODEL_NAME / EXPERIMENT_FILE


def new_experiment(
    kind: Kind, share: float, candidate: str = "", level: int = 0, shadow: bool = False
) -> Experiment:
    if not 0.0 <= share <= 100.0:
        raise ValueError(f"share {share} is not a percentage (0-100)")
    if kind == "model" and share == 0.0 and not shadow:
        raise ValueError("a candidate with --share 0 needs --shadow (else no answer would involve it)")
    if kind == "level" and not (1 <= level <= 3 and share > 0):
        raise ValueError("a level experiment needs a level of 1, 2 or 3 and a share above 0")
    now = int(time.time() * 1000)
    return Experiment(f"exp-{now}", kind, share, now, candidate, level, shadow)


def read_experiment(model_dir: Path) -> Experiment | None:
    """The experiment on file, or None (none, or a file that does not parse: said by the caller)."""
    path = experiment_path(model_dir)
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return Experiment(**raw)


def write_experiment(model_dir: Path, experiment: Experiment) -> Path:
    """Atomically: a follower never reads half a file."""
    path = experiment_path(model_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(experiment), indent=2) + "\n")
    tmp.replace(path)
    return path
