"""The lift from real-time features comes from the behaviour's temporal
structure, not from leakage: moving every impression to a random time (labels
kept intact) must erase most of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recmesh.training.train import TrainConfig, train

CFG = TrainConfig()  # the default demo size: smaller samples make the lift noisy


# Two full demo trainings: about 20 s on a quiet 2-core box, several times that on a busy one.
@pytest.mark.timeout(600)
def test_shuffling_event_times_destroys_the_realtime_lift(tmp_path: Path) -> None:
    real = train(CFG, tmp_path / "real", progress=lambda _: None)["metrics"]
    shuffled = train(replace(CFG, shuffle_times=True), tmp_path / "shuffled", progress=lambda _: None)[
        "metrics"
    ]
    assert real["auc_lift_from_realtime"] > 0.02, real
    # What survives is what the events say about the user regardless of time
    # (activity level, long-run tastes); the temporal part is gone.
    assert shuffled["auc_lift_from_realtime"] < real["auc_lift_from_realtime"] / 3, (real, shuffled)


def test_training_is_deterministic_under_a_seed(tmp_path: Path) -> None:
    small = TrainConfig(sessions=600, hours=1.0, epochs=1)
    a = train(small, tmp_path / "a", progress=lambda _: None)
    b = train(small, tmp_path / "b", progress=lambda _: None)
    assert a["version"] == b["version"] and a["metrics"] == b["metrics"]
