"""Tiled windows: partial aggregates per time tile, summed over a window's tiles.

A feature with a slide S (repository `slide`, or terms.default_slide_ms) keeps,
per entity and stream, one partial aggregate per tile [k*S, (k+1)*S) of event
time instead of one member per event. As of time t its window is the tiles
k(t)-n+1 .. k(t), n = window / S, k(t) = t // S: Flink's
HOP(event_time, S, window) window that holds t, read as it stands (early
firing), so an event is readable as soon as its tile is written. Against the
exact window (t - window, t] it leaves out the events of (t - window,
(k(t)-n+1)*S), at most one slide at the old end, and it counts any event of
tile k(t) later than t (held only when the as-of time is in the past).

A tile's aggregate is a set of integer *components* (name -> int):
  n          events
  s<j>       sum of the stream's j-th value, in fixed point (value * SCALE, rounded)
  c<j>       events carrying the j-th value
  b<j>:<v>   events whose other entity has value v of the stream's j-th attribute
Integers add up the same in any order, so the stream (Redis HINCRBY, in
arrival order, with late events), the offline replay (in event-time order)
and any engine give bit-identical sums; `sum` and `mean` divide once at the end.

In Redis (services/feature/writer.py writes, store.py reads), per entity and
stream, one hash `<stream key>`: the tiles (fields '<k>:<component>') and the
window totals as of the newest tile (fields 'c': the newest tile written, 't':
the newest event time, 'w': every window's sums as of tile c in one value,
'<w>:<component>' US <sum> pairs joined by RS; on a Redis Cluster 'o:<partition>',
the offsets applied, instead of the totals). A look-up as of tile c reads the
totals alone (HMGET of three fields: cost in components, not events or tiles);
another as-of reads the tiles (LUA_TILES). The replay keeps the same tiles
in memory (TileState) and sums them the same way.

A `last_n` with a slide keeps instead the newest distinct other ids with the
time of their latest event, capped at `n` (a sorted set): its value is those
whose latest event is in the exact window (as_of - window, as_of], newest
first. Capping after every batch or every event leaves the same set.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recmesh.features.repository import VALUE_SEP, FeatureDef, FeatureValue, Stream

SCALE = 1_000_000  # fixed point of summed values: 1e-6 resolution, |sum| < 9.2e12 per tile
COUNT = "n"
# The tiles hash's fields other than tiles: the newest tile, the newest event time, the
# windows' totals (one field) and, on a cluster, the offsets applied ('o:<partition>').
NEWEST_TILE, NEWEST_TIME, TOTALS = "c", "t", "w"

Components = dict[str, int]


def fixed(value: float) -> int:
    return round(value * SCALE)


def components(
    stream: Stream, attrs: Mapping[str, str], values: Mapping[str, float]
) -> list[tuple[str, int]]:
    """One event's contribution to its tile: (component, delta), `attrs` the other
    entity's attribute texts (multi-valued ones joined by VALUE_SEP)."""
    out = [(COUNT, 1)]
    for j, name in enumerate(stream.values):
        x = values.get(name)
        if x is not None:
            out.append((f"s{j}", fixed(float(x))))
            out.append((f"c{j}", 1))
    for j, name in enumerate(stream.attrs):
        for v in attrs.get(name, "").split(VALUE_SEP):
            if v:
                out.append((f"b{j}:{v}", 1))
    return out


def tile_of(time_ms: int, slide_ms: int) -> int:
    return time_ms // slide_ms


def window_tiles(as_of_ms: int, window_ms: int, slide_ms: int) -> tuple[int, int]:
    """(first, last) tile of the window as of `as_of_ms`, both inclusive."""
    last = as_of_ms // slide_ms
    return last - window_ms // slide_ms + 1, last


def add(into: Components, parts: Iterable[tuple[str, int]]) -> None:
    for name, delta in parts:
        into[name] = into.get(name, 0) + delta


# A tile in memory (TileState): its components, or, while it holds nothing but
# its events' count, that count alone: a count-only stream's tile costs an int
# in the tiles dict instead of a one-entry dict (about 180 bytes less a tile;
# the 4 M-event shop log's replay held about a million tiles).
Tile = Components | int


