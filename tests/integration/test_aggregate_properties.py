"""Every aggregation kind against a brute-force reference, on random event streams
with late (out-of-order) and duplicate events, through a real redis-server.

The reference is written from the definitions alone (filter the events of the
entity, behaviours and window, then count, group, take the newest distinct ids,
add up), not from recmesh.features.compute. The same streams go through the one
write path (the single-Redis script, in consumer-sized batches sorted by time,
as the ingest consumer writes them) and the generic look-up; when events arrive
in time order the offline replay must agree as well.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recmesh.events import Event
from recmesh.features.backfill import ReplayState
from recmesh.features.repository import FeatureDef, FeatureSet, FeatureValue, parse_feature_set
from services.feature.catalog import load_catalog
from services.feature.offline_cache import OfflineCache
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter

T0 = 1_800_000_000_000
MIN = 60_000
USERS = ("u0", "u1", "u2")
ITEMS = ("i0", "i1", "i2", "i3")
CATEGORIES = {"i0": ["news"], "i1": ["food", "news"], "i2": ["tech"], "i3": []}

REPOSITORY = """
[repository]
name = "properties"

[events]
behaviors = ["view", "click", "buy"]
values = ["price"]

[items.features]
tags = { type = "multi" }

[realtime.clicks_5m]
entity = "user"
aggregate = "count"
behaviors = ["click"]
window = "5m"

[realtime.tag_clicks_10m]
entity = "user"
aggregate = "count_by"
by = "tags"
behaviors = ["click"]
window = "10m"

[realtime.recent_3]
entity = "user"
aggregate = "last_n"
n = 3
scan = 5
behaviors = ["view", "click"]
window = "1h"
slide = "exact"

[realtime.spend_10m]
entity = "user"
aggregate = "sum"
field = "price"
behaviors = ["buy", "view"]
window = "10m"

[realtime.mean_price_10m]
entity = "user"
aggregate = "mean"
field = "price"
behaviors = ["buy", "view"]
window = "10m"
default = -1.0

[realtime.views_10m]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "10m"

[realtime.views_3m]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "3m"

[realtime.mean_buy_price_10m]
entity = "item"
aggregate = "mean"
field = "price"
behaviors = ["buy"]
window = "10m"

[realtime.recent_buyers]
entity = "item"
aggregate = "last_n"
n = 2
behaviors = ["buy"]
window = "1h"
slide = "exact"

