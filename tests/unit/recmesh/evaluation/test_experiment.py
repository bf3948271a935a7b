"""The sticky split, the experiment's checks and its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.evaluation.experiment import Experiment, new_experiment, read_experiment, write_experiment
from recmesh.evaluation.impression import CONTROL

USERS = [f"user-{n}" for n in range(10_000)]


@pytest.mark.parametrize("share", [1.0, 10.0, 50.0, 90.0])
def test_the_split_gives_each_arm_its_share_within_two_points(share: float) -> None:
    exp = new_experiment("model", share, candidate="c1")
    in_candidate = sum(exp.arm(u) == "candidate" for u in USERS)
    assert abs(in_candidate / len(USERS) * 100 - share) <= 2.0


def test_a_user_stays_in_one_arm_and_another_experiment_draws_anew() -> None:
    a = Experiment("exp-a", "model", 50.0, 0, candidate="c1")
    b = Experiment("exp-b", "model", 50.0, 0, candidate="c1")
    assert [a.arm(u) for u in USERS[:500]] == [a.arm(u) for u in USERS[:500]]
    same = sum(a.arm(u) == b.arm(u) for u in USERS)
    assert 0.45 < same / len(USERS) < 0.55, "independent draws agree about half the time"


def test_arms_by_kind_and_state() -> None:
    level = new_experiment("level", 100.0, level=2)
    assert level.arm("u1") == "level:2" and level.arm("") == CONTROL
    assert level.ended("rolled_back", "worse").arm("u1") == CONTROL
    assert new_experiment("model", 0.0, candidate="c1", shadow=True).arm("u1") == CONTROL


@pytest.mark.parametrize(
    ("kind", "share", "level", "shadow", "named"),
    [("model", 120.0, 0, False, "percentage"), ("model", 0.0, 0, False, "--shadow"),
     ("level", 10.0, 0, False, "level of 1, 2 or 3"), ("level", 0.0, 2, False, "share above 0")],
)  # fmt: skip
def test_an_experiment_that_could_not_run_is_refused(
    kind: str, share: float, level: int, shadow: bool, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        new_experiment(kind, share, candidate="c1", level=level, shadow=shadow)  # type: ignore[arg-type]


def test_the_file_round_trips(tmp_path: Path) -> None:
    (tmp_path / "ctr").mkdir()
    assert read_experiment(tmp_path) is None
    exp = new_experiment("model", 10.0, candidate="c1", shadow=True)
    write_experiment(tmp_path, exp)
    assert read_experiment(tmp_path) == exp
    done = exp.ended("promoted", "AUC not worse")
    write_experiment(tmp_path, done)
    back = read_experiment(tmp_path)
    assert back is not None and back.state == "promoted" and not back.running and back.decided_ms is not None
