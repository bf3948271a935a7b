"""Offline replay: the same feature code over an event log, point in time.

`ReplayState` keeps, in memory, what the online store keeps in Redis: per
entity and stream the events' members (built by the same encoder the write
path uses), the same event-id identity rule, the same retention. Features are
computed from it by the same aggregations as the online look-up
(compute.aggregate), as of any time. Training rows are built by replaying a
log in event-time order: for each example (an event of the repository's
`training.examples` behaviours) the features are computed as of 1 ms before
it, from exactly the state the online store would hold at that moment. Nothing
from an example's future can leak in; only the label looks ahead.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from recmesh.errors import FailedPrecondition
from recmesh.events import Event
from recmesh.features.compute import Layout, StreamEvent, aggregate, attribute_text, encode_member
from recmesh.features.eventlog import EventTable, behaviour_flags
from recmesh.features.repository import Entity, FeatureSet, FeatureValue, parse_duration_ms
from recmesh.features.tiles import (
    DistinctState,
    TileState,
    components,
    distinct_values,
    stream_values,
    window_tiles,
)

SWEEP_EVERY = 100_000  # events between sweeps of idle entities


# Examples and reads are made several times an event by the replay: plain
# slotted dataclasses, not frozen ones (whose __init__ sets each field through
# object.__setattr__: about 3x the cost), and nothing changes them once made.
@dataclass(slots=True)
class Example:
    user_id: str
    item_id: str
    as_of_ms: int
    user: dict[str, FeatureValue]
    item: dict[str, FeatureValue]
    label: int
    weight: float = 1.0  # in the training loss: training.weights of its behaviour (negatives 1)


class ExampleDigest:
    """A digest of examples in order, bit for bit: two replays that give it
    equal gave the same rows (numbers in their shortest round-trip form, keys
    sorted)."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.count = 0

    def add(self, ex: Example) -> None:
        self._hash.update(
            orjson.dumps(
                (ex.user_id, ex.item_id, ex.as_of_ms, ex.label, ex.weight, ex.user, ex.item),
                option=orjson.OPT_SORT_KEYS,
            )
        )
        self.count += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def offline_values(
    feature_set: FeatureSet, entity: Entity, row: Mapping[str, Any] | None
) -> dict[str, FeatureValue]:
    row = row or {}
    return {f.name: row.get(f.name, f.default) for f in feature_set.features_of(entity, "offline")}


class Identity:
    """The event-id rule the online store keeps: an event whose id was already
    applied for its user (within FeatureSet.identity_ms) is a duplicate."""

    def __init__(self) -> None:
        self._ids: dict[str, dict[str, int]] = {}

    def seen(self, user_id: str, event_id: str) -> bool:
        return event_id in self._ids.get(user_id, ())

    def remember(self, ev: Event) -> bool:
        """Record its id; False when it was already there (a duplicate)."""
        ids = self._ids.setdefault(ev.user_id, {})
        if ev.event_id in ids:
            return False
        ids[ev.event_id] = ev.event_time
        return True

    def forget_before(self, cutoff_ms: int) -> None:
        for uid in list(self._ids):
            kept = {e: t for e, t in self._ids[uid].items() if t >= cutoff_ms}
            if kept:
                self._ids[uid] = kept
            else:
                del self._ids[uid]


ENTITIES: tuple[Entity, ...] = ("user", "item")


