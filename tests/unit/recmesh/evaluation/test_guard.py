"""The guard's decision: which rows it compares, and when it promotes, rolls back or waits."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import pytest

from recmesh.evaluation.experiment import Experiment
from recmesh.evaluation.guard import arm_sums, decide
from recmesh.evaluation.impression import Group, Shadow, Shown
from recmesh.evaluation.outcome import outcome
from recmesh.evaluation.sums import add, increments
from recmesh.features.repository import Guard

ITEMS = ("a", "b", "c", "d")
SCORES = (4.0, 3.0, 2.0, 1.0)  # served order: the item at position p has AUC (4 - p) / 3 when clicked
GOOD = (1, 1, 2, 3)  # clicked positions, cycled: AUC 1, 1, 2/3, 1/3 -> mean 0.75
EVEN = (1, 2, 3, 4)  # AUC 1, 2/3, 1/3, 0 -> mean 0.5
BETTER = (1, 1, 1, 2)  # mean 0.917
MODEL = Experiment("exp-1", "model", 10.0, 0, candidate="cand")
SHADOW_ONLY = Experiment("exp-2", "model", 0.0, 0, candidate="cand", shadow=True)
LEVEL = Experiment("exp-3", "level", 10.0, 0, level=2)


def answers(
    group: Group, positions: Iterable[int], n: int, shadow: tuple[str, tuple[float, ...]] | None = None
) -> dict[str, float]:
    """The sums of n answers of `group`, each with one click at the next of `positions`
    (cycled); `shadow`: a model version and its scores of the same items."""
    fields: dict[str, float] = {}
    for i, p in enumerate(itertools.islice(itertools.cycle(positions), n)):
        sh = None if shadow is None else Shadow(shadow[0], shadow[1])
        s = Shown(f"r{i}", f"u{i}", 0, ITEMS, SCORES, group, sh)
        clicked = {ITEMS[p - 1]}
        shadow_outcome = None if sh is None else outcome(s, clicked, 10, sh.scores)
        add(fields, dict(increments(s, outcome(s, clicked, 10), shadow_outcome)))
    return fields


def arm(name: str, model: str = "m1", ladder: str = "full", slo: str = "A") -> Group:
    return Group(model, ladder, slo, name)


def split(positions: Iterable[int], n: int, name: str = "candidate") -> dict[str, float]:
    """A candidate arm's answers spread over two model versions, two levels and two classes."""
    positions = tuple(positions)
    quarter = n // 4
    out: dict[str, float] = {}
    for model, ladder, slo in (("cand", "full", "A"), ("cand", "no_crosses", "B"), ("c2", "full", "B")):
        add(out, answers(arm(name, model, ladder, slo), positions, quarter))
    return add(out, answers(arm(name, "cand", "full", "C"), positions, n - 3 * quarter))


def test_a_clearly_worse_candidate_is_rolled_back_once_both_arms_have_min_answers() -> None:
    fields = add(answers(arm("control"), GOOD, 2000), split(EVEN, 2000))
    d = decide(Guard(), MODEL, fields)
    assert d.verdict == "rollback" and d.metric == "auc"
    assert d.control is not None and d.candidate is not None
    assert d.candidate.n == 2000 and d.control.n == 2000  # every version, level and class merged
    assert d.candidate.mean == pytest.approx(0.5) and d.control.mean == pytest.approx(0.75)
    assert d.difference == pytest.approx(-0.25) and d.upper is not None and d.upper < -0.01
    assert "worse than control by more than max_drop 0.01" in d.reason and "candidate cand" in d.reason


def test_the_bound_is_welch_with_the_one_sided_quantile() -> None:
    fields = add(answers(arm("control"), GOOD, 1000), answers(arm("candidate"), EVEN, 3000))
    d = decide(Guard(confidence=0.975), MODEL, fields)
    good, even = [1, 1, 2 / 3, 1 / 3], [1, 2 / 3, 1 / 3, 0]

    def var(xs: list[float], n: int) -> float:  # the sample variance of xs cycled to n values
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) * (n / len(xs)) / (n - 1)

    se = math.sqrt(var(good, 1000) / 1000 + var(even, 3000) / 3000)
    assert d.difference is not None and d.lower is not None and d.upper is not None
    assert d.upper == pytest.approx(-0.25 + 1.959964 * se) and d.lower == pytest.approx(-0.25 - 1.959964 * se)


def test_too_few_answers_in_either_arm_waits_even_when_the_candidate_looks_worse() -> None:
    fields = add(answers(arm("control"), GOOD, 2000), answers(arm("candidate"), EVEN, 999))
    d = decide(Guard(), MODEL, fields)
    assert d.verdict == "wait" and "999 candidate cand and 2000 control answers with auc" in d.reason
    assert d.difference == pytest.approx(-0.25, abs=1e-3)  # measured, not yet acted on
    nothing = decide(Guard(), MODEL, answers(arm("control"), GOOD, 50))
    assert nothing.verdict == "wait" and nothing.candidate is None and nothing.difference is None