def tile_parts(tile: Tile) -> Iterable[tuple[str, int]]:
    """A tile's (component, value) pairs, whichever form it is held in."""
    return ((COUNT, tile),) if isinstance(tile, int) else tile.items()


def _added(tile: Tile | None, parts: list[tuple[str, int]]) -> Tile:
    """`tile` (None: a new one) with one event's `parts` added: kept a count while
    both are counts alone, else components (a dict the tile then owns)."""
    if len(parts) == 1 and parts[0][0] == COUNT:
        if tile is None:
            return parts[0][1]
        if isinstance(tile, int):
            return tile + parts[0][1]
    comps: Components = {} if tile is None else {COUNT: tile} if isinstance(tile, int) else tile
    add(comps, parts)
    return comps


@dataclass(frozen=True, slots=True)
class WindowSums:
    """A window's components summed over its tiles, the newest event time held
    (-1 none) and the newest non-empty tile in the window (-1 none)."""

    totals: Components
    newest_time: int
    newest_tile: int


def value(f: FeatureDef, stream: Stream, sums: WindowSums, as_of_ms: int) -> tuple[FeatureValue, int]:
    """(value, age_ms) of tiled feature `f` from its window's sums. age_ms: as-of minus
    the newest event held when that is not after the as-of time (it then lies in the
    window), else as-of minus the start of the window's newest non-empty tile; -1
    when the window is empty (the value is then the feature's default)."""
    t = sums.totals
    n = t.get(COUNT, 0)
    if n <= 0:
        d = f.default
        return (list(d) if isinstance(d, list) else dict(d) if isinstance(d, dict) else d), -1
    if 0 <= sums.newest_time <= as_of_ms:
        age = as_of_ms - sums.newest_time
    else:
        age = max(0, as_of_ms - sums.newest_tile * stream.slide_ms)
    if f.aggregate == "count":
        return n, age
    if f.aggregate == "count_by":
        prefix = f"b{stream.attrs.index(f.by or '')}:"
        return {k[len(prefix) :]: c for k, c in sorted(t.items()) if k.startswith(prefix) and c > 0}, age
    j = stream.values.index(f.field or "")
    total, present = t.get(f"s{j}", 0), t.get(f"c{j}", 0)
    if f.aggregate == "sum":
        return total / SCALE, age
    if present <= 0:
        return f.default, age
    return total / SCALE / present, age


@dataclass(slots=True)
class _Running:
    """A window's sums as of tile `at` (the newest tile or later): the held tiles
    from `lo` (an index into TileState.keys) on."""

    at: int
    lo: int
    sums: Components


