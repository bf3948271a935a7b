"""recmesh.tools.training.ranking: the leave-last-out split, popularity and HR/NDCG."""

from __future__ import annotations

import math

from recmesh.events import Event
from recmesh.features.backfill import LabelRule, positive_examples
from recmesh.features.eventlog import EventTable
from recmesh.tools.training.ranking import Popularity, Quality, first_k, leave_last_out

RATING = LabelRule(value_field="rating", at_least=4.0, examples=frozenset({"view"}))
CLICK = LabelRule(behaviors=frozenset({"click"}), within_ms=1000, examples=frozenset({"view"}))


def ev(n: int, user: str, item: str, t: int, behavior: str = "view", rating: float | None = None) -> Event:
    e = Event.model_construct(
        event_id=f"e{n:03d}", user_id=user, item_id=item, behavior=behavior, event_time=t
    )
    return e if rating is None else e.with_values({"rating": rating})


def test_positives_by_value_and_by_a_later_behaviour() -> None:
    rated = [ev(1, "u1", "a", 1, rating=5), ev(2, "u1", "b", 2, rating=3), ev(3, "u1", "c", 3, "click")]
    assert positive_examples(RATING, rated) == [True, False, False]
    log = [
        ev(1, "u1", "a", 1_000),
        ev(2, "u1", "b", 1_100),
        ev(3, "u1", "a", 1_500, "click"),  # within 1 s of the view of a
        ev(4, "u1", "b", 2_200, "click"),  # 1.1 s after the view of b: too late
    ]
    assert positive_examples(CLICK, log) == [True, False, False, False]


def test_a_tables_positives_are_its_events_positives() -> None:
    """Rules an event decides alone read a table's columns: the same flags as
    the events give, on the table and on a view of some of its rows."""
    log = [ev(n, f"u{n % 3}", f"i{n % 7}", n, ("view", "click")[n % 5 == 0],
              rating=None if n % 4 == 0 else float(n % 6)) for n in range(60)]  # fmt: skip
    table = EventTable.of(log, ("rating",))
    view = table.take([n for n in range(60) if n % 3 != 1])
    implicit = LabelRule(implicit=True, examples=frozenset({"view"}))
    for rule in (RATING, implicit, CLICK):
        for events in (table, view):
            want = positive_examples(rule, list(events))
            assert positive_examples(rule, events) == want and any(want) and not all(want)


def test_leave_last_out_holds_out_the_last_positive_and_what_follows() -> None:
    log = [
        ev(1, "u1", "a", 10, rating=5),
        ev(2, "u2", "a", 15, rating=4),
        ev(3, "u1", "b", 20, rating=2),
        ev(4, "u1", "c", 30, rating=4),  # u1's target
        ev(5, "u2", "d", 35, rating=5),  # u2's target
        ev(6, "u1", "d", 40, rating=1),  # after u1's target: held out, not history
        ev(7, "u3", "a", 50, rating=5),  # u3: the only event is the positive, no history
    ]
    split = leave_last_out(RATING, log)
    assert [(t.user_id, t.item_id, t.as_of_ms) for t in split.targets] == [("u1", "c", 29), ("u2", "d", 34)]
    assert [e.event_id for e in split.training] == ["e001", "e002", "e003", "e007"]
    assert split.history == {"u1": {"a", "b"}, "u2": {"a"}}
    assert split.held_out_events == 3
    assert split.users_with_a_positive == 3


IMPLICIT = LabelRule(implicit=True, examples=frozenset({"view", "cart", "purchase"}), negatives=4)


def test_a_purchase_target_is_held_out_with_its_lead_up_and_only_purchases_are_seen() -> None:
    """--target purchase: the last purchase is the target; its lead-up (the
    shopper's events on it since their previous purchase: its view and cart)
    is held out too, so the ranking is asked as of before they turned to it.
    With recall.seen on purchases, a product only viewed stays a candidate."""
    log = [
        ev(1, "u1", "b", 5, "view"),  # viewed, not bought
        ev(2, "u1", "a", 10, "view"),
        ev(3, "u1", "a", 11, "purchase"),  # the previous purchase: seen
        ev(4, "u1", "c", 20, "view"),
        ev(5, "u1", "t", 30, "view"),  # the target's lead-up starts here
        ev(6, "u1", "d", 32, "view"),
        ev(7, "u1", "t", 33, "cart"),
        ev(8, "u1", "t", 34, "purchase"),  # the target
    ]
    split = leave_last_out(IMPLICIT, log, target={"purchase"}, seen={"purchase"})
    (target,) = split.targets
    assert (target.item_id, target.event_id, target.as_of_ms) == ("t", "e008", 29)
    assert [e.event_id for e in split.training] == ["e001", "e002", "e003", "e004"]
    assert split.history == {"u1": {"a"}}
    # Without `seen`, every item of the training part is history.
    assert leave_last_out(IMPLICIT, log, target={"purchase"}).history == {"u1": {"a", "b", "c"}}
    # Without a target behaviour, the last positive (the purchase too) is the target.
    assert [t.event_id for t in leave_last_out(IMPLICIT, log).targets] == ["e008"]


def test_implicit_positives_are_the_example_events() -> None:
    log = [ev(1, "u1", "a", 1, "view"), ev(2, "u1", "a", 2, "purchase"), ev(3, "u1", "b", 3, "click")]
    assert positive_examples(IMPLICIT, log) == [True, True, False]


def test_a_drawn_subset_is_deterministic_and_leaves_the_rest_whole() -> None:
    log = [ev(n, f"u{n % 7}", f"i{n}", n * 10, rating=5) for n in range(70)]
    one = leave_last_out(RATING, log, users=3, seed=4)
    two = leave_last_out(RATING, log, users=3, seed=4)
    assert [t.user_id for t in one.targets] == [t.user_id for t in two.targets]
    assert len(one.targets) == 3
    assert len(one.training) == 70 - 3


def test_popularity_counts_only_its_behaviours_and_skips_the_history() -> None:
    pop = Popularity({"view"})
    pop.add([ev(1, "u", "a", 1), ev(2, "v", "a", 2), ev(3, "u", "b", 3), ev(4, "u", "c", 4, "click")])
    assert pop.top(2, exclude=set()) == ["a", "b"]
    assert pop.top(2, exclude={"a"}) == ["b"]


def test_hit_rate_and_ndcg() -> None:
    q = Quality(k=3)
    q.add("x", ["x", "y", "z"])  # rank 0: 1
    q.add("z", ["x", "y", "z"])  # rank 2: 1/log2(4) = 0.5
    q.add("w", ["x", "y", "z"], full=["x", "y", "z", "w"])  # a miss, though in the list
    assert q.hr == 2 / 3
    assert math.isclose(q.ndcg, 1.5 / 3)
    assert q.to_json()["target_in_list"] == 1.0
    assert first_k(["a", "b", "a", "c", "d"], exclude={"b"}, k=2) == ["a", "c"]