def test_a_candidate_not_worse_by_more_than_max_drop_is_promoted() -> None:
    better = decide(Guard(), MODEL, add(answers(arm("control"), GOOD, 1000), split(BETTER, 1000)))
    assert better.verdict == "promote" and better.lower is not None and better.lower > -0.01
    assert "not worse than control by more than max_drop 0.01" in better.reason
    # The same quality: promoted once the bound is within max_drop (non-inferiority), not before.
    same = add(answers(arm("control"), GOOD, 2000), answers(arm("candidate"), GOOD, 2000))
    undecided = decide(Guard(), MODEL, same)
    assert undecided.verdict == "wait" and undecided.reason.startswith("undecided")
    assert decide(Guard(max_drop=0.03), MODEL, same).verdict == "promote"


def test_still_undecided_at_max_answers_is_rolled_back() -> None:
    guard = Guard(min_answers=100, max_answers=400)
    fields = add(answers(arm("control"), GOOD, 400), answers(arm("candidate"), GOOD, 399))
    assert decide(guard, MODEL, fields).verdict == "wait"
    add(fields, answers(arm("candidate"), GOOD, 1))
    d = decide(guard, MODEL, fields)
    assert d.verdict == "rollback" and "still undecided after max_answers 400" in d.reason
    # With no control answer to compare with (a share of 100 %), the same.
    alone = decide(guard, MODEL, answers(arm("candidate"), GOOD, 400))
    assert alone.verdict == "rollback" and alone.control is None


def test_ctr_is_compared_over_every_answer() -> None:
    fields = add(answers(arm("control"), GOOD, 1500), answers(arm("candidate"), GOOD, 1000))
    no_clicks = Shown("x", "u", 0, ITEMS, SCORES, arm("candidate"))
    for _ in range(1000):  # answers nobody clicked: no AUC, CTR 0
        add(fields, dict(increments(no_clicks, outcome(no_clicks, set(), 10), None)))
    d = decide(Guard(metric="ctr", min_answers=1000), MODEL, fields)
    assert d.metric == "ctr" and d.candidate is not None and d.candidate.n == 2000
    assert d.candidate.mean == pytest.approx(0.125) and d.verdict == "rollback"
    assert decide(Guard(min_answers=1001), MODEL, fields).verdict == "wait"  # 1000 with an AUC


def test_a_shadow_candidate_is_compared_on_its_auc_of_control_answers() -> None:
    reversed_scores = tuple(reversed(SCORES))  # the shadow orders them the other way: AUC (p - 1) / 3
    bad = answers(arm("control"), GOOD, 2000, shadow=("cand", reversed_scores))
    d = decide(Guard(metric="ctr"), SHADOW_ONLY, bad)
    assert d.metric == "auc" and "a shadow earns no ctr: compared on AUC" in d.reason
    assert d.candidate is not None and d.candidate.mean == pytest.approx(0.25) and d.verdict == "rollback"
    assert "candidate cand (shadow)" in d.reason
    good = answers(arm("control"), GOOD, 2000, shadow=("cand", SCORES))
    add(good, answers(arm("control"), EVEN, 2000, shadow=("other", reversed_scores)))  # not this one
    control, candidate = arm_sums(SHADOW_ONLY, good)
    assert control["auc_n"] == 4000 and candidate["auc_n"] == 2000
    passed = decide(Guard(), SHADOW_ONLY, good)
    assert passed.verdict == "promote" and "a shadow is validated, never promoted" in passed.reason


def test_a_served_candidate_with_shadow_scoring_is_compared_on_its_own_arm() -> None:
    experiment = Experiment("exp-4", "model", 10.0, 0, candidate="cand", shadow=True)
    fields = answers(arm("control"), GOOD, 2000, shadow=("cand", SCORES))
    add(fields, answers(arm("candidate", "cand"), EVEN, 2000))
    assert decide(Guard(), experiment, fields).verdict == "rollback"  # its served answers, not its shadow


def test_a_level_is_compared_on_its_own_arm() -> None:
    fields = add(
        answers(arm("control"), GOOD, 2000), answers(arm("level:2", ladder="no_crosses"), BETTER, 2000)
    )
    add(fields, answers(arm("level:1"), EVEN, 5000))  # another arm: not this experiment's
    add(fields, answers(arm("candidate"), EVEN, 5000))
    d = decide(Guard(), LEVEL, fields)
    assert d.verdict == "promote" and d.candidate is not None and d.candidate.n == 2000
    assert "level 2" in d.reason
    worse = add(answers(arm("control"), GOOD, 2000), answers(arm("level:2"), EVEN, 2000))
    assert decide(Guard(), LEVEL, worse).verdict == "rollback"