@dataclass(slots=True)
class TileState:
    """One entity's tiles of one stream, in memory (the offline replay): what the
    Redis tiles hash holds, keyed by tile (`keys`: those held, ascending), and
    each window's running sums (by its length in tiles), carried forward as
    events apply and as reads move on in time, as the online totals are:
    each tile is added once and taken out once a window, so a read costs its
    components, not its window's tiles. A read before a window's running
    time sums its tiles. Integer components: either way gives the same sums."""

    tiles: dict[int, Tile] = field(default_factory=dict)
    newest_time: int = -1
    newest_tile: int = -1
    keys: list[int] = field(default_factory=list)
    running: dict[int, _Running] = field(default_factory=dict)

    def apply(self, stream: Stream, time_ms: int, parts: Iterable[tuple[str, int]]) -> None:
        k = tile_of(time_ms, stream.slide_ms)
        held = self.tiles.get(k)
        parts = list(parts)
        self.tiles[k] = _added(held, parts)
        if held is None:
            self._insert(k)
        self.newest_time = max(self.newest_time, time_ms)
        for n, run in self.running.items():
            if k > run.at:
                self._advance(run, n, k)
            if k > run.at - n:
                add(run.sums, parts)
        if k > self.newest_tile:
            self.newest_tile = k
            self._prune(k - retention_tiles(stream))

    def sums(self, first: int, last: int) -> WindowSums:
        """The components of tiles first..last (read-only, valid until the next apply)."""
        n = last - first + 1
        if last < self.newest_tile or (n in self.running and last < self.running[n].at):
            return self._summed(first, last)
        run = self.running.get(n)
        if run is None:
            lo = bisect.bisect_left(self.keys, first)
            run = self.running[n] = _Running(last, lo, self._summed(first, last).totals)
        elif last > run.at:
            self._advance(run, n, last)
        return WindowSums(run.sums, self.newest_time, self.newest_tile if self.newest_tile >= first else -1)

    def _summed(self, first: int, last: int) -> WindowSums:
        totals: Components = {}
        newest = -1
        for k in self.keys[bisect.bisect_left(self.keys, first) : bisect.bisect_right(self.keys, last)]:
            add(totals, tile_parts(self.tiles[k]))
            newest = k
        return WindowSums(totals, self.newest_time, newest)

    def _advance(self, run: _Running, n: int, to: int) -> None:
        first, keys = to - n + 1, self.keys
        while run.lo < len(keys) and keys[run.lo] < first:  # left the window
            for name, v in tile_parts(self.tiles[keys[run.lo]]):
                left = run.sums.pop(name, 0) - v  # absent: it summed to 0 (values can)
                if left:
                    run.sums[name] = left
            run.lo += 1
        run.at = to

    def _insert(self, k: int) -> None:
        """Tile k into `keys`; a window whose start it precedes skips it (a late tile, or one
        before a window a read carried past it)."""
        at = len(self.keys) if not self.keys or k > self.keys[-1] else bisect.bisect_left(self.keys, k)
        self.keys.insert(at, k)
        for n, run in self.running.items():
            if at < run.lo or (at == run.lo and k <= run.at - n):
                run.lo += 1

    def _prune(self, keep_from: int) -> None:
        gone = bisect.bisect_left(self.keys, keep_from)
        if gone:
            for k in self.keys[:gone]:
                del self.tiles[k]
            del self.keys[:gone]
            for n, run in list(self.running.items()):
                if run.lo >= gone:  # a window of the stream's: it starts after keep_from
                    run.lo -= gone
                else:  # wider than the retention: summed from its tiles when next read
                    del self.running[n]


