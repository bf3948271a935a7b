"""The packed item block: the same model input as the message form, bit for bit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recmesh.errors import FailedPrecondition, InvalidArgument
from recmesh.features.block import BlockView, ItemLayout, first_values, layout_name
from recmesh.features.repository import FeatureSet
from recmesh.features.repository.load import parse_feature_set
from recmesh.features.vectorize import ITEM_BUCKETS, Transform, Vectorizer, plan_inputs
from recmesh.features.wire import Column, columns_to_pb, row_to_pb, row_values, table_columns

# Every item feature type a repository can declare: numbers, a categorical, a
# multi-valued list, a real-time count and mean, the item's recent users (last_n)
# and its clicks by the user's age band (count_by).
REPOSITORY = """
[repository]
name = "block-test"

[events]
behaviors = ["view", "click"]

[users]
source = "users.csv"
id = "user_id"

[users.features]
age_band = { type = "categorical", default = "unknown" }
interest_tags = { type = "multi", separator = ";" }

[items]
source = "items.csv"
id = "item_id"

[items.features]
category = { type = "categorical", default = "unknown" }
genres = { type = "multi", separator = " " }
length = { type = "integer", default = 0 }
popularity = { type = "numeric", default = 0.0 }

[realtime.category_clicks]
entity = "user"
aggregate = "count_by"
by = "category"
behaviors = ["click"]
window = "10m"

[realtime.recent_items]
entity = "user"
aggregate = "last_n"
n = 5
behaviors = ["view", "click"]
window = "1h"

[realtime.item_clicks]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "10m"

[realtime.item_viewers]
entity = "item"
aggregate = "last_n"
n = 4
behaviors = ["view"]
window = "1h"

[realtime.item_clicks_by_age]
entity = "item"
aggregate = "count_by"
by = "age_band"
behaviors = ["click"]
window = "1h"