class ReplayState:
    """Per-entity stream state as the online store keeps it, held in memory.

    `entities`: the entities whose streams it keeps (a partition of the
    engine's replay keeps one: recmesh.tools.training.engine). `only_users`:
    when given, the user streams of those users only (every item's streams
    still): a user's streams read nothing but that user's events."""

    def __init__(
        self,
        feature_set: FeatureSet,
        users: Mapping[str, Mapping[str, Any]],
        items: Mapping[str, Mapping[str, Any]],
        entities: tuple[Entity, ...] = ENTITIES,
        only_users: Collection[str] | None = None,
    ) -> None:
        self.feature_set = feature_set
        self._only_users = None if only_users is None else frozenset(only_users)
        self._sides = [
            (entity, list(feature_set.streams_of(entity))) for entity in ENTITIES if entity in entities
        ]
        self._offline: dict[Entity, Mapping[str, Mapping[str, Any]]] = {"user": users, "item": items}
        self._attr_cache: dict[Entity, dict[str, dict[str, str]]] = {"user": {}, "item": {}}
        self._offline_values: dict[Entity, dict[str, dict[str, FeatureValue]]] = {"user": {}, "item": {}}
        self._layouts = {(s.entity, s.id): Layout.of(s) for s in feature_set.streams}
        self._state: dict[tuple[Entity, str], dict[str, list[StreamEvent]]] = {
            (s.entity, s.id): {} for s in feature_set.streams if not s.tiled
        }
        # tiled streams: the same tiles and distinct lists the online store keeps (recmesh.features.tiles)
        self._tiles: dict[tuple[Entity, str], dict[str, TileState]] = {
            (s.entity, s.id): {} for s in feature_set.streams if s.read == "tiles"
        }
        self._distinct: dict[tuple[Entity, str], dict[str, DistinctState]] = {
            (s.entity, s.id): {} for s in feature_set.streams if s.read == "distinct"
        }
        self.identity = Identity()
        self.applied = 0
        self.duplicates = 0
        self._newest = 0
        # The rows read as of one time (the last asked for), each while no event
        # has changed its entity since: the examples of one time read their items
        # and users again and again (a day-stamped purchase log: half the reads).
        self._read_at = -1
        self._read: dict[tuple[Entity, str], dict[str, FeatureValue]] = {}

    def attributes(self, entity: Entity, entity_id: str) -> dict[str, str]:
        cache = self._attr_cache[entity]
        held = cache.get(entity_id)
        if held is None:
            row = self._offline[entity].get(entity_id) or {}
            held = {
                f.name: attribute_text(row.get(f.name, f.default))
                for f in self.feature_set.features_of(entity, "offline")
            }
            cache[entity_id] = held
        return held

    def seen(self, user_id: str, event_id: str) -> bool:
        return self.identity.seen(user_id, event_id)

    def apply(self, ev: Event) -> bool:
        """Apply one event (in event-time order); False when its id was already
        applied for the user (a duplicate, dropped as online)."""
        if not self.identity.remember(ev):
            self.duplicates += 1
            return False
        self.apply_streams(ev)
        return True

    def apply_streams(self, ev: Event) -> None:
        """Apply one event known not to be a duplicate (example_plan decided) to
        the streams kept."""
        t = ev.event_time
        read = self._read
        if read:
            read.pop(("user", ev.user_id), None)
            read.pop(("item", ev.item_id), None)
        only = self._only_users
        for entity, streams in self._sides:
            if only is not None and entity == "user" and ev.user_id not in only:
                continue
            own, other = (ev.user_id, ev.item_id) if entity == "user" else (ev.item_id, ev.user_id)
            other_entity: Entity = "item" if entity == "user" else "user"
            for s in streams:
                if ev.behavior not in s.behaviors:
                    continue
                attrs = self.attributes(other_entity, other) if s.attrs else {}
                if s.read == "tiles":
                    tiles = self._tiles[(entity, s.id)]
                    held = tiles.get(own) or tiles.setdefault(own, TileState())
                    held.apply(s, t, components(s, attrs, ev.values))
                    continue
                if s.read == "distinct":
                    lists = self._distinct[(entity, s.id)]
                    (lists.get(own) or lists.setdefault(own, DistinctState())).apply(s, t, other)
                    continue
                member = encode_member(s, ev.event_id, other, attrs, ev.values)
                events = self._state[(entity, s.id)].setdefault(own, [])
                bisect.insort(events, (t, member))
                cutoff = events[-1][0] - s.retention_ms
                if events[0][0] < cutoff:
                    del events[: bisect.bisect_left(events, (cutoff, ""))]
        self.applied += 1
        self._newest = max(self._newest, t)
        if self.applied % SWEEP_EVERY == 0:
            self.sweep(self._newest)

    def sweep(self, now_ms: int) -> None:
        """Forget entities whose newest event is older than their retention, as
        the online store's TTLs do, so replay memory stays bounded."""
        self._read.clear()
        for s in self.feature_set.streams:
            cutoff = now_ms - s.retention_ms
            if s.read == "tiles":
                tiles = self._tiles[(s.entity, s.id)]
                for eid in [e for e, st in tiles.items() if st.newest_time < cutoff]:
                    del tiles[eid]
                continue
            if s.read == "distinct":
                lists = self._distinct[(s.entity, s.id)]
                for eid in [e for e, d in lists.items() if d.newest_time < cutoff]:
                    del lists[eid]
                continue
            table = self._state[(s.entity, s.id)]
            for eid in [e for e, evs in table.items() if not evs or evs[-1][0] < cutoff]:
                del table[eid]
        self.identity.forget_before(now_ms - self.feature_set.identity_ms)

    def row(self, entity: Entity, entity_id: str, as_of_ms: int) -> dict[str, FeatureValue]:
        """Every feature of one entity as of `as_of_ms`, as a look-up then would
        answer: the real-time ones from the events applied, the offline ones
        from its table (the declared defaults for an entity it lacks). The
        row is the caller's: an entity read again as of the same time, with no
        event applied to it since, gets a (shallow) copy of the row it was given."""
        key = (entity, entity_id)
        if as_of_ms != self._read_at:
            self._read.clear()
            self._read_at = as_of_ms
        elif (again := self._read.get(key)) is not None:
            return dict(again)
        out = {k: v for k, (v, _) in self.features(entity, entity_id, as_of_ms).items()}
        held = self._offline_values[entity].get(entity_id)
        if held is None:
            held = offline_values(self.feature_set, entity, self._offline[entity].get(entity_id))
            self._offline_values[entity][entity_id] = held
        out.update(held)
        self._read[key] = out
        return dict(out)

    def features(self, entity: Entity, entity_id: str, as_of_ms: int) -> dict[str, tuple[FeatureValue, int]]:
        """Real-time features of one entity as of `as_of_ms`: name -> (value, age_ms)."""
        out: dict[str, tuple[FeatureValue, int]] = {}
        for s in self.feature_set.streams_of(entity):
            if not s.features:
                continue
            if s.read == "tiles":
                held = self._tiles[(entity, s.id)].get(entity_id) or TileState()
                sums = [held.sums(*window_tiles(as_of_ms, w, s.slide_ms)) for w in s.windows]
                out.update(stream_values(s, sums, as_of_ms))
                continue
            if s.read == "distinct":
                latest = self._distinct[(entity, s.id)].get(entity_id) or DistinctState()
                out.update(
                    distinct_values(s, latest.newest_first(as_of_ms - s.widest_ms, as_of_ms), as_of_ms)
                )
                continue
            events = self._state[(entity, s.id)].get(entity_id, [])
            layout = self._layouts[(entity, s.id)]
            for f in s.features:
                out[f.name] = aggregate(f, layout, events, as_of_ms)
        return out


