"""The feature registry: every feature recmesh serves, declared once.

Bump FEATURE_SET_VERSION whenever a definition or its computation changes; the
model card records the version it was trained on and the inference service
refuses rows built from another one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FEATURE_SET_VERSION = "fs-v1"

Entity = Literal["user", "item"]
Kind = Literal["realtime", "offline"]
DType = Literal["int", "float", "str", "strings", "counts"]
FeatureValue = int | float | str | list[str] | dict[str, int]

MINUTE_MS = 60_000
DEFAULT_FRESHNESS_TAU_S = 60.0


@dataclass(frozen=True)
class FeatureDef:
    name: str
    entity: Entity
    kind: Kind
    dtype: DType
    default: FeatureValue
    description: str
    window_ms: int | None = None  # sliding window over event time, for real-time features
    version: int = 1
    # Real-time features: the age at which freshness 2^(-age/tau) halves
    # (design notes: tau = 60 s by default; risk control wants <= 30 s).
    freshness_tau_s: float = DEFAULT_FRESHNESS_TAU_S


FEATURES: tuple[FeatureDef, ...] = (
    # --- real-time, computed from the user_behavior stream ------------------
    FeatureDef("clicks_5m", "user", "realtime", "int", 0,
               "clicks by the user in (as_of - 5 min, as_of]", window_ms=5 * MINUTE_MS,
               freshness_tau_s=30.0),
    FeatureDef("category_clicks_10m", "user", "realtime", "counts", {},
               "category -> clicks by the user in (as_of - 10 min, as_of]",
               window_ms=10 * MINUTE_MS),
    FeatureDef("last_viewed_3", "user", "realtime", "strings", [],
               "distinct item ids among the user's 10 latest view/click events "
               "in (as_of - 1 h, as_of], newest first, at most 3",
               window_ms=60 * MINUTE_MS, freshness_tau_s=120.0),
    FeatureDef("clicks_10m", "item", "realtime", "int", 0,
               "clicks on the item in (as_of - 10 min, as_of]", window_ms=10 * MINUTE_MS),
    FeatureDef("views_10m", "item", "realtime", "int", 0,
               "views of the item in (as_of - 10 min, as_of]", window_ms=10 * MINUTE_MS),
    # --- offline / static, loaded by `recmesh features load-offline` --------
    FeatureDef("age_band", "user", "offline", "str", "unknown", "age band, e.g. '25-34'"),
    FeatureDef("interest_tags", "user", "offline", "strings", [],
               "categories the user declared or was profiled into"),
    FeatureDef("category", "item", "offline", "str", "unknown", "item category"),
    FeatureDef("length", "item", "offline", "int", 0, "content length in seconds"),
    FeatureDef("author_level", "item", "offline", "int", 0, "author tier 1..5 (0 unknown)"),
    FeatureDef("popularity", "item", "offline", "float", 0.0,
               "long-run popularity from batch counts (recall and model input)"),
)  # fmt: skip

BY_NAME: dict[str, FeatureDef] = {f.name: f for f in FEATURES}


def features_of(entity: Entity, kind: Kind | None = None) -> tuple[FeatureDef, ...]:
    return tuple(f for f in FEATURES if f.entity == entity and (kind is None or f.kind == kind))


# How long real-time state is kept after its newest event. It must cover the
# longest window plus the allowed lateness; state older than this is trimmed.
STATE_RETENTION_MS = max(f.window_ms or 0 for f in FEATURES)
# Keys expire this long after their last write (design notes: windowed state needs TTLs).
STATE_TTL_S = 60 * 60
# Newest entries kept per key, whatever their age, so one hot key cannot grow without bound.
MAX_EVENTS_PER_KEY = 2000
# How many of the latest view/click events `last_viewed_3` looks at.
LAST_VIEWED_SCAN = 10
