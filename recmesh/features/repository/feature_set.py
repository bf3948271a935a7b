"""The compiled form: the FeatureSet (features, streams, recall roles) the services read."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from recmesh.events import EventSchema
from recmesh.features.repository.declarations import LEARNT_METHODS, GuardMetric, RepositoryDecl
from recmesh.features.repository.terms import (
    DEFAULT_FRESHNESS_TAU_S,
    DEFAULT_TTL_S,
    Aggregate,
    DType,
    Entity,
    FeatureValue,
    Kind,
    OfflineType,
    parse_duration_ms,
)


@dataclass(frozen=True)
class FeatureDef:
    """One served feature. Real-time features carry their aggregation; offline
    ones their column and type."""

    name: str
    entity: Entity
    kind: Kind
    dtype: DType
    default: FeatureValue
    description: str = ""
    window_ms: int | None = None
    freshness_tau_s: float = DEFAULT_FRESHNESS_TAU_S
    ttl_s: int = DEFAULT_TTL_S
    aggregate: Aggregate | None = None
    behaviors: frozenset[str] = frozenset()
    by: str | None = None  # count_by: the other entity's attribute
    field: str | None = None  # sum / mean
    n: int = 0  # last_n
    scan: int = 0  # last_n
    stream: str = ""  # the stream (key family) whose events it aggregates
    slide_ms: int = 0  # tiled (terms.default_slide_ms); 0: an exact window
    column: str = ""  # offline: the source column
    offline_type: OfflineType | None = None
    separator: str = ";"
    missing: frozenset[str] = frozenset()
    invalid_default: bool = False


@dataclass(frozen=True)
class Stream:
    """One family of real-time state: the events of one entity whose behaviour is
    in `behaviors`, kept in a sorted set per entity id scored by event time
    (`{u:<id>}:s:<id>` / `{i:<id>}:s:<id>`). Its member is the event id,
    followed (FIELD_SEP-separated) by what its features need: the other
    entity's id (always, for an item: an event id is unique per user only),
    attributes of the other entity, numeric event values."""

    id: str
    entity: Entity
    behaviors: frozenset[str]
    features: tuple[FeatureDef, ...]
    other_id: bool
    attrs: tuple[str, ...]
    values: tuple[str, ...]
    retention_ms: int
    ttl_s: int
    # How a look-up reads it: 'count' (ZCOUNT per window; item features only),
    # 'latest' (the newest `scan` members: last_n only) or 'range' (all members in the window);
    # 'tiles' (a hash of per-tile partial aggregates, recmesh.features.tiles) or 'distinct'
    # (the newest distinct other ids, capped: last_n with a slide).
    read: Literal["count", "latest", "range", "tiles", "distinct"]
    windows: tuple[int, ...]  # distinct windows of its features, widest first
    scan: int = 0  # read == 'latest'; 'distinct': the ids kept
    slide_ms: int = 0  # read == 'tiles': the tile length

    @property
    def tiled(self) -> bool:
        """Held as aggregates (tiles or a capped distinct list), not one member per event."""
        return self.read in ("tiles", "distinct")

    @property
    def payload(self) -> bool:
        return self.other_id or bool(self.attrs) or bool(self.values)

    @property
    def widest_ms(self) -> int:
        return self.windows[0] if self.windows else self.retention_ms


@dataclass(frozen=True)
class RecallRoles:
    """The features the ranker's recall and diversity read (None: not declared)."""

    category: str | None
    affinity: str | None
    interests: str | None
    recent_items: str | None
    popularity_feature: str | None
    popularity_behaviors: frozenset[str]
    covisit_behaviors: frozenset[str]
    covisit_stream: str | None
    covisit_window_ms: int
    covisit_previous: int
    covisit_scan: int
    # Learnt retrieval: behaviour strengths (empty: off) and the user history's length.
    learnt_behaviors: dict[str, float] = field(default_factory=dict)
    history_cap: int = 0
    history_ttl_s: int = 0
    # recall.seen: the feature whose items are never recommended again, and its
    # behaviours; None: every item of the user's history and recent items.
    seen: str | None = None
    seen_behaviors: frozenset[str] | None = None