@dataclass
class LabelRule:
    """The repository's label: a later event of `behaviors` on the same item
    within `within_ms`, the example's own value `field` >= `at_least`, or
    (`implicit`) the example event itself."""

    behaviors: frozenset[str] = frozenset()
    within_ms: int = 0
    value_field: str | None = None
    at_least: float = 0.0
    examples: frozenset[str] = frozenset()
    negatives: int = 0  # sampled catalog items per example, labelled 0
    hard_share: float = 0.0  # of them, drawn from items co-occurring with the user's recent ones
    implicit: bool = False
    weights: Mapping[str, float] = field(default_factory=dict)  # behaviour -> example weight

    @classmethod
    def of(cls, feature_set: FeatureSet) -> LabelRule:
        t = feature_set.decl.training
        if t is None:
            raise FailedPrecondition(
                f"repository {feature_set.name!r} ({feature_set.path}) declares no [training] "
                "(examples and label): add it to train"
            )
        lab = t.label
        return cls(
            frozenset(lab.behaviors or ()),
            _within_ms(lab.within),
            lab.field,
            float(lab.at_least or 0.0),
            frozenset(t.examples),
            t.negatives,
            t.hard_negatives,
            lab.implicit,
            dict(t.weights),
        )

    def examples_text(self) -> str:
        return "/".join(sorted(self.examples))

    def immediate(self, ev: Event) -> int | None:
        """The label of an example event known from the event alone (a value
        rule, implicit feedback); None when a later event decides it."""
        if self.implicit:
            return 1
        if self.value_field is not None:
            value = ev.values.get(self.value_field)
            return int(value is not None and value >= self.at_least)
        return None

    def weight(self, behavior: str) -> float:
        return self.weights.get(behavior, 1.0)

    def describe(self) -> str:
        if self.implicit:
            rule = f"every {self.examples_text()} event is a positive (implicit feedback)"
        elif self.value_field is not None:
            rule = f"{self.value_field} >= {self.at_least}"
        else:
            rule = f"a {'/'.join(sorted(self.behaviors))} on the item within {self.within_ms} ms"
        if self.weights:
            rule += "; weighted " + ", ".join(f"{b} {w:g}" for b, w in sorted(self.weights.items()))
        if self.negatives:
            rule += (
                f"; {self.negatives} sampled catalog items the user had no event on per example, labelled 0"
                f" ({self.hard_share:.0%} of them among items co-occurring with the user's recent ones)"
            )
        return rule