[recall]
recent_items = "recent_3"
"""

FEATURE_SET: FeatureSet = parse_feature_set(REPOSITORY, Path("properties/recmesh.toml"))


@dataclass(frozen=True)
class Ev:
    event_id: str
    user: str
    item: str
    behavior: str
    t: int
    price: float | None

    def event(self) -> Event:
        raw: dict[str, object] = {"event_id": self.event_id, "user_id": self.user, "item_id": self.item,
                                  "behavior": self.behavior, "event_time": self.t}  # fmt: skip
        if self.price is not None:
            raw["price"] = self.price
        from recmesh.events import validate_event

        return validate_event(raw, FEATURE_SET.event_schema)


events_st = st.lists(
    st.builds(
        Ev,
        event_id=st.integers(0, 40).map(lambda n: f"e{n}"),  # small id space: duplicates and reuse
        user=st.sampled_from(USERS),
        item=st.sampled_from(ITEMS),
        behavior=st.sampled_from(("view", "click", "buy")),
        # Within the streams' retention (1 h) of each other: trimming behind the newest
        # event never reaches an event a window could still hold. Ties happen.
        t=st.integers(T0 - 55 * MIN, T0).map(lambda t: t - t % 500),
        price=st.one_of(st.none(), st.floats(0.01, 500.0, allow_nan=False).map(lambda x: round(x, 2))),
    ),
    min_size=1,
    max_size=60,
)


def batches(arrivals: Sequence[Ev], cuts: Sequence[int]) -> list[list[Ev]]:
    """The arrivals as the consumer writes them: batch by batch, each sorted by time."""
    out, start = [], 0
    for cut in [*cuts, len(arrivals)]:
        out.append(sorted(arrivals[start:cut], key=lambda e: e.t))
        start = max(start, cut)
    return out


def first_written(written: Iterable[Ev]) -> list[Ev]:
    """Event identity: the first event of an id for its user, in the order written."""
    seen: set[tuple[str, str]] = set()
    out = []
    for e in written:
        if (e.user, e.event_id) not in seen:
            seen.add((e.user, e.event_id))
            out.append(e)
    return out


def tag_counts(events: Iterable[Ev]) -> dict[str, int]:
    """Events per tag of their item (an item with several tags counts once for each)."""
    counts: dict[str, int] = {}
    for e in events:
        for tag in CATEGORIES[e.item]:
            counts[tag] = counts.get(tag, 0) + 1
    return counts


def reference(f: FeatureDef, events: Iterable[Ev], entity_id: str, as_of: int) -> tuple[FeatureValue, int]:
    assert f.window_ms is not None
    mine = [
        e for e in events
        if (e.user if f.entity == "user" else e.item) == entity_id
        and e.behavior in f.behaviors and as_of - f.window_ms < e.t <= as_of
    ]  # fmt: skip
    if not mine:
        return (f.default if not isinstance(f.default, list | dict) else type(f.default)()), -1
    age = as_of - max(e.t for e in mine)

    def other(e: Ev) -> str:
        return e.item if f.entity == "user" else e.user

    # Ties in time go by event id, then by the other entity (an id is unique per user only).
    newest_first = sorted(mine, key=lambda e: (e.t, e.event_id, other(e)), reverse=True)
    if f.aggregate == "count":
        return len(mine), age
    if f.aggregate == "count_by":
        return tag_counts(mine), age
    if f.aggregate == "last_n":
        out: list[str] = []
        for e in newest_first[: f.scan]:
            if other(e) not in out and len(out) < f.n:
                out.append(other(e))
        return out, age
    prices = [e.price for e in reversed(newest_first) if e.price is not None]
    total = 0.0
    for p in prices:  # in time order, as both recmesh paths add them
        total += p
    if f.aggregate == "sum":
        return total, age
    return (total / len(prices) if prices else f.default), age


def same(got: tuple[FeatureValue, int], want: tuple[FeatureValue, int]) -> bool:
    """Equal; floats to 1e-9 (equal-time events of two users may add up in another order)."""
    (value, age), (want_value, want_age) = got, want
    if isinstance(value, float) and isinstance(want_value, float):
        return age == want_age and bool(value == pytest.approx(want_value, rel=1e-9, abs=1e-9))
    return got == want


def check(
    got: dict[str, tuple[FeatureValue, str, int]], f: FeatureDef, want: tuple[FeatureValue, int]
) -> None:
    value, _, age = got[f.name]
    assert same((value, age), want), (f.name, value, age, want)


async def _online(
    url: str, arrivals: list[Ev], cuts: list[int], as_ofs: list[int]
) -> list[dict[str, object]]:
    client = redis.Redis.from_url(url, protocol=2)
    try:
        await client.flushdb()
        await load_catalog(client, FEATURE_SET, [], [(i, {"tags": CATEGORIES[i]}) for i in ITEMS])
        # no background re-reads past the loop
        store = FeatureStore(
            client, FEATURE_SET, offline=OfflineCache(client, FEATURE_SET, static_ttl_s=600.0)
        )
        writer = EventWriter(client, FEATURE_SET, store.offline.attributes)
        for batch in batches(arrivals, cuts):
            if batch:
                await writer.apply([e.event() for e in batch])
        out = []
        for as_of in as_ofs:
            for user in USERS:
                lookup = await store.lookup(user, list(ITEMS), as_of, timeout_s=5.0)
                out.append({"as_of": as_of, "user": user, "lookup": lookup})
        return out
    finally:
        await client.aclose()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=events_st,
    cuts=st.lists(st.integers(0, 60), max_size=4).map(sorted),
    as_ofs=st.lists(st.integers(T0 - 15 * MIN, T0 + 5 * MIN), min_size=1, max_size=3),
)
def test_every_aggregation_matches_the_reference_online(
    scratch_redis_url: str, arrivals: list[Ev], cuts: list[int], as_ofs: list[int]
) -> None:
    results = asyncio.run(_online(scratch_redis_url, arrivals, cuts, as_ofs))
    kept = first_written(e for batch in batches(arrivals, cuts) for e in batch)
    for r in results:
        as_of, user, lookup = r["as_of"], r["user"], r["lookup"]
        assert isinstance(as_of, int) and isinstance(user, str)
        for f in FEATURE_SET.features_of("user", "realtime"):
            check(lookup.user, f, reference(f, kept, user, as_of))  # type: ignore[attr-defined]
        for item, row in zip(ITEMS, lookup.items, strict=True):  # type: ignore[attr-defined]
            for f in FEATURE_SET.features_of("item", "realtime"):
                check(row, f, reference(f, kept, item, as_of))


@settings(max_examples=300, deadline=None)
@given(arrivals=events_st, as_of=st.integers(T0 - 15 * MIN, T0 + 5 * MIN))
def test_the_replay_matches_the_reference(arrivals: list[Ev], as_of: int) -> None:
    """The replay reads a log in event-time order: with the events arriving that
    way, it keeps the same events as the online store and computes the same values."""
    replay_check(FEATURE_SET, reference, arrivals, as_of)


Reference = Callable[[FeatureDef, list[Ev], str, int], tuple[FeatureValue, int]]


def replay_check(
    feature_set: FeatureSet, want: Reference, arrivals: list[Ev], as_of: int, bitwise: bool = False
) -> None:
    """The events replayed in time order: every feature of every entity as `want` says
    (`bitwise`: floats equal to the bit, as tiles' fixed-point sums are)."""
    in_time = sorted(arrivals, key=lambda e: (e.t, e.event_id))
    replay = ReplayState(feature_set, {}, {i: {"tags": CATEGORIES[i]} for i in ITEMS})
    for e in in_time:
        replay.apply(e.event())
    kept = first_written(in_time)
    for entity, ids in (("user", USERS), ("item", ITEMS)):
        for entity_id in ids:
            got = replay.features(entity, entity_id, as_of)  # type: ignore[arg-type]
            for f in feature_set.features_of(entity, "realtime"):  # type: ignore[arg-type]
                expected = want(f, kept, entity_id, as_of)
                ok = got[f.name] == expected if bitwise else same(got[f.name], expected)
                assert ok, (f.name, entity_id, got[f.name], expected)


# --- tiled windows (recmesh/features/tiles.py) ---------------------------------------

SLIDE = MIN
TILED: FeatureSet = parse_feature_set(
    REPOSITORY.replace('window = "5m"', 'window = "5m"\nslide = "1m"')
    .replace('window = "10m"', 'window = "10m"\nslide = "1m"')
    .replace('window = "3m"', 'window = "3m"\nslide = "1m"')
    .replace('slide = "exact"', 'slide = "1m"'),
    Path("tiled/recmesh.toml"),
)


def reference_tiled(
    f: FeatureDef, events: Iterable[Ev], entity_id: str, as_of: int, cap: int
) -> tuple[FeatureValue, int]:
    """From the definitions: the tiles (as_of // slide) - n + 1 .. as_of // slide, every
    event kept in them (later ones in the last tile too), values summed in fixed point;
    last_n: per other id its latest event, the `cap` newest kept, those in the exact window."""
    assert f.window_ms is not None

    def other(e: Ev) -> str:
        return e.item if f.entity == "user" else e.user

    stream = [e for e in events if (e.user if f.entity == "user" else e.item) == entity_id
              and e.behavior in f.behaviors]  # fmt: skip
    if f.aggregate == "last_n":
        latest: dict[str, int] = {}
        for e in stream:
            latest[other(e)] = max(latest.get(other(e), -1), e.t)
        held = sorted(((t, o) for o, t in latest.items()), reverse=True)[:cap]
        inside = [(t, o) for t, o in held if as_of - f.window_ms < t <= as_of][: f.n]
        return ([o for _, o in inside], as_of - inside[0][0]) if inside else ([], -1)
    last = as_of // SLIDE
    first = last - f.window_ms // SLIDE + 1
    mine = [e for e in stream if first <= e.t // SLIDE <= last]
    if not mine:
        return (f.default if not isinstance(f.default, list | dict) else type(f.default)()), -1
    newest = max(e.t for e in stream)
    age = as_of - newest if newest <= as_of else max(0, as_of - max(e.t // SLIDE for e in mine) * SLIDE)
    if f.aggregate == "count":
        return len(mine), age
    if f.aggregate == "count_by":
        return tag_counts(mine), age
    prices = [round(e.price * 1_000_000) for e in mine if e.price is not None]
    if f.aggregate == "sum":
        return sum(prices) / 1_000_000, age
    return (sum(prices) / 1_000_000 / len(prices) if prices else f.default), age


def _cap(f: FeatureDef) -> int:
    return TILED.stream(f.stream, f.entity).scan


async def _online_tiled(
    url: str, arrivals: list[Ev], cuts: list[int], as_ofs: list[int]
) -> list[tuple[int, str, object]]:
    client = redis.Redis.from_url(url, protocol=2)
    try:
        await client.flushdb()
        await load_catalog(client, TILED, [], [(i, {"tags": CATEGORIES[i]}) for i in ITEMS])
        store = FeatureStore(client, TILED, offline=OfflineCache(client, TILED, static_ttl_s=600.0))
        writer = EventWriter(client, TILED, store.offline.attributes)
        for batch in batches(arrivals, cuts):
            if batch:
                await writer.apply([e.event() for e in batch])
        return [
            (as_of, user, await store.lookup(user, list(ITEMS), as_of, timeout_s=5.0))
            for as_of in as_ofs
            for user in USERS
        ]
    finally:
        await client.aclose()


def test_every_tiled_feature_is_tiled() -> None:
    reads = {f.name: TILED.stream(f.stream, f.entity).read for f in TILED.features_of("user", "realtime")}
    reads |= {f.name: TILED.stream(f.stream, f.entity).read for f in TILED.features_of("item", "realtime")}
    assert set(reads.values()) == {"tiles", "distinct"}, reads


# Denser in time than events_st: late events land in and just outside a key's windows.
dense_events_st = st.lists(
    st.builds(
        Ev,
        event_id=st.integers(0, 40).map(lambda n: f"e{n}"),
        user=st.sampled_from(USERS),
        item=st.sampled_from(ITEMS),
        behavior=st.sampled_from(("view", "click", "buy")),
        t=st.integers(T0 - 12 * MIN, T0).map(lambda t: t - t % 500),
        price=st.one_of(st.none(), st.floats(0.01, 500.0, allow_nan=False).map(lambda x: round(x, 2))),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.one_of(events_st, dense_events_st),
    cuts=st.lists(st.integers(0, 60), max_size=4).map(sorted),
    as_ofs=st.lists(st.integers(T0 - 15 * MIN, T0 + 5 * MIN), min_size=1, max_size=3),
)
def test_every_tiled_aggregation_matches_the_reference_online(
    scratch_redis_url: str, arrivals: list[Ev], cuts: list[int], as_ofs: list[int]
) -> None:
    """Batches arrive out of time order (late events), ids repeat (duplicates), the
    as-of times fall before, inside and after the events: the tiles the script keeps
    and the totals it moves forward read as the definition says. Each entity's newest event
    time is an as-of too: a look-up in a key's newest tile reads its window totals alone."""
    newest = {e.user: e.t for e in sorted(arrivals, key=lambda e: e.t)}
    newest |= {e.item: e.t for e in sorted(arrivals, key=lambda e: e.t)}
    as_ofs = [*as_ofs, *sorted(set(newest.values()))]
    results = asyncio.run(_online_tiled(scratch_redis_url, arrivals, cuts, as_ofs))
    kept = first_written(e for batch in batches(arrivals, cuts) for e in batch)
    for as_of, user, lookup in results:
        for f in TILED.features_of("user", "realtime"):
            check(lookup.user, f, reference_tiled(f, kept, user, as_of, _cap(f)))  # type: ignore[attr-defined]
        for item, row in zip(ITEMS, lookup.items, strict=True):  # type: ignore[attr-defined]
            for f in TILED.features_of("item", "realtime"):
                check(row, f, reference_tiled(f, kept, item, as_of, _cap(f)))


@settings(max_examples=300, deadline=None)
@given(arrivals=st.one_of(events_st, dense_events_st), as_of=st.integers(T0 - 15 * MIN, T0 + 5 * MIN))
def test_the_tiled_replay_matches_the_reference(arrivals: list[Ev], as_of: int) -> None:
    replay_check(
        TILED,
        lambda f, kept, eid, t: reference_tiled(f, kept, eid, t, _cap(f)),
        arrivals,
        as_of,
        bitwise=True,
    )


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