def retention_tiles(stream: Stream) -> int:
    """Tiles kept behind the newest one: the stream's retention (at least its widest window)."""
    return -(-stream.retention_ms // stream.slide_ms)


def tile_field(name: str | bytes) -> int | None:
    """The tile of a tiles hash's field '<k>:<component>'; None for its other fields."""
    head = (name.decode() if isinstance(name, bytes) else name).partition(":")[0]
    return int(head) if head.lstrip("-").isdigit() else None


# Lua shared by the write and read scripts: the tiles hash's other fields; the components
# of the tiles in [first, last] of its HGETALL reply (the other fields skipped) with the
# newest such tile; the totals value ('<w>:<component>' US <sum> pairs joined by RS) as a
# table and back.
LUA_TILES = (
    f"local NEWEST_TILE, NEWEST_TIME, TOTALS = '{NEWEST_TILE}', '{NEWEST_TIME}', '{TOTALS}'\n"
    + r"""
local function sum_tiles(flat, first, last)
  local totals, newest = {}, -1
  for i = 1, #flat, 2 do
    local k, comp = string.match(flat[i], '^(%-?%d+):(.*)$')
    k = tonumber(k)
    if k ~= nil and k >= first and k <= last then
      totals[comp] = (totals[comp] or 0) + tonumber(flat[i + 1])
      if k > newest then newest = k end
    end
  end
  return totals, newest
end
local function decode_totals(value)
  local totals = {}
  for f, v in string.gmatch(value or '', '([^\31\30]+)\31(%-?%d+)') do totals[f] = tonumber(v) end
  return totals
end
local function encode_totals(totals)
  local parts = {}
  for f, v in pairs(totals) do parts[#parts + 1] = f .. '\31' .. string.format('%d', v) end
  return table.concat(parts, '\30')
end
"""
)


def decode_reply(flat: Sequence[Any], windows: int) -> list[WindowSums]:
    """The read script's reply for one tiled stream ('t', '<w>@', '<w>:<component>'
    pairs; empty: nothing held) as each window's sums."""
    totals: list[Components] = [{} for _ in range(windows)]
    newest_tile = [-1] * windows
    newest_time = -1
    for i in range(0, len(flat), 2):
        k, v = flat[i], flat[i + 1]
        name = k.decode() if isinstance(k, bytes) else str(k)
        if name == NEWEST_TIME:
            newest_time = int(v)
            continue
        w, sep, comp = name.partition(":")
        if sep:
            totals[int(w)][comp] = int(v)
        else:
            newest_tile[int(name[:-1])] = int(v)
    return [WindowSums(totals[w], newest_time, newest_tile[w]) for w in range(windows)]


def tiles_from_hash(flat: Mapping[Any, Any]) -> TileState:
    """A tiles hash (HGETALL, '<k>:<component>' -> int) as a TileState (the cluster's read)."""
    tiles: dict[int, Components] = {}
    for k, v in flat.items():
        tile = tile_field(k)
        if tile is not None:  # not 'c', 't', 'w' or 'o:<partition>'
            name = k.decode() if isinstance(k, bytes) else str(k)
            tiles.setdefault(tile, {})[name.partition(":")[2]] = int(v)
    state = TileState(dict(tiles))
    state.keys = sorted(state.tiles)
    state.newest_tile = state.keys[-1] if state.keys else -1
    return state


def stream_values(
    stream: Stream, sums: Sequence[WindowSums], as_of_ms: int
) -> dict[str, tuple[FeatureValue, int]]:
    """Every feature of a tiled stream from its windows' sums (widest window first)."""
    return {
        f.name: value(f, stream, sums[stream.windows.index(f.window_ms or 0)], as_of_ms)
        for f in stream.features
    }


def distinct_values(
    stream: Stream, newest_first: Sequence[tuple[str, int]], as_of_ms: int
) -> dict[str, tuple[FeatureValue, int]]:
    """The last_n features of a distinct list: per feature the ids whose latest event
    is in its window (as_of - window, as_of], newest first, at most n; `newest_first`
    is the list read in the stream's widest window."""
    out: dict[str, tuple[FeatureValue, int]] = {}
    for f in stream.features:
        lo = as_of_ms - (f.window_ms or 0)
        kept = [(other, t) for other, t in newest_first if lo < t <= as_of_ms][: f.n]
        out[f.name] = ([o for o, _ in kept], as_of_ms - kept[0][1]) if kept else ([], -1)
    return out


@dataclass(slots=True)
class DistinctState:
    """One entity's distinct list in memory (the offline replay): the other ids and the
    time of each one's latest event, capped at the stream's `scan` newest (ties: the
    larger id kept, as a Redis sorted set orders them). Held as a list of the ids and
    an array of their times, 8 bytes each: about 350 bytes for 10 ids, against about
    630 as a dict of id -> int (the ints boxed, 32 bytes each)."""

    others: list[str] = field(default_factory=list)
    times: array[int] = field(default_factory=lambda: array("q"))

    @property
    def newest_time(self) -> int:
        """The time of the newest event held (-1: none)."""
        return max(self.times, default=-1)

    def apply(self, stream: Stream, time_ms: int, other: str) -> None:
        others, times = self.others, self.times
        try:
            at = others.index(other)
        except ValueError:
            others.append(other)
            times.append(time_ms)
        else:
            times[at] = max(times[at], time_ms)
        if len(others) > stream.scan:
            drop = min(range(len(others)), key=lambda j: (times[j], others[j]))
            del others[drop]
            del times[drop]

    def newest_first(self, lo_exclusive: int, hi: int) -> list[tuple[str, int]]:
        held = [(o, t) for o, t in zip(self.others, self.times, strict=True) if lo_exclusive < t <= hi]
        held.sort(key=lambda kv: (kv[1], kv[0]), reverse=True)
        return held