def positive_examples(rule: LabelRule, events: Sequence[Event]) -> list[bool]:
    """Per event (sorted by time): is it an example the label rule calls positive?
    A rule an event decides alone (implicit, a value) reads a table's columns."""
    if isinstance(events, EventTable) and (rule.implicit or rule.value_field in events.value_names):
        flags = behaviour_flags(events, rule.examples)
        if not rule.implicit:  # a value at least rule.at_least (NaN: absent, never positive)
            flags &= events.value(str(rule.value_field)) >= rule.at_least
        return list(flags.tolist())
    positive = [False] * len(events)
    if rule.implicit or rule.value_field is not None:
        for n, ev in enumerate(events):
            if ev.behavior in rule.examples:
                positive[n] = rule.immediate(ev) == 1
        return positive
    open_examples: dict[tuple[str, str], list[int]] = {}
    for n, ev in enumerate(events):
        key = (ev.user_id, ev.item_id)
        if ev.behavior in rule.behaviors:
            for m in open_examples.get(key, ()):
                prior = events[m]
                if prior.event_time <= ev.event_time <= prior.event_time + rule.within_ms and (
                    prior.event_id != ev.event_id
                ):
                    positive[m] = True
        if ev.behavior in rule.examples:
            held = open_examples.setdefault(key, [])
            held.append(n)
            # Examples older than the label window can no longer turn positive.
            while held and events[held[0]].event_time + rule.within_ms < ev.event_time:
                held.pop(0)
    return positive


def _within_ms(value: str | int | None) -> int:
    """A label window; 0 (or '0s') means at the same time only."""
    if value is None or (isinstance(value, str) and value.strip() in ("0", "0s", "0ms")) or value == 0:
        return 0
    return parse_duration_ms(value)


