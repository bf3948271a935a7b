"""Feature rows -> model input columns, used by training and by the ranker.

One function on both sides, so the model sees the same numbers offline and
online. The column list is part of the model's input schema: the inference
service refuses rows whose column names or feature-set version differ from
what its model was trained on.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from recmesh.demo.generate import CATEGORIES
from recmesh.features.definitions import BY_NAME

AGE_BANDS = ("unknown", "18-24", "25-34", "35-44", "45-54", "55+")

# Columns built from real-time features (dropped by the offline-only baseline model).
REALTIME_COLUMNS = (
    "u_clicks_5m_log",
    "u_cat_share_10m",
    "u_item_recent",
    "i_clicks_10m_log",
    "i_views_10m_log",
    "i_ctr_10m",
)
OFFLINE_COLUMNS = (
    "u_interest_match",
    "u_age_band",
    "i_popularity_log",
    "i_length_norm",
    "i_author_level_norm",
    "x_interest_popularity",
)
DENSE_COLUMNS = REALTIME_COLUMNS + OFFLINE_COLUMNS
# Columns that feed the model's learnt embeddings (recmesh.training.family):
# the item id hashed into ITEM_BUCKETS rows, the item category's index, and the
# user's category distribution over the last 10 minutes (real-time), from
# which the model builds a user-intent vector. Values are integers or shares
# carried as floats; the model clips indices into range.
CATEGORY_VOCAB: tuple[str, ...] = ("unknown", *CATEGORIES)
ITEM_BUCKETS = 4096
ID_COLUMNS = ("i_id_bucket", "i_category_index")
INTENT_COLUMNS = tuple(f"u_intent_{c}" for c in CATEGORY_VOCAB)
COLUMNS: tuple[str, ...] = DENSE_COLUMNS + ID_COLUMNS + INTENT_COLUMNS


def _get(row: Mapping[str, Any], name: str) -> Any:
    value = row.get(name)
    return BY_NAME[name].default if value is None else value


def item_bucket(item_id: str) -> int:
    """A stable hash of the item id (the same in every process, unlike hash())."""
    return zlib.crc32(item_id.encode()) % ITEM_BUCKETS


def item_columns(user: Mapping[str, Any], item: Mapping[str, Any], item_id: str) -> list[float]:
    category = str(_get(item, "category"))
    cat_clicks: Mapping[str, int] = _get(user, "category_clicks_10m")
    total = sum(cat_clicks.values())
    i_clicks = int(_get(item, "clicks_10m"))
    i_views = int(_get(item, "views_10m"))
    interest = 1.0 if category in _get(user, "interest_tags") else 0.0
    pop_log = math.log1p(float(_get(item, "popularity")))
    age_band = str(_get(user, "age_band"))
    return [
        math.log1p(int(_get(user, "clicks_5m"))),
        cat_clicks.get(category, 0) / total if total else 0.0,
        1.0 if item_id in _get(user, "last_viewed_3") else 0.0,
        math.log1p(i_clicks),
        math.log1p(i_views),
        (i_clicks + 1.0) / (i_views + 10.0),
        interest,
        AGE_BANDS.index(age_band) / (len(AGE_BANDS) - 1) if age_band in AGE_BANDS else 0.0,
        pop_log,
        min(int(_get(item, "length")), 3600) / 600.0,
        int(_get(item, "author_level")) / 5.0,
        interest * pop_log,
        float(item_bucket(item_id)),
        float(CATEGORY_VOCAB.index(category) if category in CATEGORY_VOCAB else 0),
        *((cat_clicks.get(c, 0) / total if total else 0.0) for c in CATEGORY_VOCAB),
    ]


def build_matrix(
    user: Mapping[str, Any], items: Sequence[tuple[str, Mapping[str, Any]]]
) -> npt.NDArray[np.float32]:
    """One row per (item_id, item features), columns as COLUMNS."""
    matrix = np.empty((len(items), len(COLUMNS)), dtype=np.float32)
    for i, (item_id, item) in enumerate(items):
        matrix[i] = item_columns(user, item, item_id)
    return matrix


ItemColumn = Sequence[Any] | npt.NDArray[np.float64]

# The item features item_columns reads, and how it reads them (int() truncates).
_ITEM_NUMBERS = {"clicks_10m": True, "views_10m": True, "popularity": False, "length": True,
                 "author_level": True}  # fmt: skip
_VOCAB_INDEX = {c: float(n) for n, c in enumerate(CATEGORY_VOCAB)}


def matrix_from_columns(
    user: Mapping[str, Any], item_ids: Sequence[str], items: Mapping[str, ItemColumn]
) -> npt.NDArray[np.float32]:
    """The same matrix as `build_matrix`, from item features held column-wise
    (feature -> one value per item, in `item_ids` order; a missing feature takes
    its default), as the feature service sends them: NumPy over each column
    instead of a Python row per item. `item_columns` stays the definition;
    tests hold the two equal."""
    n = len(item_ids)

    def number(name: str) -> npt.NDArray[np.float64]:
        col = items.get(name)
        if col is None or len(col) == 0:
            col = [BY_NAME[name].default] * n
        values = np.asarray(col, dtype=np.float64)
        return np.trunc(values) if _ITEM_NUMBERS[name] else values

    text = items.get("category")
    default_category = str(BY_NAME["category"].default)
    categories = [str(c) for c in text] if text is not None and len(text) else [default_category] * n
    cat_clicks: Mapping[str, int] = _get(user, "category_clicks_10m")
    total = sum(cat_clicks.values())
    interests = _get(user, "interest_tags")
    recent = _get(user, "last_viewed_3")
    age_band = str(_get(user, "age_band"))
    clicks, views, popularity = number("clicks_10m"), number("views_10m"), number("popularity")
    interest = np.array([1.0 if c in interests else 0.0 for c in categories])
    pop_log = np.log1p(popularity)
    intent = [cat_clicks.get(c, 0) / total if total else 0.0 for c in CATEGORY_VOCAB]
    out = np.empty((n, len(COLUMNS)), dtype=np.float64)
    out[:, 0] = math.log1p(int(_get(user, "clicks_5m")))
    out[:, 1] = [cat_clicks.get(c, 0) / total if total else 0.0 for c in categories]
    out[:, 2] = [1.0 if i in recent else 0.0 for i in item_ids]
    out[:, 3] = np.log1p(clicks)
    out[:, 4] = np.log1p(views)
    out[:, 5] = (clicks + 1.0) / (views + 10.0)
    out[:, 6] = interest
    out[:, 7] = AGE_BANDS.index(age_band) / (len(AGE_BANDS) - 1) if age_band in AGE_BANDS else 0.0
    out[:, 8] = pop_log
    out[:, 9] = np.minimum(number("length"), 3600.0) / 600.0
    out[:, 10] = number("author_level") / 5.0
    out[:, 11] = interest * pop_log
    out[:, 12] = [item_bucket(i) for i in item_ids]
    out[:, 13] = [_VOCAB_INDEX.get(c, 0.0) for c in categories]
    out[:, 14:] = intent
    return out.astype(np.float32)
