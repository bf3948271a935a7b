"""Sums per group, merged by the dimensions asked for, read back with intervals."""

from __future__ import annotations

import pytest

from recmesh.evaluation.impression import Group, Shadow, Shown
from recmesh.evaluation.outcome import outcome
from recmesh.evaluation.sums import add, estimate, increments, rows


def _answer(model: str, slo: str, clicked: set[str], shadow: Shadow | None = None) -> dict[str, float]:
    s = Shown("r", "u", 0, ("a", "b"), (2.0, 1.0), Group(model, "full", slo, "control"), shadow)
    served = outcome(s, clicked, 10)
    sh = outcome(s, clicked, 10, shadow.scores) if shadow else None
    return dict(increments(s, served, sh))


def test_rows_group_and_merge_by_the_dimensions_asked_for() -> None:
    fields: dict[str, float] = {}
    for model, slo, clicked in (("m1", "A", {"a"}), ("m1", "B", {"b"}), ("m2", "A", set())):
        add(fields, _answer(model, slo, clicked))
    by_model = {r.key[0]: r for r in rows(fields, by=["model_version"])}
    assert by_model["m1"].answers == 2 and by_model["m2"].answers == 1
    m1 = by_model["m1"]
    hit, ctr, auc = m1.figure("hit"), m1.figure("ctr"), m1.figure("auc")
    assert hit is not None and hit.mean == 1.0 and ctr is not None and ctr.mean == 0.5
    assert auc is not None and auc.mean == 0.5 and auc.n == 2  # a above b once, b above a once
    assert m1.position_ctr(1) == 0.5 and m1.key[2] == "*"
    assert len(rows(fields)) == 3


def test_a_shadow_is_its_own_row_with_an_auc_only() -> None:
    fields = _answer("m1", "A", {"b"}, Shadow("cand", (0.1, 0.9)))
    by = {r.key: r for r in rows(fields, by=["model_version"])}
    shadow = by[("cand", "*", "*", "shadow")]
    assert shadow.answers == 1 and shadow.figure("ctr") is None
    auc = shadow.figure("auc")
    assert auc is not None and auc.mean == 1.0
    served_auc = by[("m1", "*", "*", "*")].figure("auc")
    assert served_auc is not None and served_auc.mean == 0.0


def test_the_interval_is_the_normal_one_of_the_mean() -> None:
    e = estimate(total=50.0, squares=50.0, n=100)  # a rate of 0.5 from 0/1 outcomes
    assert e is not None and e.mean == 0.5
    assert e.half_width == pytest.approx(1.96 * (0.25 * 100 / 99 / 100) ** 0.5, rel=1e-3)
    assert estimate(0.0, 0.0, 0) is None