class CoOccurring:
    """Items that followed or preceded an item in users' sequences, from the
    events added so far (never later ones): for each item the last FOLLOW_KEEP
    such neighbours, so a draw is O(1) and weighted by how often they co-occur
    lately. `draw` picks one of the user's recent items, then one of its
    neighbours: what item-to-item retrieval would propose for the user."""

    FOLLOW_KEEP = 64
    PAIRED = 5  # earlier distinct items of the user each event pairs with
    SEEDS = 10

    def __init__(self, behaviors: Mapping[str, float]) -> None:
        self._behaviors = frozenset(behaviors)
        self._near: dict[str, deque[str]] = {}
        self._recent: dict[str, list[str]] = {}

    def add(self, ev: Event) -> None:
        if ev.behavior not in self._behaviors:
            return
        recent = self._recent.setdefault(ev.user_id, [])
        if recent and recent[0] == ev.item_id:
            return
        for other in recent[: self.PAIRED]:
            if other != ev.item_id:
                self._near.setdefault(other, deque(maxlen=self.FOLLOW_KEEP)).append(ev.item_id)
                self._near.setdefault(ev.item_id, deque(maxlen=self.FOLLOW_KEEP)).append(other)
        if ev.item_id in recent:
            recent.remove(ev.item_id)
        recent.insert(0, ev.item_id)
        del recent[self.SEEDS :]

    def draw(self, user_id: str, rng: random.Random) -> str | None:
        recent = self._recent.get(user_id)
        if not recent:
            return None
        near = self._near.get(recent[rng.randrange(len(recent))])
        return near[rng.randrange(len(near))] if near else None


class TouchedItems:
    """Per user, the items of their events (what sampled negatives avoid), in
    bounded memory: a user's item numbers (the catalog's, then the others in
    order of appearance) in an array of 4 bytes each, turned into a bitmap of
    the items numbered so far once that is smaller. A user costs at most one
    bit per item known, whatever the log's length (a set of strings per user
    cost about 70 bytes an item: 260 MB at 4 M purchases by 133,333 shoppers)."""

    def __init__(self, catalog: Sequence[str]) -> None:
        self._number = {item: n for n, item in enumerate(catalog)}
        self._of: dict[str, array[int] | bytearray] = {}

    def add(self, user_id: str, item_id: str) -> None:
        n = self._number.setdefault(item_id, len(self._number))
        held = self._of.get(user_id)
        if held is None:
            self._of[user_id] = array("i", (n,))
        elif isinstance(held, bytearray):
            if n >> 3 >= len(held):
                held.extend(bytes((n >> 3) + 1 - len(held)))
            held[n >> 3] |= 1 << (n & 7)
        elif n not in held:
            held.append(n)
            size = (len(self._number) + 7) // 8
            if 4 * len(held) > size:
                bits = bytearray(size)
                for k in held:
                    bits[k >> 3] |= 1 << (k & 7)
                self._of[user_id] = bits

    def of(self, user_id: str) -> _Touched:
        return _Touched(self._number, self._of.get(user_id))


@dataclass(slots=True)
class _Touched:
    """One user's items in TouchedItems: `item in touched`."""

    number: Mapping[str, int]
    held: array[int] | bytearray | None

    def __contains__(self, item: object) -> bool:
        held = self.held
        n = self.number.get(item) if isinstance(item, str) else None
        if held is None or n is None:
            return False
        if isinstance(held, bytearray):
            return n >> 3 < len(held) and bool(held[n >> 3] >> (n & 7) & 1)
        return n in held


@dataclass
class _Negatives:
    """The sampled negatives of an example: `count` catalog items the user has
    had no event on, `hard_count` of them (when found) among the items
    co-occurring with the user's recent ones (`hard`, fed the events so far)."""

    count: int
    hard_count: int
    catalog: list[str]
    hard: CoOccurring

    def draw(self, ev: Event, avoid: Container[str]) -> list[str]:
        """The items, by a generator seeded by the event's id (a replay draws the
        same); `avoid`: the user's items (it holds the example's own)."""
        rng = random.Random(zlib.crc32(f"{ev.user_id}/{ev.event_id}".encode()))
        drawn: list[str] = []
        for _ in range(self.hard_count * 4):
            if len(drawn) == self.hard_count:
                break
            item = self.hard.draw(ev.user_id, rng)
            if item is not None and item not in avoid and item not in drawn and item != ev.item_id:
                drawn.append(item)
        catalog = self.catalog
        for _ in range(self.count * 4):  # rejection sampling; a crowded catalog falls through
            if len(drawn) == self.count:
                break
            item = catalog[rng.randrange(len(catalog))]
            if item not in avoid and item not in drawn and item != ev.item_id:
                drawn.append(item)
        if len(drawn) < self.count:  # most of the catalog is the user's: draw from what is left
            left = [i for i in catalog if i not in avoid and i not in drawn and i != ev.item_id]
            drawn += rng.sample(left, min(len(left), self.count - len(drawn)))
        return drawn


