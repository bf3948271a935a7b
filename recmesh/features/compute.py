"""Aggregations shared by the online look-up and the offline replay.

A real-time feature is one aggregation (repository.AGGREGATES) over the events
of its stream that fall in its window. Windows are half-open over event time,
(as_of - window, as_of]: an event at exactly `as_of` counts, one at
`as_of - window` does not. Redis ZCOUNT / ZRANGEBYSCORE are called with the
same bounds ('(lo', 'hi'), so the two paths agree exactly.

Events arrive as `StreamEvent`s sorted ascending by (time, member), the order
Redis keeps a sorted set in; the offline replay sorts the same way, so ties
break alike and float sums add up in the same order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recmesh.features.repository import FIELD_SEP, VALUE_SEP, FeatureDef, FeatureValue, Stream, clean

StreamEvent = tuple[int, str]  # (event time ms, member)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each part of a stream's member sits (split on FIELD_SEP)."""

    other: int  # index of the other entity's id, -1 when not carried
    attrs: dict[str, int]
    values: dict[str, int]

    @classmethod
    def of(cls, stream: Stream) -> Layout:
        at = 1
        other = -1
        if stream.other_id:
            other, at = at, at + 1
        attrs = {a: at + n for n, a in enumerate(stream.attrs)}
        at += len(stream.attrs)
        values = {v: at + n for n, v in enumerate(stream.values)}
        return cls(other, attrs, values)


def attribute_text(value: Any) -> str:
    """An offline value as an event attribute: text; a multi-value joined by VALUE_SEP."""
    if isinstance(value, list):
        return VALUE_SEP.join(clean(str(v)) for v in value)
    return clean(str(value))


def encode_member(
    stream: Stream, event_id: str, other_id: str, attrs: dict[str, str], values: dict[str, float]
) -> str:
    """The stored member of one event in `stream` (attribute values already cleaned;
    multi-valued attributes joined with VALUE_SEP; a missing value is empty)."""
    if not stream.payload:
        return event_id
    parts = [event_id]
    if stream.other_id:
        parts.append(other_id)
    parts.extend(attrs.get(a, "") for a in stream.attrs)
    for v in stream.values:
        x = values.get(v)
        parts.append("" if x is None else repr(float(x)))
    return FIELD_SEP.join(parts)


def window_bounds(as_of_ms: int, window_ms: int) -> tuple[int, int]:
    return as_of_ms - window_ms, as_of_ms


def _default(f: FeatureDef) -> FeatureValue:
    d = f.default
    return list(d) if isinstance(d, list) else dict(d) if isinstance(d, dict) else d


def _agg_count(
    f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int
) -> FeatureValue:
    return i1 - i0


def _agg_last_n(
    f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int
) -> FeatureValue:
    out: list[str] = []
    for _, member in reversed(events[max(i0, i1 - f.scan) : i1]):
        other = member.split(FIELD_SEP)[layout.other]
        if other not in out:
            out.append(other)
            if len(out) == f.n:
                break
    return out


def _agg_count_by(
    f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int
) -> FeatureValue:
    at = layout.attrs[f.by or ""]
    counts: dict[str, int] = {}
    for _, member in events[i0:i1]:
        for v in member.split(FIELD_SEP)[at].split(VALUE_SEP):
            if v:
                counts[v] = counts.get(v, 0) + 1
    return counts


def _field_total(
    f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int
) -> tuple[float, int]:
    """(sum, count) of the non-empty values of `f.field` in events[i0:i1], added in event order."""
    at = layout.values[f.field or ""]
    total, n = 0.0, 0
    for _, member in events[i0:i1]:
        raw = member.split(FIELD_SEP)[at]
        if raw:
            total += float(raw)
            n += 1
    return total, n


def _agg_sum(f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int) -> FeatureValue:
    return _field_total(f, layout, events, i0, i1)[0]


def _agg_mean(f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], i0: int, i1: int) -> FeatureValue:
    total, n = _field_total(f, layout, events, i0, i1)
    return total / n if n else _default(f)


_Aggregator = Callable[[FeatureDef, Layout, Sequence[StreamEvent], int, int], FeatureValue]
# One per repository.AGGREGATES kind: the value over events[i0:i1] (a non-empty window).
_AGGREGATORS: dict[str | None, _Aggregator] = {
    "count": _agg_count,
    "last_n": _agg_last_n,
    "count_by": _agg_count_by,
    "sum": _agg_sum,
    "mean": _agg_mean,
}


def aggregate(
    f: FeatureDef, layout: Layout, events: Sequence[StreamEvent], as_of_ms: int
) -> tuple[FeatureValue, int]:
    """(value, age_ms) of real-time feature `f` over its stream's `events`
    (ascending by (time, member), possibly reaching beyond its window on
    either side). age_ms is as_of minus the newest event in the window, -1
    when the window is empty (the value is then the feature's default)."""
    assert f.window_ms is not None
    lo, hi = window_bounds(as_of_ms, f.window_ms)
    times = [t for t, _ in events]
    i0, i1 = bisect.bisect_right(times, lo), bisect.bisect_right(times, hi)
    if i0 >= i1:
        return _default(f), -1
    return _AGGREGATORS.get(f.aggregate, _agg_mean)(f, layout, events, i0, i1), hi - times[i1 - 1]


def count_in_window(sorted_times: Sequence[int], lo_exclusive: int, hi_inclusive: int) -> int:
    """Events with lo < t <= hi in an ascending list: the offline twin of ZCOUNT '(lo' 'hi'."""
    return bisect.bisect_right(sorted_times, hi_inclusive) - bisect.bisect_right(sorted_times, lo_exclusive)


def newest_at_or_before(sorted_times: Sequence[int], hi_inclusive: int) -> int | None:
    idx = bisect.bisect_right(sorted_times, hi_inclusive)
    return sorted_times[idx - 1] if idx else None


def freshness(age_ms: int, tau_s: float) -> float:
    """2^(-age/tau): 1.0 for an event at the as-of time, 0.5 one tau older;
    0.0 when no event is behind the value (age < 0)."""
    if age_ms < 0:
        return 0.0
    return float(2.0 ** (-age_ms / (tau_s * 1000.0)))


def count_columns(
    stream: Stream, counts: Sequence[Sequence[int]], newest_ms: Sequence[int], as_of_ms: int
) -> dict[str, tuple[list[FeatureValue], list[int]]]:
    """The count features of a 'count' stream for many items at once, column-wise:
    `counts[w]` holds each item's count in the stream's w-th window (widest
    first), `newest_ms` each item's newest event in the widest window (-1
    none). name -> (values, ages) in input order; features with the same
    window share one ages list (read-only downstream). No per-item objects."""
    out: dict[str, tuple[list[FeatureValue], list[int]]] = {}
    ages_by_window: dict[int, list[int]] = {}
    for f in stream.features:
        assert f.window_ms is not None
        w = stream.windows.index(f.window_ms)
        col = counts[w]
        ages = ages_by_window.get(w)
        if ages is None:
            if w == 0:
                ages = [-1 if t < 0 else as_of_ms - t for t in newest_ms]
            else:
                # A narrower window's newest event is the widest's when it falls inside.
                lo = as_of_ms - f.window_ms
                ages = [
                    -1 if t <= lo or c == 0 else as_of_ms - t for t, c in zip(newest_ms, col, strict=True)
                ]
            ages_by_window[w] = ages
        out[f.name] = (list(col), ages)
    return out
