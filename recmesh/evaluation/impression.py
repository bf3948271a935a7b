"""The impression record: what one answered recommendation showed, by which model.

One JSON record per answer on the `impressions` topic, keyed by user (the
gateway writes it, services/gateway/impressions.py; attribution reads it):

    {"request_id", "user_id", "items": [{"item_id", "position", "score"}],
     "model_version", "feature_version", "ladder", "degraded": [...],
     "slo_class", "arm", "as_of_ms", "served_at_ms", "trace_id",
     "shadow": {"model_version", "scores": [...]}}       (only under --shadow)

`ladder` is the degradation level served (`full`: none), `arm` the experiment
arm, `shadow` a candidate model's scores of the same items, in their order,
which it scored without deciding their order. `record` builds it, `parse`
reads it back; nothing else spells its fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from recmesh.errors import InvalidArgument

CONTROL = "control"  # the arm of every request when traffic is not split
FULL = "full"  # the ladder level of an answer served with nothing degraded


def ladder(degraded: Sequence[str]) -> str:
    """The degradation level a recommendation was served at (`full`: none)."""
    return next((d.split(":", 1)[1] for d in degraded if d.startswith("ladder:")), FULL)


@dataclass(frozen=True, slots=True)
class Group:
    """What an answer's figures are added up by."""

    model_version: str
    ladder: str
    slo_class: str
    arm: str


@dataclass(frozen=True, slots=True)
class Shadow:
    model_version: str
    scores: tuple[float, ...]  # aligned with Shown.items


@dataclass(frozen=True, slots=True)
class Shown:
    """An impression as attribution keeps it."""

    request_id: str
    user_id: str
    as_of_ms: int
    items: tuple[str, ...]  # in served order: position 1 first
    scores: tuple[float, ...]
    group: Group
    shadow: Shadow | None = None


def record(
    *,
    request_id: str,
    user_id: str,
    items: Sequence[tuple[str, float]],
    model_version: str,
    feature_version: str,
    degraded: Sequence[str],
    slo_class: str,
    arm: str,
    as_of_ms: int,
    served_at_ms: int,
    trace_id: str,
    shadow: Shadow | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request_id": request_id,
        "user_id": user_id,
        "items": [{"item_id": i, "position": n, "score": s} for n, (i, s) in enumerate(items, start=1)],
        "model_version": model_version,
        "feature_version": feature_version,
        "ladder": ladder(degraded),
        "degraded": list(degraded),
        "slo_class": slo_class,
        "arm": arm,
        "as_of_ms": as_of_ms,
        "served_at_ms": served_at_ms,
        "trace_id": trace_id,
    }
    if shadow is not None:
        out["shadow"] = {"model_version": shadow.model_version, "scores": list(shadow.scores)}
    return out


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"impression: {name} must be a non-empty string")
    return value


def parse(raw: bytes) -> Shown:
    """One impression record; InvalidArgument naming what is wrong."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise InvalidArgument(f"impression: not JSON: {err}") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("impression: not a JSON object")
    as_of = obj.get("as_of_ms")
    if not isinstance(as_of, int) or isinstance(as_of, bool):
        raise InvalidArgument("impression: as_of_ms must be an integer (epoch ms)")
    raw_items = obj.get("items")
    if not isinstance(raw_items, list):
        raise InvalidArgument("impression: items must be a list")
    try:
        ordered = sorted(raw_items, key=lambda i: int(i["position"]))
        items = tuple(str(i["item_id"]) for i in ordered)
        scores = tuple(float(i["score"]) for i in ordered)
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidArgument(f"impression: items need item_id, position and score ({err!r})") from None
    shadow = None
    if isinstance(obj.get("shadow"), dict):
        sh = obj["shadow"]
        shadow_scores = sh.get("scores")
        if not isinstance(shadow_scores, list) or len(shadow_scores) != len(items):
            raise InvalidArgument("impression: shadow.scores must give one score per item")
        shadow = Shadow(_text(sh, "model_version"), tuple(float(s) for s in shadow_scores))
    group = Group(
        _text(obj, "model_version"),
        str(obj.get("ladder") or FULL),
        _text(obj, "slo_class"),
        str(obj.get("arm") or CONTROL),
    )
    return Shown(_text(obj, "request_id"), _text(obj, "user_id"), as_of, items, scores, group, shadow)