@dataclass(slots=True)
class Read:
    """The features of one entity as of a time: the `n`-th read of its entity in the plan."""

    entity: Entity
    entity_id: str
    as_of_ms: int
    n: int


@dataclass(slots=True)
class PlannedRow:
    """A training row without its features, which come from the plan's `user_read`-th
    user read and `item_read`-th item read."""

    user_id: str
    item_id: str
    t: int  # the example event's time (its features are as of 1 ms before)
    user_read: int
    item_read: int
    label: int = 0
    weight: float = 1.0
    final: bool = True  # its label is known (False: a later event within the window may set it)
    event_id: str = ""

    def example(self, user: dict[str, FeatureValue], item: dict[str, FeatureValue]) -> Example:
        return Example(self.user_id, self.item_id, self.t - 1, user, item, self.label, self.weight)


class _Rows:
    """The planned rows in the order they were read; a row leaves once it and every
    row before it is final (an example waiting for its label holds the later ones)."""

    def __init__(self, within_ms: int) -> None:
        self.within_ms = within_ms
        self.rows: deque[PlannedRow] = deque()
        self.awaiting: deque[PlannedRow] = deque()  # not final, oldest first
        self.waiting: dict[tuple[str, str], list[PlannedRow]] = {}  # (user, item) -> those awaiting

    def hold(self, row: PlannedRow) -> None:
        self.rows.append(row)
        if not row.final:
            self.awaiting.append(row)
            self.waiting.setdefault((row.user_id, row.item_id), []).append(row)

    def label(self, ev: Event) -> None:
        """A label event: the user's examples on its item within the window turn positive."""
        t, within = ev.event_time, self.within_ms
        for row in self.waiting.get((ev.user_id, ev.item_id), ()):
            if row.t <= t <= row.t + within and row.event_id != ev.event_id:
                row.label = 1

    def ready(self, now_ms: int | None) -> Iterator[PlannedRow]:
        """Rows final by `now_ms` (None: the end: every row), in order."""
        awaiting, waiting, within = self.awaiting, self.waiting, self.within_ms
        while awaiting and (now_ms is None or awaiting[0].t + within < now_ms):
            row = awaiting.popleft()
            row.final = True
            key = (row.user_id, row.item_id)
            queue = waiting[key]
            queue.remove(row)
            if not queue:
                del waiting[key]
        rows = self.rows
        while rows and rows[0].final:
            yield rows.popleft()


class _SameTime:
    """The events of the current time, applied once time moves on, each once (the
    id rule; the ids forgotten as the online store's expire)."""

    def __init__(self, identity_ms: int) -> None:
        self.identity, self.identity_ms = Identity(), identity_ms
        self.applied = self.newest = 0
        self._held: list[Event] = []
        self._ids: set[tuple[str, str]] = set()

    def advance(self, t: int | None) -> Iterator[Event]:
        """The held events to apply when `t` (None: the end) is another time."""
        if not self._held or (t is not None and self._held[0].event_time == t):
            return
        for ev in self._held:
            if self.identity.remember(ev):
                yield ev
                self.applied += 1
                self.newest = max(self.newest, ev.event_time)
                if self.applied % SWEEP_EVERY == 0:
                    self.identity.forget_before(self.newest - self.identity_ms)
        self._held.clear()
        self._ids.clear()

    def hold(self, ev: Event) -> None:
        self._held.append(ev)
        self._ids.add((ev.user_id, ev.event_id))

    def seen(self, ev: Event) -> bool:
        """Its id was applied, or held, for its user."""
        return self.identity.seen(ev.user_id, ev.event_id) or (ev.user_id, ev.event_id) in self._ids


