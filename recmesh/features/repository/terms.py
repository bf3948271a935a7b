"""The terms a repository is written in: entities, kinds, dtypes, aggregates,
their defaults, valid names and durations (shared by the declarations and the
compiled FeatureSet)."""

from __future__ import annotations

import re
from typing import Literal

Entity = Literal["user", "item"]
Kind = Literal["realtime", "offline"]
DType = Literal["int", "float", "str", "strings", "counts"]
FeatureValue = int | float | str | list[str] | dict[str, int]
Aggregate = Literal["count", "count_by", "last_n", "sum", "mean"]
OfflineType = Literal["categorical", "numeric", "integer", "multi"]
TimeUnit = Literal["s", "ms", "us", "ns", "iso8601"]

ENTITIES: tuple[Entity, Entity] = ("user", "item")
AGGREGATES: dict[str, str] = {
    "count": "events in the window (int)",
    "count_by": "events in the window grouped by an attribute of the other entity, e.g. clicks per "
    "item category (attribute value -> count); a multi-valued attribute counts once per value",
    "last_n": "the other entity's distinct ids among the newest `scan` events in the window, newest "
    "first, at most `n` (list)",
    "sum": "sum of a numeric event field over the window (float)",
    "mean": "mean of a numeric event field over the window (float; the default when empty)",
}
DTYPE_OF_AGGREGATE: dict[str, DType] = {
    "count": "int", "count_by": "counts", "last_n": "strings", "sum": "float", "mean": "float",
}  # fmt: skip
DTYPE_OF_OFFLINE: dict[str, DType] = {
    "categorical": "str", "numeric": "float", "integer": "int", "multi": "strings",
}  # fmt: skip
DEFAULT_OF: dict[DType, FeatureValue] = {
    "int": 0,
    "float": 0.0,
    "str": "unknown",
    "strings": [],
    "counts": {},
}

DEFAULT_FRESHNESS_TAU_S = 60.0
DEFAULT_TTL_S = 3600
DEFAULT_SCAN = 10
# Windows this long or longer are tiled by default (`slide` left out): see default_slide_ms.
TILED_FROM_MS = 3_600_000
# The slides a default is chosen from: each divides the next larger unit of time.
_NICE_SLIDES_MS = (
    1_000,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    900_000,
    1_800_000,
    3_600_000,
    7_200_000,
    10_800_000,
    14_400_000,
    21_600_000,
    43_200_000,
    86_400_000,
)
DEFAULT_TILES = 48  # at least this many tiles per window for a default slide


def default_slide_ms(window_ms: int) -> int:
    """The slide of a real-time feature that declares none: 0 (an exact window) below
    an hour; from an hour up, the largest 'round' slide that divides the window into
    at least DEFAULT_TILES tiles (1 h: 1 min, 1 d: 30 min, 7 d: 3 h). Why: the window
    then under-counts by at most one slide at its old end, about 2% of it at a steady
    rate, while a key holds about 50-60 tiles (Redis keeps a hash that small in its
    compact listpack encoding), whatever the traffic. Shorter windows stay exact:
    their per-event state is short-lived and their features react within seconds."""
    if window_ms < TILED_FROM_MS:
        return 0
    fits = [s for s in _NICE_SLIDES_MS if window_ms % s == 0 and window_ms // s >= DEFAULT_TILES]
    return fits[-1] if fits else 0


NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str | int | float) -> int:
    """'90s', '10m', '1h', '2d', '250ms', or a number of milliseconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of ms or a string like '10m'")
    if isinstance(value, int | float):
        ms = int(value)
    else:
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"{value!r} is not a duration: use e.g. '250ms', '30s', '10m', '1h', '2d'")
        ms = int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    if ms <= 0:
        raise ValueError("a duration must be above 0")
    return ms


Duration = str | int


def _duration(value: str | int, key: str) -> int:
    try:
        return parse_duration_ms(value)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
