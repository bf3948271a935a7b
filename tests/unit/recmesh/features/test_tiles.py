"""The replay's tiles: each window's running sums (carried forward as events
apply and as reads move on, as the online totals hash is) are the sums of its
tiles, whatever the order of events (late ones included) and reads."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from recmesh.features.repository.feature_set import Stream
from recmesh.features.tiles import (
    Components,
    Tile,
    TileState,
    add,
    retention_tiles,
    tile_field,
    tile_parts,
    tiles_from_hash,
    window_tiles,
)

SLIDE = 1_000
STREAM = Stream(
    id="s", entity="item", behaviors=frozenset({"view"}), features=(), other_id=False, attrs=(), values=(),
    retention_ms=12 * SLIDE, ttl_s=60, read="tiles", windows=(12 * SLIDE, 5 * SLIDE, SLIDE), slide_ms=SLIDE,
)  # fmt: skip


def by_tiles(tiles: Mapping[int, Tile], first: int, last: int) -> tuple[Components, int]:
    """The definition: every held tile of first..last summed (zeros left out); the newest such tile."""
    out: Components = {}
    for k in sorted(tiles):
        if first <= k <= last:
            add(out, tile_parts(tiles[k]))
    return {c: v for c, v in out.items() if v}, max((k for k in tiles if first <= k <= last), default=-1)


@pytest.mark.parametrize("seed", range(60))
def test_window_sums_carried_forward_are_the_sums_of_the_tiles(seed: int) -> None:
    rng = random.Random(seed)
    state, tiles = TileState(), dict[int, Components]()
    now = rng.randrange(50 * SLIDE, 60 * SLIDE)  # event times are past the epoch: tiles from 0
    for _ in range(500):
        if rng.random() < 0.55:  # an event: mostly in order, some late, some after a long gap
            now += rng.choice(
                [0, rng.randrange(SLIDE // 3), rng.randrange(2 * SLIDE), rng.randrange(30 * SLIDE)]
            )
            t = now - (rng.randrange(11 * SLIDE) if rng.random() < 0.2 else 0)  # late, within the retention
            parts = [("n", 1), (f"b0:{rng.choice('xyz')}", 1), ("s0", rng.randrange(-5, 6))]
            if rng.random() < 0.4:  # a count alone: its tile held as an int until it gets more
                parts = parts[:1]
            state.apply(STREAM, t, parts)
            add(tiles.setdefault(t // SLIDE, {}), parts)
            keep_from = state.newest_tile - retention_tiles(STREAM)
            tiles = {k: v for k, v in tiles.items() if k >= keep_from}
            continue
        as_of = now + rng.choice(
            [0, 0, -rng.randrange(6 * SLIDE), rng.randrange(3 * SLIDE), rng.randrange(20 * SLIDE)]
        )
        for w in STREAM.windows:
            first, last = window_tiles(as_of, w, SLIDE)
            got = state.sums(first, last)
            want, newest = by_tiles(tiles, first, last)
            assert {c: v for c, v in got.totals.items() if v} == want, (first, last)
            assert got.newest_tile == newest and got.newest_time == state.newest_time
    assert state.running and sorted(state.tiles) == state.keys == sorted(tiles)


def test_a_count_only_tile_is_an_int_until_an_event_brings_more_components() -> None:
    state = TileState()
    state.apply(STREAM, 5 * SLIDE, [("n", 1)])
    state.apply(STREAM, 5 * SLIDE + 1, [("n", 1)])
    assert state.tiles == {5: 2}
    state.apply(STREAM, 5 * SLIDE + 2, [("n", 1), ("b0:x", 1)])
    state.apply(STREAM, 6 * SLIDE, [("n", 1)])
    assert state.tiles == {5: {"n": 3, "b0:x": 1}, 6: 1}
    assert state.sums(*window_tiles(6 * SLIDE, 5 * SLIDE, SLIDE)).totals == {"n": 4, "b0:x": 1}


def test_a_tiles_hash_read_back_sums_as_the_state_it_was_written_from() -> None:
    """The cluster's read: a tiles hash (HGETALL) becomes a TileState whose windows
    sum as the state that holds the same tiles."""
    rng = random.Random(3)
    state = TileState()
    for t in sorted(rng.randrange(50 * SLIDE, 70 * SLIDE) for _ in range(200)):
        state.apply(STREAM, t, [("n", 1), (f"b0:{rng.choice('xy')}", 1)])
    flat = {
        f"{k}:{c}".encode(): str(v).encode() for k, tile in state.tiles.items() for c, v in tile_parts(tile)
    }
    read = tiles_from_hash(flat)
    assert read.newest_tile == state.newest_tile and read.keys == state.keys
    for as_of in (60 * SLIDE, 69 * SLIDE + 5, 75 * SLIDE):
        for w in STREAM.windows:
            first, last = window_tiles(as_of, w, SLIDE)
            want, newest = by_tiles(state.tiles, first, last)
            got = read.sums(first, last)
            assert {c: v for c, v in got.totals.items() if v} == want and got.newest_tile == newest


def test_a_tiles_hash_reads_its_tiles_apart_from_its_totals_and_offsets() -> None:
    assert [tile_field(f) for f in ("59:n", b"-3:b0:news", "c", "t", "w", b"o:2", "x:n")] == [
        59, -3, None, None, None, None, None
    ]  # fmt: skip
    held = {b"59:n": b"2", b"59:b0:a:b": b"1", b"c": b"59", b"w": b"0:n\x1f2", b"o:0": b"7:9"}
    state = tiles_from_hash(held)
    assert state.tiles == {59: {"n": 2, "b0:a:b": 1}} and state.newest_tile == 59
