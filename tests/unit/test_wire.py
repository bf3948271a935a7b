"""Feature values to protobuf and back: provenance and freshness scores travel with them."""

from __future__ import annotations

import pytest

from recmesh.features.definitions import BY_NAME, FEATURES
from recmesh.features.wire import Column, columns_to_pb, row_to_json, row_to_pb, table_rows, table_to_json


def test_every_realtime_feature_declares_a_positive_tau() -> None:
    assert all(f.freshness_tau_s > 0 for f in FEATURES if f.kind == "realtime")
    assert BY_NAME["clicks_10m"].freshness_tau_s == 60.0  # the design notes' default


def test_row_carries_freshness_for_realtime_values_only() -> None:
    tau = BY_NAME["clicks_5m"].freshness_tau_s
    row = row_to_pb(
        "u1",
        {
            "clicks_5m": (2, "realtime", int(tau * 1000)),
            "last_viewed_3": ([], "realtime", -1),
            "age_band": ("25-34", "offline", -1),
        },
    )
    out = row_to_json(row)
    assert out["clicks_5m"]["freshness"] == pytest.approx(0.5)
    assert out["last_viewed_3"]["freshness"] == 0.0
    assert out["age_band"]["freshness"] == 0.0


def test_columns_carry_values_provenance_and_freshness() -> None:
    cols = {
        "clicks_10m": Column([3, 0, 0], ["realtime", "realtime", "default"], [0, -1, -1]),
        "category": Column(["news", "unknown", "food"], ["offline", "default", "offline"], [-1, -1, -1]),
    }
    table = columns_to_pb(["i1", "i2", "i3"], cols)
    by_name = {c.name: c for c in table.columns}
    assert list(by_name["clicks_10m"].freshness) == [1.0, 0.0, 0.0]
    assert list(by_name["category"].freshness) == []  # offline: none sent
    assert table_rows(table)["i1"] == {"clicks_10m": 3, "category": "news"}
    first = table_to_json(table)[0]["features"]
    assert first["clicks_10m"] == {"value": 3, "source": "realtime", "age_ms": 0, "freshness": 1.0}
    assert first["category"]["freshness"] == 0.0
