"""Feature values <-> protobuf, in one place for the server and its clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recmesh.features.definitions import FeatureValue
from recmesh.v1 import features_pb2 as pb

SOURCE_TO_PB = {
    "realtime": pb.FEATURE_SOURCE_REALTIME,
    "offline": pb.FEATURE_SOURCE_OFFLINE,
    "default": pb.FEATURE_SOURCE_DEFAULT,
}
PB_TO_SOURCE = {v: k for k, v in SOURCE_TO_PB.items()}


def to_pb(value: FeatureValue, source: str, age_ms: int) -> pb.FeatureValue:
    fv = pb.FeatureValue(source=SOURCE_TO_PB[source], age_ms=age_ms)
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


def row_to_pb(entity_id: str, values: Mapping[str, tuple[FeatureValue, str, int]]) -> pb.FeatureRow:
    row = pb.FeatureRow(entity_id=entity_id)
    for name, (value, source, age) in values.items():
        row.features[name].CopyFrom(to_pb(value, source, age))
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
        }
        for name, fv in sorted(row.features.items())
    }
