"""Feature values to protobuf and back: provenance and freshness scores travel with them."""

from __future__ import annotations

import pytest

from recmesh.features.repository import FeatureSet
from recmesh.features.wire import (
    Column,
    columns_to_pb,
    row_to_json,
    row_to_pb,
    row_values,
    table_columns,
    table_rows,
    table_to_json,
)
from recmesh.v1 import features_pb2 as pb


def test_every_realtime_feature_declares_a_positive_tau(demo_feature_set: FeatureSet) -> None:
    assert all(f.freshness_tau_s > 0 for f in demo_feature_set.features if f.kind == "realtime")
    assert (
        demo_feature_set.by_name["clicks_10m"].freshness_tau_s == 60.0
    )  # the design notes' default (undeclared)
    assert demo_feature_set.by_name["clicks_5m"].freshness_tau_s == 30.0  # declared: '30s'
    assert demo_feature_set.by_name["last_viewed_3"].freshness_tau_s == 120.0  # declared: '2m'


def test_row_carries_freshness_for_realtime_values_only(demo_feature_set: FeatureSet) -> None:
    tau = demo_feature_set.by_name["clicks_5m"].freshness_tau_s
    row = row_to_pb(
        demo_feature_set,
        "u1",
        {
            "clicks_5m": (2, "realtime", int(tau * 1000)),
            "last_viewed_3": ([], "realtime", -1),
            "age_band": ("25-34", "offline", -1),
            "category_clicks_10m": ({"news": 2}, "realtime", 0),
        },
    )
    out = row_to_json(row)
    assert out["clicks_5m"]["freshness"] == pytest.approx(0.5)
    assert out["last_viewed_3"]["freshness"] == 0.0
    assert out["age_band"]["freshness"] == 0.0
    assert out["category_clicks_10m"]["freshness"] == 1.0
    assert row_values(row) == {
        "clicks_5m": 2, "last_viewed_3": [], "age_band": "25-34", "category_clicks_10m": {"news": 2},
    }  # fmt: skip


def test_columns_carry_values_provenance_and_freshness(demo_feature_set: FeatureSet) -> None:
    cols = {
        "clicks_10m": Column([3, 0, 0], ["realtime", "realtime", "default"], [0, -1, -1]),
        "category": Column(["news", "unknown", "food"], ["offline", "default", "offline"], [-1, -1, -1]),
    }
    table = columns_to_pb(demo_feature_set, ["i1", "i2", "i3"], cols)
    by_name = {c.name: c for c in table.columns}
    assert list(by_name["clicks_10m"].freshness) == [1.0, 0.0, 0.0]
    assert list(by_name["category"].freshness) == []  # offline: none sent
    assert table_rows(table)["i1"] == {"clicks_10m": 3, "category": "news"}
    first = table_to_json(table)[0]["features"]
    assert first["clicks_10m"] == {"value": 3, "source": "realtime", "age_ms": 0, "freshness": 1.0}
    assert first["category"]["freshness"] == 0.0


def test_columns_into_a_given_table_and_back_by_declared_type(demo_feature_set: FeatureSet) -> None:
    resp = pb.GetFeaturesResponse()
    tau_ms = int(demo_feature_set.by_name["views_10m"].freshness_tau_s * 1000)
    cols = {
        "popularity": Column([2.0, 3.5], ["offline", "offline"], [-1, -1]),  # float, whole or not
        "length": Column([600, 30], ["offline", "offline"], [-1, -1]),
        "views_10m": Column([1, 4], ["realtime", "realtime"], [tau_ms, 0]),
    }
    out = columns_to_pb(demo_feature_set, ["i1", "i2"], cols, resp.items)
    assert out is resp.items and list(resp.items.entity_ids) == ["i1", "i2"]
    by_name = {c.name: c for c in resp.items.columns}
    assert list(by_name["views_10m"].freshness) == pytest.approx([0.5, 1.0])
    typed = table_rows(resp.items, demo_feature_set)
    assert typed["i1"] == {"popularity": 2.0, "length": 600, "views_10m": 1}
    assert isinstance(typed["i1"]["popularity"], float) and isinstance(typed["i1"]["length"], int)
    assert table_columns(resp.items, demo_feature_set) == {
        "popularity": [2.0, 3.5], "length": [600.0, 30.0], "views_10m": [1.0, 4.0],
    }  # fmt: skip


def test_lists_and_count_maps_travel_per_entity(demo_feature_set: FeatureSet) -> None:
    cols = {
        "last_viewed_3": Column([["a", "b"], []], ["realtime", "default"], [5, -1]),
        "category_clicks_10m": Column([{"news": 2}, {}], ["realtime", "default"], [5, -1]),
    }
    table = columns_to_pb(demo_feature_set, ["u1", "u2"], cols)
    assert table_rows(table, demo_feature_set) == {
        "u1": {"last_viewed_3": ["a", "b"], "category_clicks_10m": {"news": 2}},
        "u2": {"last_viewed_3": [], "category_clicks_10m": {}},
    }


def test_an_empty_column_reads_back_as_the_declared_default(demo_feature_set: FeatureSet) -> None:
    table = pb.FeatureTable(entity_ids=["i1", "i2"])
    col = table.columns.add(name="category")
    col.sources.extend([pb.FEATURE_SOURCE_DEFAULT] * 2)
    col.age_ms.extend([-1, -1])
    assert table_rows(table, demo_feature_set) == {
        "i1": {"category": "unknown"},
        "i2": {"category": "unknown"},
    }