def example_plan(
    feature_set: FeatureSet, events: Iterable[Event], items: Mapping[str, Any]
) -> Iterator[Event | Read | PlannedRow]:
    """The training rows of a log (sorted by event time) without their features:
    the events the state applies (duplicates dropped by the online store's id
    rule; the events of one time applied only once time moves on, since an
    example's features are as of 1 ms before it and a tiled window's newest
    tile would otherwise hold them), the reads of an entity's features as of
    a time, and the rows, labelled by the rule, each after its reads.

    One plan, two executors: training_examples runs it against one
    ReplayState; the engine (recmesh.tools.training.engine) sends each
    entity's events and reads to the partition holding it, and joins the
    partitions' answers to the rows. Memory holds the identity window, the
    events of one time and the rows still waiting for their label.
    """
    rule = LabelRule.of(feature_set)
    catalog = sorted(items)
    if rule.negatives and not catalog:
        raise FailedPrecondition(
            f"training.negatives = {rule.negatives} draws from the item catalog, and none was given "
            "(the repository's [items] source, or --items)"
        )
    touched = TouchedItems(catalog)  # per user, the items of their events (negatives avoid them)
    hard = CoOccurring(feature_set.roles.learnt_behaviors or dict.fromkeys(rule.examples, 1.0))
    n_hard = round(rule.negatives * rule.hard_share)
    negatives = _Negatives(rule.negatives, n_hard, catalog, hard)
    now = _SameTime(feature_set.identity_ms)
    rows = _Rows(rule.within_ms)
    reads = {"user": 0, "item": 0}

    def read(entity: Entity, entity_id: str, as_of: int) -> Read:
        n = reads[entity]
        reads[entity] = n + 1
        return Read(entity, entity_id, as_of, n)

    for ev in events:
        t = ev.event_time
        yield from now.advance(t)
        yield from rows.ready(t)
        if rule.negatives:
            touched.add(ev.user_id, ev.item_id)
        if ev.behavior in rule.behaviors:
            rows.label(ev)
        if ev.behavior in rule.examples and not now.seen(ev):
            as_of = t - 1
            user, item = read("user", ev.user_id, as_of), read("item", ev.item_id, as_of)
            yield user
            yield item
            known = rule.immediate(ev)
            rows.hold(PlannedRow(ev.user_id, ev.item_id, t, user.n, item.n, known or 0,
                                 rule.weight(ev.behavior), known is not None, ev.event_id))  # fmt: skip
            if rule.negatives:
                for other in negatives.draw(ev, touched.of(ev.user_id)):
                    negative = read("item", other, as_of)
                    yield negative
                    rows.hold(PlannedRow(ev.user_id, other, t, user.n, negative.n))
        if n_hard:
            hard.add(ev)
        now.hold(ev)
    yield from now.advance(None)
    yield from rows.ready(None)


class ReadAnswers:
    """The answers to one entity's reads, taken in the rows' order: a row asks
    for read n, never one before the last it asked for (rows share a read)."""

    def __init__(self, answers: Iterator[tuple[int, dict[str, FeatureValue]]]) -> None:
        self._answers = answers
        self._n = -1
        self._row: dict[str, FeatureValue] = {}

    def get(self, n: int) -> dict[str, FeatureValue]:
        while self._n < n:
            self._n, self._row = next(self._answers)
        if self._n != n:
            raise RuntimeError(f"read {n} asked after read {self._n}: the answers are out of order")
        return self._row


def answer_reads(
    state: ReplayState, ops: Iterable[Event | Read]
) -> Iterator[tuple[int, dict[str, FeatureValue]]]:
    """The plan's events applied to `state` and its reads answered from it, in order."""
    for op in ops:
        if isinstance(op, Read):
            yield op.n, state.row(op.entity, op.entity_id, op.as_of_ms)
        else:
            state.apply_streams(op)