@dataclass(frozen=True)
class Guard:
    """`[evaluation.guard]`, compiled: when a running experiment's candidate is promoted
    or rolled back by itself (recmesh/evaluation/guard.py decides)."""

    metric: GuardMetric = "auc"
    min_answers: int = 1000  # answers with the metric in each arm before any decision
    max_drop: float = 0.01  # how much worse (absolute) the candidate may be
    confidence: float = 0.95  # one-sided
    max_answers: int = 20_000  # candidate answers with the metric: undecided by then -> roll back


@dataclass(frozen=True)
class Evaluation:
    """`[evaluation]`, compiled: what credits a shown item, and when an answer's figures are final."""

    positive: frozenset[str]  # empty: no behaviour credits anything (impressions are still counted)
    window_ms: int
    lateness_ms: int
    k: int
    guard: Guard | None = None  # None: no experiment is ended automatically


@dataclass(frozen=True)
class FeatureSet:
    name: str
    path: Path | None
    version: str
    decl: RepositoryDecl
    features: tuple[FeatureDef, ...]
    streams: tuple[Stream, ...]
    roles: RecallRoles
    max_events_per_key: int
    demo: bool = False
    by_name: dict[str, FeatureDef] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.by_name.update({f.name: f for f in self.features})

    def features_of(self, entity: Entity, kind: Kind | None = None) -> tuple[FeatureDef, ...]:
        return tuple(f for f in self.features if f.entity == entity and (kind is None or f.kind == kind))

    def streams_of(self, entity: Entity) -> tuple[Stream, ...]:
        return tuple(s for s in self.streams if s.entity == entity)

    def stream(self, stream_id: str, entity: Entity) -> Stream:
        return next(s for s in self.streams if s.id == stream_id and s.entity == entity)

    @cached_property
    def event_schema(self) -> EventSchema:
        return EventSchema(self.behaviors, self.aliases, self.value_names)

    @property
    def behaviors(self) -> tuple[str, ...]:
        return tuple(self.decl.events.behaviors)

    @property
    def aliases(self) -> dict[str, str]:
        return dict(self.decl.events.aliases)

    @property
    def value_names(self) -> tuple[str, ...]:
        return tuple(self.decl.events.value_fields)

    @cached_property
    def evaluation(self) -> Evaluation:
        e = self.decl.evaluation
        if e.positive is not None:
            positive = e.positive
        elif self.decl.training is not None and self.decl.training.label.behaviors is not None:
            positive = self.decl.training.label.behaviors
        else:
            positive = [b for b in self.behaviors if b == "click"]
        g = e.guard
        guard = None if g is None else Guard(g.metric, g.min_answers, g.max_drop, g.confidence, g.max_answers)
        return Evaluation(
            frozenset(positive), parse_duration_ms(e.window), parse_duration_ms(e.lateness), e.k, guard
        )

    @cached_property
    def retention_ms(self) -> int:
        """How far behind the newest event an event may still be applied (the ingest's
        lateness rule): the longest state retention or TTL of any stream."""
        return max([max(s.retention_ms, s.ttl_s * 1000) for s in self.streams], default=60 * 60 * 1000)

    @cached_property
    def identity_ms(self) -> int:
        """How long a user's event ids are kept behind their newest event: as long as
        any exact stream keeps events (a second event with a known id must not count
        where the first still does), and at least `[state] dedup`."""
        exact = [s.retention_ms for s in self.streams if not s.tiled]
        return max([*exact, parse_duration_ms(self.decl.state.dedup)])

    @cached_property
    def ttl_s(self) -> int:
        return max([s.ttl_s for s in self.streams], default=DEFAULT_TTL_S)

    def attributes_needed(self, entity: Entity) -> tuple[str, ...]:
        """Offline features of `entity` that the ingest reads to enrich events
        (what the other entity's count_by features group by, and the recall category)."""
        other: Entity = "item" if entity == "user" else "user"
        names = {a for s in self.streams_of(other) for a in s.attrs}
        return tuple(f.name for f in self.features_of(entity, "offline") if f.name in names)

    @property
    def source_dir(self) -> Path | None:
        return self.path.parent if self.path is not None else None

    def entity_source(self, entity: Entity) -> Path | None:
        decl = self.decl.users if entity == "user" else self.decl.items
        if decl.source is None or self.path is None:
            return None
        return (self.path.parent / decl.source).resolve()

    def entity_id_column(self, entity: Entity) -> str:
        decl = self.decl.users if entity == "user" else self.decl.items
        return decl.id or f"{entity}_id"

    def entity_delimiter(self, entity: Entity) -> str | None:
        return (self.decl.users if entity == "user" else self.decl.items).delimiter

    def recall_sources(self) -> list[dict[str, Any]]:
        """Each recall source of the ranker, whether this file lets it run, and why."""
        out = self._live_sources() + self._table_sources()
        return [{"source": n, "on": on, "why": why} for n, on, why in out]

    def _live_sources(self) -> list[tuple[str, bool, str]]:
        """(source, on, why) of the sources served from live counts and declared features."""
        r, roles = self.decl.recall, self.roles
        out: list[tuple[str, bool, str]] = []
        if roles.popularity_feature:
            out.append(("popular", True, f"items by their {roles.popularity_feature!r} feature"))
        else:
            default = "" if r.popularity is not None else " (recall.popularity not declared: the default)"
            out.append(("popular", True, f"items by {'/'.join(sorted(roles.popularity_behaviors))} events, "
                        f"counted live{default}"))  # fmt: skip
        if roles.covisit_stream:
            out.append(("covisit", True, f"items that followed the user's recent items within "
                        f"{roles.covisit_window_ms // 1000}s, counted live"))  # fmt: skip
        else:
            out.append(("covisit", False, "no recall.recent_items and no recall.covisit.behaviors"))
        if r.category and (r.affinity or r.interests):
            out.append(("category", True, f"items of the user's {r.affinity or r.interests!r} "
                        f"{r.category!r} values"))  # fmt: skip
        else:
            out.append(("category", False, "needs recall.category (an item attribute) and recall.affinity "
                        "or recall.interests"))  # fmt: skip
        if self.decl.items.texts is None:
            out.append(("semantic", False, "the repository declares no item texts (items.texts)"))
        elif not r.recent_items:
            out.append(("semantic", False, "needs recall.recent_items to query with"))
        else:
            out.append(("semantic", True, "items near the user's recent ones by text embedding"))
        return out

    def _table_sources(self) -> list[tuple[str, bool, str]]:
        """(source, on, why) of the sources served from built or imported tables."""
        learnt = self.decl.recall.learnt
        out: list[tuple[str, bool, str]] = []
        for method in LEARNT_METHODS:
            if not learnt.enabled or method not in learnt.methods:
                off = "enabled = false" if not learnt.enabled else f"methods leave {method!r} out"
                out.append((method, False, f"recall.learnt: {off}"))
            else:
                out.append((method, True, "once a version is built from your log (recmesh recall build, or "
                            "train --events), seeded by each user's history"))  # fmt: skip
        for byo in ("similar", "vectors"):
            out.append((byo, False, "your own candidates: on once imported (recmesh recall import)"))
        return out

    def describe(self) -> dict[str, Any]:
        """What the set holds, for logs and `recmesh repository show`."""
        return {
            "recall_sources": self.recall_sources(),
            "name": self.name,
            "version": self.version,
            "path": str(self.path) if self.path else None,
            "demo": self.demo,
            "behaviors": list(self.behaviors),
            "features": [
                {"name": f.name, "entity": f.entity, "kind": f.kind, "dtype": f.dtype,
                 **({"aggregate": f.aggregate, "window_ms": f.window_ms, "behaviors": sorted(f.behaviors),
                     "stream": f.stream, "slide_ms": f.slide_ms}
                    if f.kind == "realtime" else {"column": f.column})}
                for f in self.features
            ],
            "streams": [
                {"entity": s.entity, "id": s.id, "behaviors": sorted(s.behaviors), "read": s.read,
                 "retention_ms": s.retention_ms, "ttl_s": s.ttl_s, "slide_ms": s.slide_ms,
                 "member": ["event_id", *(["other_id"] if s.other_id else []), *s.attrs, *s.values]}
                for s in self.streams
            ],
        }  # fmt: skip
