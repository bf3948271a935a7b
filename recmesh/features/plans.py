"""What the services do for a feature set, worked out once per feature set.

A FeatureSet says what is declared; the services need it arranged for their
work: the feature service's look-up (which streams each entity reads, how the
item script's reply is laid out, the defaults in declaration order: `ReadPlan`)
and the ingest's write (which streams an event of each entity goes into, which
attributes of the other entity its members carry, the event-id set, the
history: `WritePlan`). `plans(feature_set)` compiles both once per feature-set
version and every service takes them from there, instead of each constructor
calling back into the repository to plan its own work. (What a model reads is
planned per model, from its card: recmesh.features.vectorize.Vectorizer.)
"""

from __future__ import annotations

from dataclasses import dataclass

from recmesh.features.compute import Layout
from recmesh.features.repository import Entity, FeatureSet, FeatureValue, Kind, Stream

Defaults = tuple[tuple[str, FeatureValue], ...]  # (feature name, default) in declaration order


@dataclass(frozen=True)
class ReadPlan:
    """What a look-up reads (services/feature/store.py, offline_cache.py)."""

    user_streams: tuple[Stream, ...]
    item_streams: tuple[Stream, ...]
    # Values per item in the item script's reply, per stream (a count stream: one count
    # per window, then its newest event time; an events stream: its events), and in all.
    item_widths: tuple[int, ...]
    item_stride: int
    layouts: dict[tuple[Entity, str], Layout]
    realtime_defaults: dict[Entity, Defaults]
    offline_defaults: dict[Entity, Defaults]

    def item_spec(self, as_of_ms: int) -> str:
        """The item script's plan argument as of `as_of_ms` (services/feature/store.py)."""
        return stream_spec(self.item_streams, as_of_ms)

    def user_spec(self, as_of_ms: int) -> str:
        """The same script's plan for the user's tiled streams (read with the user's prefix)."""
        return stream_spec(self.user_tiled, as_of_ms)

    @property
    def user_tiled(self) -> tuple[Stream, ...]:
        return tuple(s for s in self.user_streams if s.tiled and s.features)

    @property
    def user_exact(self) -> tuple[Stream, ...]:
        return tuple(s for s in self.user_streams if not s.tiled and s.features)


def stream_spec(streams: tuple[Stream, ...], as_of_ms: int) -> str:
    """The read script's plan (services/feature/store.py) for `streams` as of `as_of_ms`."""
    parts = []
    for s in streams:
        if s.read == "count":
            parts.append(f"C|{s.id}|" + ",".join(str(as_of_ms - w) for w in s.windows))
        elif s.read == "tiles":
            parts.append(
                f"T|{s.id}|{as_of_ms // s.slide_ms}|" + ",".join(str(w // s.slide_ms) for w in s.windows)
            )
        elif s.read == "distinct":
            parts.append(f"D|{s.id}|{as_of_ms - s.widest_ms}|{s.scan}")
        else:
            parts.append(f"R|{s.id}|{as_of_ms - s.widest_ms}")
    return ";".join(parts)


@dataclass(frozen=True)
class WritePlan:
    """Where an event goes (services/feature/writer.py)."""

    streams: dict[Entity, tuple[Stream, ...]]
    # Attributes of each entity that the other's members carry (and live popularity's category).
    attributes_needed: dict[Entity, tuple[str, ...]]
    ids: Stream  # the event-id sets, maintained like a stream: kept for the longest retention
    history_behaviors: frozenset[str]  # kept in the user's history (learnt retrieval's seeds)
    covisit_stream: str | None


@dataclass(frozen=True)
class Plans:
    read: ReadPlan
    write: WritePlan


def _defaults(feature_set: FeatureSet, entity: Entity, kind: Kind) -> Defaults:
    return tuple((f.name, f.default) for f in feature_set.features_of(entity, kind))


def _read_plan(feature_set: FeatureSet) -> ReadPlan:
    item_streams = feature_set.streams_of("item")
    widths = tuple(len(s.windows) + 1 if s.read == "count" else 1 for s in item_streams)
    return ReadPlan(
        feature_set.streams_of("user"),
        item_streams,
        widths,
        sum(widths),
        {(s.entity, s.id): Layout.of(s) for s in feature_set.streams},
        {e: _defaults(feature_set, e, "realtime") for e in ("user", "item")},
        {e: _defaults(feature_set, e, "offline") for e in ("user", "item")},
    )


def _write_plan(feature_set: FeatureSet) -> WritePlan:
    roles = feature_set.roles
    category = [roles.category] if roles.category and roles.popularity_behaviors else []
    # Event ids: kept behind the user's newest event for FeatureSet.identity_ms, and expired
    # that long after the user's last event.
    retention = feature_set.identity_ms
    ids = Stream("ids", "user", frozenset(), (), False, (), (), retention, -(-retention // 1000), "range", ())
    return WritePlan(
        {e: feature_set.streams_of(e) for e in ("user", "item")},
        {
            "user": feature_set.attributes_needed("user"),
            "item": tuple(dict.fromkeys((*feature_set.attributes_needed("item"), *category))),
        },
        ids,
        frozenset(roles.learnt_behaviors) if roles.history_cap else frozenset(),
        roles.covisit_stream,
    )


_COMPILED: dict[str, Plans] = {}


def plans(feature_set: FeatureSet) -> Plans:
    """The feature set's plans, compiled on first use and shared by every
    service of the process (keyed by the feature-set version: its content hash)."""
    compiled = _COMPILED.get(feature_set.version)
    if compiled is None:
        compiled = _COMPILED[feature_set.version] = Plans(_read_plan(feature_set), _write_plan(feature_set))
    return compiled