[recall]
category = "category"
affinity = "category_clicks"
interests = "interest_tags"
recent_items = "recent_items"
"""
CATEGORIES = ["news", "food", "jazz", "sport", "", "unknown"]
GENRES = ["Drama", "Comedy", "Horror", "Children's"]
AGES = ["18-24", "25-34", "35-44", "unknown"]


@pytest.fixture(scope="module")
def feature_set() -> FeatureSet:
    return parse_feature_set(REPOSITORY, Path("block-test.toml"))


def _items(rng: random.Random, n: int) -> tuple[list[str], dict[str, list[Any]]]:
    ids = [f"i{rng.randrange(10_000)}" for _ in range(n)]
    return ids, {
        "category": [rng.choice(CATEGORIES) for _ in ids],
        "genres": [rng.sample(GENRES, rng.randrange(4)) for _ in ids],
        "length": [rng.choice([0, 30, 600, 2**40]) for _ in ids],
        "popularity": [rng.choice([0.0, -2.5, 1e-9, rng.random() * 1e6, 0.1 + 0.2]) for _ in ids],
        "item_clicks": [rng.randrange(100) for _ in ids],
        "item_viewers": [[f"u{rng.randrange(5)}" for _ in range(rng.randrange(4))] for _ in ids],
        "item_clicks_by_age": [
            {a: rng.randrange(1, 9) for a in rng.sample(AGES, rng.randrange(3))} for _ in ids
        ],
    }


def _user(rng: random.Random, ids: list[str]) -> dict[str, Any]:
    return {
        "age_band": rng.choice(AGES),
        "interest_tags": rng.sample(CATEGORIES[:4], rng.randrange(3)),
        "category_clicks": {c: rng.randrange(1, 5) for c in rng.sample(CATEGORIES[:4], rng.randrange(4))},
        "recent_items": rng.sample(ids, min(len(ids), rng.randrange(6))),
    }


def _transforms(feature_set: FeatureSet, rng: random.Random) -> tuple[Transform, ...]:
    """What recmesh train plans for this repository, and a team's card's other kinds on the item side."""
    ids, items = _items(rng, 300)
    users = [_user(rng, ids) for _ in ids]
    rows = [{name: col[r] for name, col in items.items()} for r in range(len(ids))]
    planned = plan_inputs(feature_set, users, rows)
    extra = (
        Transform("one_hot", "genres", "item", "i_genres", vocabulary=("Drama", "Horror", "Jazz")),
        Transform("log1p", "length", "item", "i_length_log"),
        Transform("log1p", "popularity", "item", "i_popularity_log"),  # negatives count as 0
        Transform("contains", "item_viewers", "item", "i_viewed_by", of="user_id"),
        Transform("share", "item_clicks_by_age", "item", "i_age_share", of="age_band", of_default="unknown"),
        Transform("distribution", "item_clicks_by_age", "item", "i_age_dist", vocabulary=tuple(AGES[:3])),
        Transform("id_sequence", "item_viewers", "item", "i_viewers", buckets=97, length=3),
        Transform("match", "interest_tags", "user", "u_genre_match", of="genres"),
        Transform("share", "category_clicks", "user", "u_genre_share", of="genres"),
        Transform("hash_bucket", "item_id", "item", "i_bucket", buckets=ITEM_BUCKETS),
    )
    return planned + extra


def _message_form(feature_set: FeatureSet, user: dict[str, Any], user_id: str, ids: list[str],
                  items: dict[str, list[Any]]) -> tuple[dict[str, Any], dict[str, list[Any]]]:  # fmt: skip
    """The values inference reads from the message form: through protobuf and back."""
    n = len(ids)
    columns = {name: Column(values, ["realtime"] * n, [-1] * n) for name, values in items.items()}
    table = columns_to_pb(feature_set, ids, columns)
    row = row_to_pb(feature_set, user_id, {k: (v, "realtime", -1) for k, v in user.items()})
    return row_values(row), table_columns(table)


def _block(feature_set: FeatureSet, ids: list[str], items: dict[str, list[Any]]) -> BlockView:
    block = ItemLayout.of(feature_set).encode(ids, items)
    wire = type(block).FromString(block.SerializeToString())  # as received
    return BlockView(wire, feature_set.version)


@pytest.mark.parametrize("seed", range(12))
def test_the_block_gives_the_message_forms_model_input_bit_for_bit(
    feature_set: FeatureSet, seed: int
) -> None:
    rng = random.Random(seed)
    vectorizer = Vectorizer(_transforms(feature_set, random.Random(1000 + seed)))
    ids, items = _items(rng, rng.choice([1, 2, 7, 200]))
    user_id = f"u{rng.randrange(5)}"
    user = _user(rng, ids)
    user_values, table = _message_form(feature_set, user, user_id, ids, items)
    expected = vectorizer.matrix([user_values], table, ids, [user_id])
    got = vectorizer.matrix_from_block(user_values, _block(feature_set, ids, items), user_id)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), vectorizer.columns
    assert expected.any()  # the comparison is not of two empty matrices


def test_a_block_decodes_to_the_values_it_was_given(feature_set: FeatureSet) -> None:
    ids, items = _items(random.Random(3), 25)
    view = _block(feature_set, ids, items)
    assert view.entity_ids == ids and view.rows == 25
    for name, values in items.items():
        got = view.column(name)
        if name in {"length", "popularity"}:
            assert got == [float(v) for v in values]
        else:
            assert got == values, name
    assert first_values(ItemLayout.of(feature_set).encode(ids, items), "category") == items["category"]
    firsts = first_values(ItemLayout.of(feature_set).encode(ids, items), "genres")
    assert firsts == [g[0] if g else "" for g in items["genres"]]
    short = ItemLayout.of(feature_set).encode(ids, items)
    del short.dictionaries[0].values[1:]  # codes past the dictionary
    with pytest.raises(InvalidArgument, match="'category' has codes outside its dictionary"):
        first_values(short, "category")


def test_an_empty_block(feature_set: FeatureSet) -> None:
    view = _block(feature_set, [], {name: [] for name in _items(random.Random(0), 0)[1]})
    vectorizer = Vectorizer(_transforms(feature_set, random.Random(0)))
    assert vectorizer.matrix_from_block({}, view).shape == (0, vectorizer.width)


def test_a_layout_from_another_feature_set_version_is_refused(feature_set: FeatureSet) -> None:
    ids, items = _items(random.Random(4), 3)
    block = ItemLayout.of(feature_set).encode(ids, items)
    with pytest.raises(FailedPrecondition, match=r"fs-other/items.v1.*another feature-set version"):
        BlockView(block, "fs-other")
    assert block.layout == layout_name(feature_set.version)


def test_a_malformed_block_is_an_invalid_argument_naming_the_fault(feature_set: FeatureSet) -> None:
    ids, items = _items(random.Random(5), 4)
    layout = ItemLayout.of(feature_set)
    short = layout.encode(ids, items)
    short.values = short.values[:-8]
    with pytest.raises(InvalidArgument, match=r"values hold .* bytes; 4 rows x 4 columns"):
        BlockView(short, feature_set.version)
    bad_code = layout.encode(ids, items)
    del bad_code.dictionaries[0].values[:]
    with pytest.raises(InvalidArgument, match="'category' has codes outside its dictionary"):
        BlockView(bad_code, feature_set.version)
    for code in (float("nan"), 0.5):
        not_a_code = layout.encode(ids, items)
        values = np.frombuffer(not_a_code.values, dtype="<f8").copy().reshape(4, 4)
        values[1, 0] = code  # column 0 is the categorical 'category'
        not_a_code.values = values.tobytes()
        with pytest.raises(InvalidArgument, match="'category' has codes outside its dictionary"):
            BlockView(not_a_code, feature_set.version)
    bad_offsets = layout.encode(ids, items)
    bad_offsets.lists[0].offsets = np.asarray([0, 5, 1, 1, 1], dtype="<i4").tobytes()
    with pytest.raises(InvalidArgument, match="'genres': offsets do not run from 0"):
        BlockView(bad_offsets, feature_set.version)


def test_the_layout_follows_the_declared_item_features(feature_set: FeatureSet) -> None:
    layout = ItemLayout.of(feature_set)
    assert layout.packed == ("category", "length", "popularity", "item_clicks")
    assert layout.coded == {"category"}
    assert layout.lists == ("genres", "item_viewers")
    assert layout.maps == ("item_clicks_by_age",)
