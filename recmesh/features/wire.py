"""Feature values <-> protobuf, in one place for the server and its clients."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recmesh.features.compute import freshness
from recmesh.features.repository import FeatureSet, FeatureValue
from recmesh.v1 import features_pb2 as pb

SOURCE_TO_PB = {
    "realtime": pb.FEATURE_SOURCE_REALTIME,
    "offline": pb.FEATURE_SOURCE_OFFLINE,
    "default": pb.FEATURE_SOURCE_DEFAULT,
}
PB_TO_SOURCE = {v: k for k, v in SOURCE_TO_PB.items()}


@dataclass(frozen=True, slots=True)
class Column:
    """One feature for many entities, in request order: values, and per entity
    its source ('realtime', 'offline', 'default') and age in ms (-1 unknown)."""

    values: list[FeatureValue]
    sources: list[str]
    ages: list[int]


def to_pb(value: FeatureValue, source: str, age_ms: int, fresh: float = 0.0) -> pb.FeatureValue:
    fv = pb.FeatureValue(source=SOURCE_TO_PB[source], age_ms=age_ms, freshness=fresh)
    if isinstance(value, str):
        fv.text = value
    elif isinstance(value, list):
        fv.strings.values.extend(value)
    elif isinstance(value, dict):
        fv.counts.SetInParent()
        fv.counts.counts.update(value)
    else:
        fv.number = float(value)
    return fv


def freshness_of(feature_set: FeatureSet, name: str, source: str, age_ms: int) -> float:
    """The freshness score served with a feature value: real-time values only."""
    if source != "realtime":
        return 0.0
    return freshness(age_ms, feature_set.by_name[name].freshness_tau_s)


def row_to_pb(
    feature_set: FeatureSet, entity_id: str, values: Mapping[str, tuple[FeatureValue, str, int]]
) -> pb.FeatureRow:
    row = pb.FeatureRow(entity_id=entity_id)
    for name, (value, source, age) in values.items():
        row.features[name].CopyFrom(to_pb(value, source, age, freshness_of(feature_set, name, source, age)))
    return row


def from_pb(fv: pb.FeatureValue) -> FeatureValue:
    kind = fv.WhichOneof("value")
    if kind == "number":
        n = fv.number
        return int(n) if n.is_integer() else n
    if kind == "text":
        return fv.text
    if kind == "strings":
        return list(fv.strings.values)
    if kind == "counts":
        return dict(fv.counts.counts)
    return 0


def row_values(row: pb.FeatureRow) -> dict[str, FeatureValue]:
    return {name: from_pb(fv) for name, fv in row.features.items()}


def row_to_json(row: pb.FeatureRow) -> dict[str, Any]:
    """Readable form with provenance, for the CLI and logs."""
    return {
        name: {
            "value": from_pb(fv),
            "source": PB_TO_SOURCE.get(fv.source, "unknown"),
            "age_ms": fv.age_ms,
            "freshness": fv.freshness,
        }
        for name, fv in sorted(row.features.items())
    }


def _freshness_column(ages: list[int], tau_s: float) -> list[float]:
    """`freshness` over a column of ages (the same expression, hence the same
    floats), without a Python call per entity."""
    scale = tau_s * 1000.0
    return [0.0 if a < 0 else float(2.0 ** (-a / scale)) for a in ages]


def _source_codes(sources: list[str]) -> list[pb.FeatureSource]:
    # Most columns have one source throughout (all real-time, all offline).
    if sources and sources.count(sources[0]) == len(sources):
        return [SOURCE_TO_PB[sources[0]]] * len(sources)
    return list(map(SOURCE_TO_PB.__getitem__, sources))


def columns_to_pb(
    feature_set: FeatureSet,
    entity_ids: list[str],
    columns: Mapping[str, Column],
    table: pb.FeatureTable | None = None,
) -> pb.FeatureTable:
    """Columns straight into a FeatureTable (`table`, e.g. a response's own
    field, which spares copying the finished table in): a few `extend` calls
    per feature, no per-entity Python objects for numeric and text features.

    Numbers go in as floats: upb converts an int to a double field ~4x slower
    than a float, which made ints the largest cost of a 200-item answer.
    """
    if table is None:
        table = pb.FeatureTable()
    table.entity_ids.extend(entity_ids)
    freshness_seen: tuple[list[int], float, list[float]] | None = None
    for name, column in columns.items():
        col = table.columns.add(name=name)
        col.sources.extend(_source_codes(column.sources))
        col.age_ms.extend(column.ages)
        definition = feature_set.by_name[name]
        if definition.kind == "realtime":
            tau_s = definition.freshness_tau_s
            # Sources other than 'realtime' carry age -1, hence freshness 0.
            # Item windows share their ages (clicks and views): compute once.
            if freshness_seen is not None and freshness_seen[1] == tau_s and freshness_seen[0] is column.ages:
                scores = freshness_seen[2]
            else:
                scores = _freshness_column(column.ages, tau_s)
                freshness_seen = (column.ages, tau_s, scores)
            col.freshness.extend(scores)
        dtype = definition.dtype
        if dtype in ("int", "float"):
            col.numbers.extend(list(map(float, column.values)))  # type: ignore[arg-type]
        elif dtype == "str":
            col.texts.extend(column.values)  # type: ignore[arg-type]
        elif dtype == "strings":
            for v in column.values:
                col.string_lists.add().values.extend(v)  # type: ignore[arg-type]
        else:
            for v in column.values:
                col.count_maps.add().counts.update(v)  # type: ignore[arg-type]
    return table


def _column_values(col: pb.FeatureColumn, feature_set: FeatureSet | None = None) -> list[FeatureValue]:
    """A column's values; integer features come back as ints (with `fs`, by
    their declared type; without, when every value is whole)."""
    if col.numbers:
        f = feature_set.by_name.get(col.name) if feature_set is not None else None
        if f is not None:
            return [int(v) for v in col.numbers] if f.dtype == "int" else list(col.numbers)
        numbers: list[FeatureValue] = list(col.numbers)
        return [int(v) for v in col.numbers] if all(v.is_integer() for v in col.numbers) else numbers
    if col.texts:
        return list(col.texts)
    if col.string_lists:
        return [list(s.values) for s in col.string_lists]
    if col.count_maps:
        return [dict(m.counts) for m in col.count_maps]
    f = feature_set.by_name.get(col.name) if feature_set is not None else None
    return [f.default if f is not None else 0] * len(col.sources)


def table_rows(
    table: pb.FeatureTable, feature_set: FeatureSet | None = None
) -> dict[str, dict[str, FeatureValue]]:
    """entity_id -> {feature: value}."""
    rows: dict[str, dict[str, FeatureValue]] = {eid: {} for eid in table.entity_ids}
    ids = list(table.entity_ids)
    for col in table.columns:
        for eid, value in zip(ids, _column_values(col, feature_set), strict=True):
            rows[eid][col.name] = value
    return rows


def table_columns(table: pb.FeatureTable, feature_set: FeatureSet | None = None) -> dict[str, list[Any]]:
    """feature -> one value per entity, in the table's order, straight from its
    columns for vectorising: numeric columns stay floats as sent."""
    return {
        col.name: list(col.numbers) if col.numbers else _column_values(col, feature_set)
        for col in table.columns
    }


def table_to_json(table: pb.FeatureTable, feature_set: FeatureSet | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"item_id": eid, "features": {}} for eid in table.entity_ids]
    for col in sorted(table.columns, key=lambda c: c.name):
        values = _column_values(col, feature_set)
        for i, row in enumerate(out):
            row["features"][col.name] = {
                "value": values[i],
                "source": PB_TO_SOURCE.get(col.sources[i], "unknown"),
                "age_ms": col.age_ms[i],
                "freshness": col.freshness[i] if col.freshness else 0.0,
            }
    return out
