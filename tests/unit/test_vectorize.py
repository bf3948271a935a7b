from __future__ import annotations

import math
import random

import numpy as np
import pytest

from recmesh.features.vectorize import (
    CATEGORY_VOCAB,
    COLUMNS,
    DENSE_COLUMNS,
    build_matrix,
    item_bucket,
    item_columns,
    matrix_from_columns,
)


def test_columns_from_features() -> None:
    user = {"clicks_5m": 3, "category_clicks_10m": {"news": 3, "food": 1},
            "last_viewed_3": ["i1"], "interest_tags": ["news"], "age_band": "25-34"}  # fmt: skip
    item = {"category": "news", "clicks_10m": 4, "views_10m": 20, "popularity": 9.0,
            "length": 600, "author_level": 5}  # fmt: skip
    row = dict(zip(COLUMNS, item_columns(user, item, "i1"), strict=True))
    assert row["u_clicks_5m_log"] == math.log1p(3)
    assert row["u_cat_share_10m"] == 0.75
    assert row["u_item_recent"] == 1.0
    assert row["u_interest_match"] == 1.0
    assert row["i_ctr_10m"] == 5 / 30
    assert row["i_length_norm"] == 1.0
    assert row["i_author_level_norm"] == 1.0
    assert row["x_interest_popularity"] == math.log1p(9.0)
    assert row["i_id_bucket"] == item_bucket("i1") == item_bucket("i1")
    assert row["i_category_index"] == CATEGORY_VOCAB.index("news")
    assert (row["u_intent_news"], row["u_intent_food"], row["u_intent_music"]) == (0.75, 0.25, 0.0)


def test_missing_features_take_their_defaults() -> None:
    m = build_matrix({}, [("i1", {}), ("i2", {})])
    assert m.shape == (2, len(COLUMNS))
    assert float(m[0][COLUMNS.index("i_ctr_10m")]) == pytest.approx(0.1)
    dense = m[:, : len(DENSE_COLUMNS)]
    assert float(abs(dense).sum()) == pytest.approx(0.2)  # only the smoothed CTR is non-zero
    assert m[0][COLUMNS.index("i_category_index")] == 0  # unknown category
    assert float(m[:, COLUMNS.index("u_intent_unknown") :].sum()) == 0  # no recent clicks, no intent


def _random_case(rng: random.Random) -> tuple[dict[str, object], list[str], dict[str, list[object]]]:
    cats = [*CATEGORY_VOCAB[1:5], "not-in-vocab"]
    user: dict[str, object] = {}
    if rng.random() < 0.8:
        user = {
            "clicks_5m": rng.randrange(0, 50),
            "category_clicks_10m": {c: rng.randrange(0, 9) for c in rng.sample(cats, rng.randrange(0, 4))},
            "last_viewed_3": [f"i{rng.randrange(40)}" for _ in range(rng.randrange(0, 4))],
            "interest_tags": rng.sample(cats, rng.randrange(0, 3)),
            "age_band": rng.choice(["18-24", "55+", "unknown", "odd"]),
        }
    ids = [f"i{rng.randrange(40)}" for _ in range(rng.randrange(1, 30))]
    columns: dict[str, list[object]] = {
        "category": [rng.choice(cats) for _ in ids],
        "clicks_10m": [float(rng.randrange(0, 100)) for _ in ids],
        "views_10m": [float(rng.randrange(0, 500)) for _ in ids],
        "popularity": [rng.uniform(0, 1e4) for _ in ids],
        "length": [float(rng.randrange(0, 9000)) for _ in ids],
        "author_level": [float(rng.randrange(0, 6)) for _ in ids],
    }
    for name in rng.sample(sorted(columns), rng.randrange(0, 3)):
        del columns[name]  # absent columns take their defaults on both paths
    return user, ids, columns


def test_columnwise_matrix_equals_the_row_definition() -> None:
    rng = random.Random(7)
    for _ in range(300):
        user, ids, columns = _random_case(rng)
        rows = [(iid, {name: col[k] for name, col in columns.items()}) for k, iid in enumerate(ids)]
        expected = build_matrix(user, rows)
        got = matrix_from_columns(user, ids, {k: np.asarray(v) if k != "category" else v
                                              for k, v in columns.items()})  # fmt: skip
        np.testing.assert_array_equal(got, expected)


def test_columnwise_matrix_of_no_features_is_the_defaults() -> None:
    np.testing.assert_array_equal(matrix_from_columns({}, ["i1", "i2"], {}),
                                  build_matrix({}, [("i1", {}), ("i2", {})]))  # fmt: skip
