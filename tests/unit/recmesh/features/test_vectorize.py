"""Model inputs: declared transforms turn served feature values into columns."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from recmesh.events import validate_event
from recmesh.features import vectorize
from recmesh.features.backfill import Example, training_examples
from recmesh.features.repository import FeatureSet
from recmesh.features.vectorize import (
    ITEM_BUCKETS,
    KINDS,
    MAX_VOCABULARY,
    Transform,
    Vectorizer,
    _Rows,
    _SharedUsers,
    check_against,
    item_bucket,
    plan_inputs,
    transforms_from_card,
)
from recmesh.tools.demo.generate import generate_events, make_catalog
from recmesh.tools.training.family import Layout

USER: dict[str, Any] = {
    "clicks_5m": 3,
    "category_clicks_10m": {"news": 3, "food": 1},
    "last_viewed_3": ["i1"],
    "interest_tags": ["news"],
    "age_band": "25-34",
}
IDS = ["i1", "i2", "i3"]
ITEMS: dict[str, list[Any]] = {
    "category": ["news", "food", "jazz"],
    "popularity": [9.0, 0.0, -2.0],
    "length": [600, 30, 0],
}


def column(t: Transform, users: list[dict[str, Any]] | None = None, items: dict[str, list[Any]] | None = None,
           ids: list[str] | None = None, user_ids: tuple[str, ...] = ("",)) -> list[list[float]]:  # fmt: skip
    m = Vectorizer((t,)).matrix(
        [USER] if users is None else users, ITEMS if items is None else items, ids or IDS, user_ids
    )
    assert m.dtype == np.float32 and m.shape == (len(ids or IDS), t.width)
    return [[float(v) for v in row] for row in m]


def test_every_kind_against_hand_computed_values() -> None:
    assert column(Transform("value", "length", "item", "i_length")) == [[600.0], [30.0], [0.0]]
    assert column(Transform("value", "clicks_5m", "user", "u_clicks")) == [[3.0]] * 3  # broadcast
    assert column(Transform("log1p", "popularity", "item", "i_pop")) == [
        [pytest.approx(math.log1p(9.0))], [0.0], [0.0],  # a negative value counts as 0
    ]  # fmt: skip
    category = Transform("one_hot", "category", "item", "i_cat", vocabulary=("news", "food", "music"))
    assert column(category) == [
        [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0],  # 'jazz' is outside the vocabulary: no column
    ]  # fmt: skip
    multi = Transform("one_hot", "interest_tags", "user", "u_tags", vocabulary=("food", "news", "music"))
    assert column(multi, users=[{"interest_tags": ["news", "music", "odd"]}]) == [[0.0, 1.0, 1.0]] * 3
    assert column(Transform("share", "category_clicks_10m", "user", "u_share", of="category")) == [
        [0.75], [0.25], [0.0],
    ]  # fmt: skip
    # Shares over the whole map: 'food' counts in the total though it has no column.
    dist = Transform("distribution", "category_clicks_10m", "user", "u_dist", vocabulary=("news", "music"))
    assert column(dist) == [[0.75, 0.0]] * 3
    assert column(Transform("contains", "last_viewed_3", "user", "u_has", of="item_id")) == [
        [1.0],
        [0.0],
        [0.0],
    ]
    assert column(Transform("match", "interest_tags", "user", "u_match", of="category")) == [
        [1.0],
        [0.0],
        [0.0],
    ]
    buckets = column(Transform("hash_bucket", "item_id", "item", "i_bucket", buckets=7))
    assert buckets == [[float(zlib.crc32(i.encode()) % 7)] for i in IDS]
    assert item_bucket("i1", 7) == zlib.crc32(b"i1") % 7 == item_bucket("i1", 7)
    # A list's first `length` ids, hashed; -1 past its end; broadcast or one per row.
    seq = Transform("id_sequence", "last_viewed_3", "user", "u_seq", buckets=7, length=3, role="history")
    assert seq.columns == ["u_seq[0]", "u_seq[1]", "u_seq[2]"]
    assert column(seq) == [[float(zlib.crc32(b"i1") % 7), -1.0, -1.0]] * 3
    rows: list[dict[str, Any]] = [{"last_viewed_3": ["a", "b", "c", "d"]}, {"last_viewed_3": []}, {}]
    assert column(seq, users=rows) == [
        [float(zlib.crc32(x.encode()) % 7) for x in "abc"], [-1.0] * 3, [-1.0] * 3,
    ]  # fmt: skip


def test_multi_valued_item_attributes() -> None:
    items = {"genres": [["news", "food"], ["jazz"], []]}
    share = Transform("share", "category_clicks_10m", "user", "u_share", of="genres")
    assert column(share, items=items) == [[1.0], [0.0], [0.0]]
    match = Transform("match", "interest_tags", "user", "u_match", of="genres")
    assert column(match, users=[{"interest_tags": ["jazz"]}], items=items) == [[0.0], [1.0], [0.0]]
    one_hot = Transform("one_hot", "genres", "item", "i_genres", vocabulary=("food", "news"))
    assert column(one_hot, items=items) == [[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_missing_features_take_their_defaults() -> None:
    length = Transform("value", "length", "item", "i_length", default=5)
    assert column(length, items={}) == [[5.0]] * 3  # no column
    assert column(length, items={"length": [7, None, 1]}) == [[7.0], [5.0], [1.0]]  # a missing value
    assert column(length, items={"length": [7, 8]}) == [[5.0]] * 3  # a column that does not fit
    assert column(Transform("value", "length", "item", "i_length"), items={}) == [[0.0]] * 3  # no default
    clicks = Transform("log1p", "clicks_5m", "user", "u_clicks", default=0)
    assert column(clicks, users=[{}]) == [[0.0]] * 3 and column(clicks, users=[]) == [[0.0]] * 3
    band = Transform(
        "one_hot", "age_band", "user", "u_band", vocabulary=("unknown", "25-34"), default="unknown"
    )
    assert column(band, users=[{}]) == [[1.0, 0.0]] * 3
    share = Transform("share", "category_clicks_10m", "user", "u_share", of="category", of_default="news")
    assert column(share, users=[{}]) == [[0.0]] * 3  # no clicks, no share
    assert column(share, items={}) == [[0.75]] * 3  # no category: its default
    match = Transform("match", "interest_tags", "user", "u_match", of="category", of_default="food")
    assert column(match, users=[{"interest_tags": ["food"]}], items={}) == [[1.0]] * 3
    dist = Transform("distribution", "category_clicks_10m", "user", "u_dist", vocabulary=("news",))
    assert column(dist, users=[{}]) == [[0.0]] * 3
    contains = Transform("contains", "last_viewed_3", "user", "u_has", of="item_id")
    assert column(contains, users=[{}]) == [[0.0]] * 3


def test_users_broadcast_or_one_per_row() -> None:
    t = (
        Transform("value", "clicks_5m", "user", "u_clicks"),
        Transform("contains", "last_viewed_3", "user", "u_has", of="item_id"),
        Transform("contains", "recent_users", "item", "i_has_user", of="user_id"),
        Transform("hash_bucket", "user_id", "user", "u_bucket", buckets=1000),
    )
    vec = Vectorizer(t)
    assert vec.columns == ["u_clicks", "u_has", "i_has_user", "u_bucket"] and vec.width == 4
    assert vec.features() == {("user", "clicks_5m"), ("user", "last_viewed_3"), ("item", "recent_users")}
    items = {"recent_users": [["u1"], ["u2"], []]}
    one = vec.matrix([{"clicks_5m": 1, "last_viewed_3": ["i2"]}], items, IDS, ("u1",))
    ub = float(item_bucket("u1", 1000))
    np.testing.assert_array_equal(one, [[1, 0, 1, ub], [1, 1, 0, ub], [1, 0, 0, ub]])
    users = [{"clicks_5m": n, "last_viewed_3": [f"i{n}"]} for n in (1, 2, 3)]
    per_row = vec.matrix(users, items, IDS, ("u1", "u2", "u3"))
    np.testing.assert_array_equal(
        per_row,
        [[1, 1, 1, ub], [2, 1, 1, item_bucket("u2", 1000)], [3, 1, 0, item_bucket("u3", 1000)]],
    )
    assert vec.matrix([{}], {}, [], ("u1",)).shape == (0, 4)


@pytest.fixture(scope="module")
def demo_rows(demo_feature_set: FeatureSet) -> list[Example]:
    """Point-in-time rows of a short demo log, as training builds them."""
    catalog = make_catalog()
    events = [
        validate_event(e, demo_feature_set.event_schema)
        for e in generate_events(catalog, 1_767_225_600_000, 30 * 60_000, 150, seed=9)
    ]
    users = {u["user_id"]: u for u in catalog.users}
    items = {i["item_id"]: i for i in catalog.items}
    return list(training_examples(demo_feature_set, events, users, items))


@pytest.fixture(scope="module")
def demo_plan(demo_feature_set: FeatureSet, demo_rows: list[Example]) -> tuple[Transform, ...]:
    return plan_inputs(demo_feature_set, [e.user for e in demo_rows], [e.item for e in demo_rows])


def test_plan_inputs_reads_every_demo_feature_by_its_type(
    demo_feature_set: FeatureSet, demo_plan: tuple[Transform, ...], demo_rows: list[Example]
) -> None:
    by_name = {t.name: t for t in demo_plan}
    assert len(by_name) == len(demo_plan)  # column names are unique
    assert check_against(demo_plan, demo_feature_set) == []
    assert {t.feature for t in demo_plan} == {f.name for f in demo_feature_set.features} | {"item_id"}
    for name in ("u_clicks_5m", "i_clicks_10m", "i_views_10m"):  # counts: long-tailed
        assert by_name[name].kind == "log1p"
    assert (
        by_name["u_last_viewed_3_has"].kind == "contains" and by_name["u_last_viewed_3_has"].of == "item_id"
    )
    share = by_name["u_category_clicks_10m_share"]
    assert (share.kind, share.of, share.of_default) == ("share", "category", "unknown")
    categories = {e.item["category"] for e in demo_rows}
    category = by_name["i_category"]
    assert (category.kind, category.role) == ("one_hot", "item_attr")
    assert set(category.vocabulary) == categories and len(categories) == 12
    intent = by_name["u_category_clicks_10m_dist"]
    assert (intent.kind, intent.role, intent.vocabulary) == ("distribution", "intent", category.vocabulary)
    match = by_name["u_interest_tags_match"]
    assert (match.kind, match.of) == ("match", "category")
    bands = {e.user["age_band"] for e in demo_rows}
    assert by_name["u_age_band"].kind == "one_hot" and set(by_name["u_age_band"].vocabulary) == bands
    assert {by_name[n].kind for n in ("i_length", "i_author_level", "i_popularity")} <= {"value", "log1p"}
    ids = by_name["i_id_bucket"]
    assert (ids.kind, ids.feature, ids.buckets, ids.role) == (
        "hash_bucket",
        "item_id",
        ITEM_BUCKETS,
        "item_id",
    )
    # The model family finds all its parts in the plan.
    layout = Layout.of(demo_plan)
    assert layout.has_cross and layout.id_col is not None and len(layout.attr_cols) == 12


def test_the_planned_matrix_is_the_row_by_row_one(
    demo_plan: tuple[Transform, ...], demo_rows: list[Example]
) -> None:
    rows = demo_rows[:200]
    vec = Vectorizer(demo_plan)
    names = {t.feature for t in demo_plan if t.entity == "item"}
    columns = {name: [e.item.get(name) for e in rows] for name in names}
    m = vec.matrix([e.user for e in rows], columns, [e.item_id for e in rows], [e.user_id for e in rows])
    assert m.shape == (len(rows), vec.width) and np.isfinite(m).all()
    one_by_one = np.vstack([
        vec.matrix([e.user], {k: [e.item.get(k)] for k in names}, [e.item_id], [e.user_id]) for e in rows
    ])  # fmt: skip
    np.testing.assert_array_equal(m, one_by_one)
    category = [n for n, c in enumerate(vec.columns) if c.startswith("i_category=")]
    assert (m[:, category].sum(axis=1) == 1).all()  # every demo item has one known category
    assert m[:, vec.columns.index("u_last_viewed_3_has")].any()  # some rows re-view a recent item


def test_rows_holding_one_user_row_get_its_columns_worked_out_once_and_the_same_values(
    demo_plan: tuple[Transform, ...], demo_rows: list[Example]
) -> None:
    """An example and its negatives hold the very same user row: the user-side
    columns that read it alone are made once for it, the same values as made
    row by row (from copies, which share nothing)."""
    rows = demo_rows[:300]
    vec = Vectorizer(demo_plan)
    names = {t.feature for t in demo_plan if t.entity == "item"}
    columns = {name: [e.item.get(name) for e in rows] for name in names}
    shared = [rows[k - k % 5].user for k in range(len(rows))]  # an example and its 4 negatives
    copied = [dict(u) for u in shared]
    ids = [e.item_id for e in rows], [e.user_id for e in rows]
    shared_rows = _Rows(shared, columns, *ids, True, len(rows))
    assert _SharedUsers.of(shared_rows) is not None
    assert _SharedUsers.of(replace(shared_rows, users=copied)) is None
    kinds = {t.kind for t in demo_plan if t.entity == "user"}  # worked out once, and those that read items
    assert kinds == {"id_sequence", "one_hot", "distribution", "log1p", "share", "contains", "match"}
    np.testing.assert_array_equal(vec.matrix(shared, columns, *ids), vec.matrix(copied, columns, *ids))


def test_plan_inputs_learns_skew_and_vocabularies(demo_feature_set: FeatureSet) -> None:
    n = 40
    users = [{"age_band": f"band{k % 20:02d}" if k < 30 else "band00"} for k in range(n)]
    items = [
        {"popularity": 1000.0 if k == 0 else 1.0, "length": 10 + k, "category": "news"} for k in range(n)
    ]
    plan = {t.name: t for t in plan_inputs(demo_feature_set, users, items)}
    assert plan["i_popularity"].kind == "log1p"  # a long tail
    assert plan["i_length"].kind == "value"
    # Most frequent first (ties by value), at most 16 values for a user feature.
    assert (
        plan["u_age_band"].vocabulary[:2] == ("band00", "band01") and len(plan["u_age_band"].vocabulary) == 16
    )
    assert plan["i_category"].vocabulary == ("news",)
    many = [{"category": f"c{k:03d}"} for k in range(100)]
    assert (
        len({t.name: t for t in plan_inputs(demo_feature_set, users[:1], many)}["i_category"].vocabulary)
        == MAX_VOCABULARY
    )


def test_transforms_round_trip_through_json(
    demo_plan: tuple[Transform, ...], demo_rows: list[Example]
) -> None:
    card = json.loads(json.dumps([t.to_json() for t in demo_plan]))  # as the model card holds them
    back = transforms_from_card(card)
    # The card keeps every default, zero ones included: the round trip is exact.
    assert back == demo_plan
    assert [t.to_json() for t in back] == card
    rows = demo_rows[:50]
    names = {t.feature for t in demo_plan if t.entity == "item"}
    args = (
        [e.user for e in rows],
        {k: [e.item.get(k) for e in rows] for k in names},
        [e.item_id for e in rows],
    )
    np.testing.assert_array_equal(Vectorizer(back).matrix(*args), Vectorizer(demo_plan).matrix(*args))
    with pytest.raises(ValueError, match="unknown transform 'zscore'"):
        Transform.from_json({"kind": "zscore", "feature": "length", "entity": "item", "name": "x"})
    assert set(KINDS) == {
        "value",
        "log1p",
        "one_hot",
        "share",
        "distribution",
        "contains",
        "match",
        "hash_bucket",
        "id_sequence",
    }


@pytest.mark.parametrize(
    ("transform", "problem"),
    [
        (Transform("value", "nope", "item", "x"), "feature 'nope' is not declared"),
        (Transform("value", "length", "user", "x"), "'length' is a item feature, not a user feature"),
        (Transform("log1p", "category", "item", "x"), "log1p needs a number; 'category' is str"),
        (Transform("share", "clicks_5m", "user", "x", of="category"), "share needs a count_by feature"),
        (Transform("distribution", "interest_tags", "user", "x", vocabulary=("a",)), "needs a count_by"),
        (Transform("contains", "age_band", "user", "x", of="item_id"), "contains needs a list feature"),
        (Transform("one_hot", "popularity", "item", "x", vocabulary=("a",)), "one_hot needs a categorical"),
        (Transform("one_hot", "category", "item", "x"), "one_hot needs a vocabulary"),
        (Transform("value", "item_id", "item", "x"), "value cannot read item_id"),
        (Transform("hash_bucket", "item_id", "item", "x"), "hash_bucket needs buckets > 0"),
        (
            Transform("match", "interest_tags", "user", "x", of="genre"),
            "`of` 'genre' is not a declared feature",
        ),
    ],
)
def test_check_against_names_what_the_repository_cannot_serve(
    demo_feature_set: FeatureSet, transform: Transform, problem: str
) -> None:
    good = Transform("hash_bucket", "item_id", "item", "i_id_bucket", buckets=8)
    problems = check_against([good, transform], demo_feature_set)
    assert len(problems) == 1 and problems[0].startswith("inputs[1] (x): "), problems
    assert problem in problems[0]
    assert check_against([good], demo_feature_set) == []


def test_past_its_sample_a_numeric_feature_is_judged_on_a_uniform_sample(
    demo_feature_set: FeatureSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are not held to plan the inputs (InputStats): past SKEW_SAMPLE
    values the median comes from a uniform sample, the extremes stay exact."""
    monkeypatch.setattr(vectorize, "SKEW_SAMPLE", 50)
    tail = [{"popularity": 5000.0 if k % 997 == 0 else 1.0 + k % 3, "length": 10 + k % 7}
            for k in range(5000)]  # fmt: skip
    stats = vectorize.InputStats(demo_feature_set)
    for it in tail:
        stats.add({}, it)
    assert len(stats.numbers["popularity"].kept) == 50 and stats.numbers["popularity"].highest == 5000.0
    plan = {t.name: t for t in vectorize.plan_from(stats)}
    assert plan["i_popularity"].kind == "log1p" and plan["i_length"].kind == "value"
    assert plan == {t.name: t for t in plan_inputs(demo_feature_set, [{}] * 5000, tail)}
