"""Crediting (last touch, a named answer, the window) and one answer's figures."""

from __future__ import annotations

import math

import orjson
import pytest

from recmesh.errors import InvalidArgument
from recmesh.evaluation import impression
from recmesh.evaluation.impression import Group, Shown
from recmesh.evaluation.outcome import Positive, Touch, auc, credited, outcome

G = Group("m1", "full", "B", "control")
W = 1_000


def shown(rid: str = "r1", as_of: int = 10_000, items: tuple[str, ...] = ("a", "b", "c", "d")) -> Shown:
    return Shown(rid, "u1", as_of, items, tuple(float(len(items) - n) for n in range(len(items))), G)


def test_an_act_on_a_shown_item_within_the_window_is_credited_once() -> None:
    s = shown()
    acts = [Positive("b", 10_500, "e1"), Positive("b", 10_600, "e2"), Positive("z", 10_500, "e3")]
    assert credited(s, acts, [], W) == {"b"}
    assert credited(s, [Positive("c", 9_999, "e4"), Positive("c", 11_001, "e5")], [], W) == set()
    assert credited(s, [Positive("c", 10_000, "e6"), Positive("d", 11_000, "e7")], [], W) == {"c", "d"}


def test_the_last_answer_that_showed_the_item_before_the_act_gets_the_credit() -> None:
    first, second = shown("r1", 10_000), shown("r2", 10_400, ("b", "x"))
    act = [Positive("b", 10_500, "e1")]
    others = [Touch("r2", 10_400, frozenset({"b", "x"}))]
    assert credited(first, act, others, W) == set()
    assert credited(second, act, [Touch("r1", 10_000, frozenset(first.items))], W) == {"b"}
    # an answer after the act takes nothing from the one before it
    assert credited(first, act, [Touch("r3", 10_600, frozenset({"b"}))], W) == {"b"}


def test_an_act_naming_an_answer_credits_that_answer_only() -> None:
    first = shown("r1", 10_000)
    named_first = [Positive("b", 10_500, "e1", "r1")]
    assert credited(first, named_first, [Touch("r2", 10_400, frozenset({"b"}))], W) == {"b"}
    assert credited(first, [Positive("b", 10_500, "e1", "r9")], [], W) == set()


def test_figures_of_one_answer() -> None:
    s = shown(items=("a", "b", "c", "d"))  # scores 4, 3, 2, 1
    o = outcome(s, {"b", "d"}, k=4)
    assert o.ctr == 0.5 and o.hit == 1.0 and o.positions == (2, 4)
    assert o.ndcg == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3)))
    assert o.auc == pytest.approx(1 / 4)  # of (b,a), (b,c), (d,a), (d,c) only b over c is right
    top2 = outcome(s, {"d"}, k=2)
    assert (top2.ctr, top2.hit, top2.ndcg, top2.auc, top2.positions) == (0.0, 0.0, 0.0, None, ())
    assert outcome(s, {"a"}, k=4, scores=(0.0, 1.0, 1.0, 1.0)).auc == 0.0  # a shadow's scores


def test_auc_counts_ties_half_and_needs_both_labels() -> None:
    assert auc([1.0, 1.0], [True, False]) == 0.5
    assert auc([3.0, 2.0, 1.0], [True, False, True]) == 0.5
    assert auc([1.0], [True]) is None


def test_positive_members_round_trip() -> None:
    for p in (Positive("i1", 5, "e1"), Positive("i1", 5, "e1", "r|x")):
        assert Positive.from_member(p.member(), 5) == p


def test_impression_records_read_back_and_bad_ones_are_named() -> None:
    rec = impression.record(
        request_id="r1", user_id="u1", items=[("a", 0.9), ("b", 0.1)], model_version="m1",
        feature_version="f", degraded=["ladder:no_crosses"], slo_class="A", arm="control", as_of_ms=5,
        served_at_ms=6, trace_id="t", shadow=impression.Shadow("m2", (0.2, 0.8)),
    )  # fmt: skip
    s = impression.parse(orjson.dumps(rec))
    assert s.items == ("a", "b") and s.group == Group("m1", "no_crosses", "A", "control")
    assert s.shadow == impression.Shadow("m2", (0.2, 0.8))
    bad_ones = ((b"{", "not JSON"), (b"[]", "object"), (orjson.dumps({**rec, "as_of_ms": "x"}), "as_of_ms"),
                (orjson.dumps({**rec, "items": [{"item_id": "a"}]}), "items"),
                (orjson.dumps({**rec, "model_version": ""}), "model_version"))  # fmt: skip
    for bad, named in bad_ones:
        with pytest.raises(InvalidArgument, match=named):
            impression.parse(bad)