def training_examples(
    feature_set: FeatureSet,
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> Iterator[Example]:
    """One example per event of the repository's example behaviours (and its
    sampled negatives after it), labelled by its rule: example_plan run
    against one ReplayState holding both entities' streams.

    `events` must be sorted by event time. Labels look ahead (that is what a
    label is); features never do. Memory holds only the state retention window
    and the rows still waiting for their label.
    """
    state = ReplayState(feature_set, users, items)
    answered: dict[Entity, deque[tuple[int, dict[str, FeatureValue]]]] = {"user": deque(), "item": deque()}
    views = {e: ReadAnswers(_drain(answered[e])) for e in ENTITIES}
    for op in example_plan(feature_set, events, items):
        if isinstance(op, PlannedRow):
            yield op.example(views["user"].get(op.user_read), views["item"].get(op.item_read))
        elif isinstance(op, Read):
            answered[op.entity].append((op.n, state.row(op.entity, op.entity_id, op.as_of_ms)))
        else:
            state.apply_streams(op)


def _drain(
    queue: deque[tuple[int, dict[str, FeatureValue]]],
) -> Iterator[tuple[int, dict[str, FeatureValue]]]:
    while True:
        yield queue.popleft()


@dataclass(frozen=True)
class Query:
    """Features of a user and some items as of a moment (a ranking request, replayed)."""

    user_id: str
    as_of_ms: int
    items: tuple[str, ...]


def features_as_of(
    feature_set: FeatureSet,
    events: Iterable[Event],
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    queries: Iterable[Query],
) -> Iterator[tuple[Query, dict[str, FeatureValue], list[dict[str, FeatureValue]]]]:
    """Each query answered as a look-up at its `as_of_ms` would have been: the
    events (sorted by time) replayed up to it, then the user's and each item's
    features, real-time and offline. Queries are answered in time order. Only
    the queries' users' streams are kept (with every item's): the other users'
    events feed their items' streams alone."""
    pending = deque(sorted(queries, key=lambda q: (q.as_of_ms, q.user_id)))
    state = ReplayState(feature_set, users, items, only_users={q.user_id for q in pending})

    def answer(q: Query) -> tuple[Query, dict[str, FeatureValue], list[dict[str, FeatureValue]]]:
        rows = [state.row("item", item, q.as_of_ms) for item in q.items]
        return q, state.row("user", q.user_id, q.as_of_ms), rows

    for ev in events:
        while pending and pending[0].as_of_ms < ev.event_time:
            yield answer(pending.popleft())
        if not pending:
            return
        state.apply(ev)
    while pending:
        yield answer(pending.popleft())


def backfill(
    feature_set: FeatureSet,
    events_path: Path,
    out_path: Path,
    users: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    progress: Callable[[str], None] | None = None,
    run_size: int = 200_000,
) -> dict[str, Any]:
    """Point-in-time training rows for an event log, as JSON lines:
    {"user_id", "item_id", "as_of_ms", "label", "weight", "feature_version", "user": {...}, "item": {...}}."""
    from recmesh.features.eventlog import sorted_events

    started = time.perf_counter()
    rows = positives = 0
    with out_path.open("wb") as fh:
        for ex in training_examples(
            feature_set, sorted_events(events_path, feature_set.event_schema, run_size), users, items
        ):
            fh.write(
                orjson.dumps(
                    {
                        "user_id": ex.user_id,
                        "item_id": ex.item_id,
                        "as_of_ms": ex.as_of_ms,
                        "label": ex.label,
                        "weight": ex.weight,
                        "feature_version": feature_set.version,
                        "user": ex.user,
                        "item": ex.item,
                    }
                )
                + b"\n"
            )
            rows += 1
            positives += ex.label
            if progress is not None and rows % 20_000 == 0:
                progress(f"{rows} rows ({rows / (time.perf_counter() - started):.0f} rows/s)")
    return {
        "rows": rows,
        "positives": positives,
        "seconds": round(time.perf_counter() - started, 2),
        "feature_version": feature_set.version,
    }
