"""The feature repository: one declarative file that says what a team's world looks like.

A repository file (TOML, `recmesh.toml`) declares
- `[events]`: where the event id, user, item, behaviour and event time live in
  the team's records, the time unit, the behaviour vocabulary with the team's
  own names mapped onto it, numeric fields carried by events, and extra events
  derived from one record (e.g. a high rating also counts as a click);
- `[users]` / `[items]`: the entities' offline features, typed columns read
  from CSV, Parquet or JSON lines;
- `[realtime.<name>]`: real-time features, each one aggregation over the
  event stream (AGGREGATES), with a window, a behaviour filter, an entity, a
  TTL and a freshness tau;
- `[recall]`: which declared features the ranker's recall reads (the item
  category, the user's affinity over it, recent items, popularity) and the
  co-visitation rule;
- `[training]`: which events are training examples and how they are labelled.

`load_repository` validates the file with pydantic and compiles it into a
`FeatureSet`: the features in declaration order, the event *streams* their
state lives in (one sorted set per entity and behaviour filter, see
`Stream`), and a version that is a content hash of the declarations. The
streaming ingest, the online look-up, the offline replay, vectorisation and
the served-feature log all read the `FeatureSet`; nothing is written per
feature. A bad file is an error naming the file, the key (and its line where
it can be found) and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recmesh.errors import InvalidArgument
from recmesh.events import EventSchema

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
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# Separators inside a stored event member (services/feature/writer.py): fields,
# and the values of a multi-valued attribute. Values are cleaned of them (and of
# tabs and newlines, which frame the write script's argument) before they are stored.
FIELD_SEP = "\x1f"
VALUE_SEP = "\x1e"
_UNSAFE = str.maketrans({FIELD_SEP: " ", VALUE_SEP: " ", "\t": " ", "\n": " ", "\r": " "})


def clean(text: str) -> str:
    """A value as it can be stored inside an event member."""
    return text.translate(_UNSAFE)


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConstantBehavior(_Strict):
    """Every record is this behaviour (e.g. a ratings file: every rating is a view)."""

    value: str


class Condition(_Strict):
    """A test on a numeric event field; set exactly one comparison."""

    field: str
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    equals: float | None = None

    @model_validator(mode="after")
    def _one(self) -> Condition:
        set_ = [
            k for k in ("at_least", "above", "at_most", "below", "equals") if getattr(self, k) is not None
        ]
        if len(set_) != 1:
            raise ValueError("set exactly one of at_least, above, at_most, below, equals")
        return self

    def holds(self, values: Mapping[str, float]) -> bool:
        v = values.get(self.field)
        if v is None:
            return False
        if self.at_least is not None:
            return v >= self.at_least
        if self.above is not None:
            return v > self.above
        if self.at_most is not None:
            return v <= self.at_most
        if self.below is not None:
            return v < self.below
        return v == self.equals


class Derive(_Strict):
    """One more canonical event from a record that meets `when` (same user, item
    and time; its id is the record's id with ':<behavior>' appended)."""

    behavior: str
    when: Condition


class EventsDecl(_Strict):
    event_id: str | None = "event_id"
    user_id: str = "user_id"
    item_id: str = "item_id"
    behavior: str | ConstantBehavior = "behavior"
    event_time: str = "event_time"
    time_unit: TimeUnit = "ms"
    behaviors: list[str] = Field(min_length=1)
    aliases: dict[str, str] = Field(default_factory=dict)
    # canonical name -> field in the team's records (a list: the same name)
    values: dict[str, str] | list[str] = Field(default_factory=dict)
    derive: list[Derive] = Field(default_factory=list)

    @field_validator("behaviors")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for b in v:
            if not NAME.match(b):
                raise ValueError(
                    f"behaviour {b!r}: use lowercase letters, digits and _ (start with a letter)"
                )
        if len(set(v)) != len(v):
            raise ValueError("a behaviour is listed twice")
        return v

    @property
    def value_fields(self) -> dict[str, str]:
        return {v: v for v in self.values} if isinstance(self.values, list) else dict(self.values)

    @model_validator(mode="after")
    def _consistent(self) -> EventsDecl:
        known = set(self.behaviors)
        for alias, target in self.aliases.items():
            if target not in known:
                raise ValueError(f"aliases.{alias}: {target!r} is not in behaviors {self.behaviors}")
            if alias in known:
                raise ValueError(
                    f"aliases.{alias}: {alias!r} is itself a declared behaviour; an alias names another"
                )
        if isinstance(self.behavior, ConstantBehavior) and self.behavior.value not in known:
            raise ValueError(f"behavior.value {self.behavior.value!r} is not in behaviors {self.behaviors}")
        for name in self.value_fields:
            if not NAME.match(name):
                raise ValueError(f"values: {name!r} is not a valid name")
        for n, d in enumerate(self.derive):
            if d.behavior not in known:
                raise ValueError(f"derive[{n}].behavior {d.behavior!r} is not in behaviors {self.behaviors}")
            if d.when.field not in self.value_fields:
                raise ValueError(f"derive[{n}].when.field {d.when.field!r} is not a declared value")
        return self


class OfflineDecl(_Strict):
    type: OfflineType
    column: str | None = None  # default: the feature's name
    default: Any = None  # default: 'unknown', 0, 0.0 or [] by type
    separator: str = ";"  # between the values of a multi-valued column in a text file
    missing: list[str] = Field(default_factory=list)  # cell values that mean "no value" (take the default)
    # A value that cannot be read as the type: "error" (the load stops, naming the
    # file, line and column) or "default" (it takes the default and is counted).
    invalid: Literal["error", "default"] = "error"
    description: str = ""


class TextsDecl(_Strict):
    """Item texts embedded for semantic recall (`recmesh embed items`)."""

    source: str | None = None  # default: the items' own source
    columns: list[str] = Field(min_length=1)


class EntityDecl(_Strict):
    source: str | None = None  # relative to the repository file; CSV, TSV, Parquet or JSON lines
    id: str | None = None  # the id column (default: user_id / item_id)
    delimiter: str | None = None  # CSV delimiter (default: ',', or tab for .tsv files)
    features: dict[str, OfflineDecl] = Field(default_factory=dict)
    texts: TextsDecl | None = None  # items only


class RealtimeDecl(_Strict):
    entity: Entity
    aggregate: Aggregate
    behaviors: list[str] | None = None  # None: every behaviour
    window: Duration
    # How long its state is kept: behind the stream's newest event, and after the
    # last write (the key's expiry). Default: max(window, 1h).
    ttl: Duration | None = None
    freshness_tau: Duration = "60s"
    by: str | None = None  # count_by: an offline feature of the other entity
    field: str | None = None  # sum / mean: a declared event value
    n: int | None = Field(None, ge=1, le=1000)  # last_n
    scan: int | None = Field(None, ge=1, le=10_000)  # last_n: newest events looked at (default max(n, 10))
    default: float | None = None  # mean: the value of an empty window (default 0.0)
    description: str = ""

    @model_validator(mode="after")
    def _shape(self) -> RealtimeDecl:
        needs = {"count_by": "by", "sum": "field", "mean": "field", "last_n": "n"}
        want = needs.get(self.aggregate)
        for opt in ("by", "field", "n", "scan", "default"):
            if getattr(self, opt) is None:
                continue
            allowed = {want} | ({"scan"} if self.aggregate == "last_n" else set())
            allowed |= {"default"} if self.aggregate == "mean" else set()
            if opt not in allowed:
                raise ValueError(f"{opt!r} does not apply to aggregate {self.aggregate!r}")
        if want is not None and getattr(self, want) is None:
            raise ValueError(f"aggregate {self.aggregate!r} needs {want!r}")
        window = _duration(self.window, "window")
        if self.ttl is not None and _duration(self.ttl, "ttl") < window:
            raise ValueError("ttl must be at least the window: state that expires sooner cannot fill it")
        _duration(self.freshness_tau, "freshness_tau")
        return self


class PopularityFromEvents(_Strict):
    """Popularity counted live by the ingest: +1 per event of these behaviours."""

    behaviors: list[str]


class CovisitDecl(_Strict):
    behaviors: list[str] | None = None  # default: the recent_items feature's behaviours
    window: Duration = "30m"
    previous: int = Field(5, ge=1, le=50)  # distinct earlier items paired with each event
    scan: int = Field(10, ge=1, le=1000)


LEARNT_METHODS: tuple[Literal["knn", "ease"], ...] = ("knn", "ease")


class LearntDecl(_Strict):
    """Retrieval learnt from the event log (recmesh.retrieval): item-kNN and EASE
    tables built by `recmesh recall build` / `recmesh train --events`, seeded by
    each user's history (their newest distinct items, kept by the ingest)."""

    enabled: bool = True
    # behaviour -> strength in the tables and the history (a list: strength 1 each).
    # Default: what the training label calls a positive (its behaviours, or the
    # examples' with their training.weights when the label reads a value or is
    # implicit), else every behaviour.
    behaviors: dict[str, float] | list[str] | None = None
    methods: list[Literal["knn", "ease"]] = Field(default_factory=lambda: list(LEARNT_METHODS))
    history: int = Field(50, ge=1, le=500)  # newest distinct items kept per user (the seeds)
    history_ttl: Duration = "180d"  # a user's history expires this long after their last event
    previous: int = Field(20, ge=1, le=100)  # item-kNN: earlier items each event is paired with
    neighbours: int = Field(200, ge=10, le=2000)  # kept per item and table
    ease_items: int = Field(10_000, ge=0, le=30_000)  # EASE's dense matrix: the most frequent items


class RecallDecl(_Strict):
    category: str | None = None  # item categorical/multi feature: category recall, diversity cap
    affinity: str | None = None  # user count_by feature over `category`
    interests: str | None = None  # user multi feature naming `category` values
    recent_items: str | None = None  # user last_n feature: co-visit seeds, semantic intent, seen filter
    # A user last_n feature whose items are never recommended to the user again
    # (e.g. what they bought); then items they only viewed may be. Default: an
    # item the user had any event on (their history, their recent items) is not.
    seen: str | None = None
    # item numeric feature, or counted live; default: counted live from the
    # events learnt retrieval counts (the label's positives), else every behaviour
    popularity: str | PopularityFromEvents | None = None
    covisit: CovisitDecl | None = Field(default_factory=CovisitDecl)
    learnt: LearntDecl = Field(default_factory=LearntDecl)


class LabelDecl(_Strict):
    """Positive when a `behaviors` event on the same item follows the example
    within `within` (inclusive; 0s: at the same time), when the example's own
    numeric `field` meets `at_least`, or, with `implicit = true`, always: every
    example event is itself a positive (implicit feedback: purchases, plays,
    clicks without impressions), and `training.negatives` supplies the zeros."""

    behaviors: list[str] | None = None
    within: Duration | None = None
    field: str | None = None
    at_least: float | None = None
    implicit: bool = False

    @model_validator(mode="after")
    def _one(self) -> LabelDecl:
        forms = (self.behaviors is not None) + (self.field is not None) + self.implicit
        if forms != 1:
            raise ValueError(
                "give one of: implicit = true (every example event is a positive), "
                "behaviors (+ within), or field (+ at_least)"
            )
        if self.behaviors is not None and self.within is None:
            raise ValueError("behaviors needs within, e.g. '10s'")
        if self.field is not None and self.at_least is None:
            raise ValueError("field needs at_least")
        return self


EMBEDDING_L2_DEFAULT = 1e-2


class TrainingDecl(_Strict):
    examples: list[str] = Field(min_length=1)  # behaviours whose events are training examples
    label: LabelDecl
    # behaviour -> weight of its examples in the training loss (default 1 each;
    # a sampled negative weighs 1): a purchase can count more than a view.
    weights: dict[str, float] = Field(default_factory=dict)
    # Per example, this many catalog items the user has had no event on, drawn
    # at random as of the example's time, labelled 0: for logs without
    # impressions (ratings, purchases), so the model learns what a user picks
    # from the catalog, not only how they judge what they already picked.
    negatives: int = Field(0, ge=0, le=100)
    # The share of those negatives drawn from what retrieval would propose (items
    # co-occurring with the user's recent items, counted from earlier events
    # only) instead of the whole catalog: the ranker must tell apart what recall
    # brings, not a random item from a liked one.
    hard_negatives: float = Field(0.0, ge=0.0, le=1.0)
    # L2 on the embedding rows a training step looks up. How much the data
    # needs differs: the demo's sessions 1e-2 (1e-4 overfits: holdout AUC
    # 0.707 -> 0.674), MovieLens 1e-4 (1e-2 erases the tables: 0.883 -> 0.852).
    embedding_l2: float = Field(EMBEDDING_L2_DEFAULT, ge=0.0, le=1.0)


class StateDecl(_Strict):
    max_events_per_key: int = Field(2000, ge=10, le=1_000_000)


class RepositoryMeta(_Strict):
    name: str
    description: str = ""
    demo: bool = False  # the embedded demo: its catalog loads only when asked (--demo)


class RepositoryDecl(_Strict):
    repository: RepositoryMeta
    events: EventsDecl
    users: EntityDecl = Field(default_factory=EntityDecl)
    items: EntityDecl = Field(default_factory=EntityDecl)
    realtime: dict[str, RealtimeDecl] = Field(default_factory=dict)
    recall: RecallDecl = Field(default_factory=RecallDecl)
    training: TrainingDecl | None = None  # needed to train (recmesh train), not to serve
    state: StateDecl = Field(default_factory=StateDecl)


# --- compiled form ----------------------------------------------------------------


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
    # 'latest' (the newest `scan` members: last_n only) or 'range' (all members in the window).
    read: Literal["count", "latest", "range"]
    windows: tuple[int, ...]  # distinct windows of its features, widest first
    scan: int = 0  # read == 'latest'

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


class RepositoryError(InvalidArgument):
    """A repository file that cannot be used; the message names the file and the key."""


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
    def retention_ms(self) -> int:
        """How far back any state reaches behind its newest event: the event-id
        (dedupe) sets and the lateness rule use it."""
        return max([s.retention_ms for s in self.streams], default=60 * 60 * 1000)

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
        r, roles = self.decl.recall, self.roles
        learnt = self.decl.recall.learnt
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
        for method in LEARNT_METHODS:
            if not learnt.enabled or method not in learnt.methods:
                off = "enabled = false" if not learnt.enabled else f"methods leave {method!r} out"
                out.append((method, False, f"recall.learnt: {off}"))
            else:
                out.append((method, True, "once a version is built from your log (recmesh recall build, or "
                            "train --events), seeded by each user's history"))  # fmt: skip
        for byo in ("similar", "vectors"):
            out.append((byo, False, "your own candidates: on once imported (recmesh recall import)"))
        return [{"source": n, "on": on, "why": why} for n, on, why in out]

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
                     "stream": f.stream} if f.kind == "realtime" else {"column": f.column})}
                for f in self.features
            ],
            "streams": [
                {"entity": s.entity, "id": s.id, "behaviors": sorted(s.behaviors), "read": s.read,
                 "retention_ms": s.retention_ms, "ttl_s": s.ttl_s,
                 "member": ["event_id", *(["other_id"] if s.other_id else []), *s.attrs, *s.values]}
                for s in self.streams
            ],
        }  # fmt: skip


def _stream_id(behaviors: Iterable[str]) -> str:
    return "+".join(sorted(behaviors))


def _version(decl: RepositoryDecl) -> str:
    """A content hash of what decides feature values: the real-time and offline
    declarations, the behaviour vocabulary and the state bound. Descriptions,
    file locations, the import mapping, recall roles and training rules do not
    count."""
    events = decl.events
    payload = {
        "behaviors": events.behaviors,
        "aliases": dict(sorted(events.aliases.items())),
        "values": sorted(events.value_fields),
        "users": {k: v.model_dump(exclude={"description", "column"}) for k, v in decl.users.features.items()},
        "items": {k: v.model_dump(exclude={"description", "column"}) for k, v in decl.items.features.items()},
        "realtime": {k: v.model_dump(exclude={"description"}) for k, v in decl.realtime.items()},
        "state": decl.state.model_dump(),
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return "fs-" + hashlib.sha256(blob).hexdigest()[:12]


def _offline_default(decl: OfflineDecl, where: str) -> FeatureValue:
    dtype = DTYPE_OF_OFFLINE[decl.type]
    if decl.default is None:
        return DEFAULT_OF[dtype]
    value = decl.default
    try:
        if dtype == "int" and isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
        if dtype == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if dtype == "str" and isinstance(value, str):
            return value
        if dtype == "strings" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"{where}.default: {value!r} is not a {decl.type} value")


def compile_repository(decl: RepositoryDecl, path: Path | None = None) -> FeatureSet:
    """The FeatureSet of a validated declaration; raises ValueError naming the key."""
    vocab = set(decl.events.behaviors)
    offline: dict[Entity, dict[str, OfflineDecl]] = {"user": decl.users.features, "item": decl.items.features}
    defs: list[FeatureDef] = []
    seen: set[str] = set()

    def claim(name: str, where: str) -> None:
        if not NAME.match(name):
            raise ValueError(f"{where}: {name!r} is not a valid feature name (lowercase, digits, _)")
        if name in seen:
            raise ValueError(
                f"{where}: feature {name!r} is declared twice (names are unique across entities)"
            )
        seen.add(name)

    for entity in ENTITIES:
        for name, od in offline[entity].items():
            where = f"{entity}s.features.{name}"
            claim(name, where)
            defs.append(
                FeatureDef(
                    name, entity, "offline", DTYPE_OF_OFFLINE[od.type], _offline_default(od, where),
                    od.description, column=od.column or name, offline_type=od.type, separator=od.separator,
                    missing=frozenset(od.missing), invalid_default=od.invalid == "default",
                )
            )  # fmt: skip
    realtime: list[FeatureDef] = []
    for name, rd in decl.realtime.items():
        where = f"realtime.{name}"
        claim(name, where)
        behaviors = frozenset(rd.behaviors) if rd.behaviors is not None else frozenset(vocab)
        unknown = sorted(behaviors - vocab)
        if unknown:
            raise ValueError(f"{where}.behaviors: {unknown} not in events.behaviors {decl.events.behaviors}")
        if not behaviors:
            raise ValueError(f"{where}.behaviors: empty")
        other: Entity = "item" if rd.entity == "user" else "user"
        if rd.by is not None:
            target = offline[other].get(rd.by)
            if target is None or target.type not in ("categorical", "multi"):
                raise ValueError(
                    f"{where}.by: {rd.by!r} must be a categorical or multi offline feature of the "
                    f"{other} ([{other}s.features])"
                )
        if rd.field is not None and rd.field not in decl.events.value_fields:
            raise ValueError(f"{where}.field: {rd.field!r} is not declared in events.values")
        window = parse_duration_ms(rd.window)
        ttl_ms = parse_duration_ms(rd.ttl) if rd.ttl is not None else max(window, DEFAULT_TTL_S * 1000)
        dtype = DTYPE_OF_AGGREGATE[rd.aggregate]
        default: FeatureValue = DEFAULT_OF[dtype]
        if rd.aggregate == "mean" and rd.default is not None:
            default = float(rd.default)
        n = rd.n or 0
        realtime.append(
            FeatureDef(
                name, rd.entity, "realtime", dtype, default, rd.description,
                window_ms=window, freshness_tau_s=parse_duration_ms(rd.freshness_tau) / 1000,
                ttl_s=-(-ttl_ms // 1000), aggregate=rd.aggregate, behaviors=behaviors, by=rd.by,
                field=rd.field, n=n, scan=rd.scan or (max(n, DEFAULT_SCAN) if n else 0),
                stream=_stream_id(behaviors),
            )
        )  # fmt: skip
    _check_training(decl)
    roles = _roles(decl, offline, {f.name: f for f in realtime})
    streams = _streams(realtime, roles, decl)
    # Declaration order within kind: offline first, then real-time (the served order).
    features = tuple(defs + realtime)
    name = decl.repository.name
    return FeatureSet(
        name=name, path=path, version=_version(decl), decl=decl, features=features, streams=streams,
        roles=roles, max_events_per_key=decl.state.max_events_per_key, demo=decl.repository.demo,
    )  # fmt: skip


def _check_training(decl: RepositoryDecl) -> None:
    vocab = set(decl.events.behaviors)
    t = decl.training
    if t is None:
        return
    unknown = sorted(set(t.examples) - vocab)
    if unknown or not t.examples:
        raise ValueError(
            f"training.examples: {unknown or '[]'} not in events.behaviors {decl.events.behaviors}"
        )
    lab = t.label
    if lab.behaviors is not None and (not lab.behaviors or set(lab.behaviors) - vocab):
        raise ValueError(
            f"training.label.behaviors: {sorted(set(lab.behaviors) - vocab)} not in events.behaviors "
            f"{decl.events.behaviors}"
        )
    if lab.within is not None and str(lab.within).strip() not in ("0", "0s", "0ms"):
        _duration(lab.within, "training.label.within")
    if lab.field is not None and lab.field not in decl.events.value_fields:
        raise ValueError(f"training.label.field: {lab.field!r} is not declared in events.values")
    if set(t.weights) - set(t.examples):
        raise ValueError(
            f"training.weights: {sorted(set(t.weights) - set(t.examples))} not in training.examples "
            f"{t.examples}"
        )
    if any(w <= 0 for w in t.weights.values()):
        raise ValueError("training.weights: weights must be positive")


def _roles(
    decl: RepositoryDecl,
    offline: Mapping[Entity, Mapping[str, OfflineDecl]],
    realtime: Mapping[str, FeatureDef],
) -> RecallRoles:
    r = decl.recall
    vocab = set(decl.events.behaviors)
    if r.category is not None:
        od = offline["item"].get(r.category)
        if od is None or od.type not in ("categorical", "multi"):
            raise ValueError(f"recall.category: {r.category!r} must be a categorical or multi item feature")
    if r.affinity is not None:
        f = realtime.get(r.affinity)
        if f is None or f.entity != "user" or f.aggregate != "count_by":
            raise ValueError(f"recall.affinity: {r.affinity!r} must be a user count_by real-time feature")
        if r.category is not None and f.by != r.category:
            raise ValueError(f"recall.affinity: {r.affinity!r} groups by {f.by!r}, not recall.category")
    if r.interests is not None:
        od = offline["user"].get(r.interests)
        if od is None or od.type not in ("categorical", "multi"):
            raise ValueError(f"recall.interests: {r.interests!r} must be a categorical or multi user feature")
    recent_behaviors: frozenset[str] = frozenset()
    if r.recent_items is not None:
        f = realtime.get(r.recent_items)
        if f is None or f.entity != "user" or f.aggregate != "last_n":
            raise ValueError(
                f"recall.recent_items: {r.recent_items!r} must be a user last_n real-time feature"
            )
        recent_behaviors = f.behaviors
    seen_behaviors: frozenset[str] | None = None
    if r.seen is not None:
        f = realtime.get(r.seen)
        if f is None or f.entity != "user" or f.aggregate != "last_n":
            raise ValueError(f"recall.seen: {r.seen!r} must be a user last_n real-time feature")
        seen_behaviors = f.behaviors
    pop_feature: str | None = None
    pop_behaviors: frozenset[str] = frozenset()
    if isinstance(r.popularity, str):
        od = offline["item"].get(r.popularity)
        if od is None or od.type not in ("numeric", "integer"):
            raise ValueError(f"recall.popularity: {r.popularity!r} must be a numeric item feature")
        pop_feature = r.popularity
    elif r.popularity is not None:
        pop_behaviors = frozenset(r.popularity.behaviors)
        if not pop_behaviors or pop_behaviors - vocab:
            raise ValueError(
                f"recall.popularity.behaviors: {sorted(pop_behaviors - vocab)} not in events.behaviors"
            )
    else:  # undeclared: counted live from what learnt retrieval counts (the label's positives), else all
        pop_behaviors = frozenset(_learnt_behaviors(decl) or vocab)
    cv = r.covisit
    cv_behaviors: frozenset[str] = frozenset()
    cv_window = cv_prev = cv_scan = 0
    if cv is not None:
        cv_behaviors = frozenset(cv.behaviors) if cv.behaviors is not None else recent_behaviors
        if cv.behaviors is not None and (not cv_behaviors or cv_behaviors - vocab):
            raise ValueError(
                f"recall.covisit.behaviors: {sorted(cv_behaviors - vocab)} not in events.behaviors"
            )
        cv_window, cv_prev, cv_scan = parse_duration_ms(cv.window), cv.previous, max(cv.scan, cv.previous)
    return RecallRoles(
        category=r.category, affinity=r.affinity, interests=r.interests, recent_items=r.recent_items,
        popularity_feature=pop_feature, popularity_behaviors=pop_behaviors,
        covisit_behaviors=cv_behaviors, covisit_stream=_stream_id(cv_behaviors) if cv_behaviors else None,
        covisit_window_ms=cv_window, covisit_previous=cv_prev, covisit_scan=cv_scan,
        learnt_behaviors=_learnt_behaviors(decl), history_cap=r.learnt.history if r.learnt.enabled else 0,
        history_ttl_s=parse_duration_ms(r.learnt.history_ttl) // 1000,
        seen=r.seen, seen_behaviors=seen_behaviors,
    )  # fmt: skip


def _learnt_behaviors(decl: RepositoryDecl) -> dict[str, float]:
    """Behaviour -> strength for learnt retrieval (LearntDecl.behaviors); {} when off."""
    learnt = decl.recall.learnt
    vocab = decl.events.behaviors
    if not learnt.enabled or not learnt.methods:
        return {}
    given = learnt.behaviors
    if isinstance(given, list):
        given = dict.fromkeys(given, 1.0)
    if given is None:
        t = decl.training
        if t is None:
            given = dict.fromkeys(vocab, 1.0)
        elif t.label.behaviors is not None:
            given = dict.fromkeys(t.label.behaviors, 1.0)
        else:  # the examples themselves (their values, or implicit feedback), weighted as in training
            given = {b: t.weights.get(b, 1.0) for b in t.examples}
    unknown = sorted(set(given) - set(vocab))
    if unknown:
        raise ValueError(f"recall.learnt.behaviors: {unknown} not in events.behaviors")
    if any(w <= 0 for w in given.values()):
        raise ValueError("recall.learnt.behaviors: strengths must be positive")
    return dict(sorted(given.items()))


def _streams(realtime: list[FeatureDef], roles: RecallRoles, decl: RepositoryDecl) -> tuple[Stream, ...]:
    groups: dict[tuple[Entity, str], list[FeatureDef]] = {}
    for f in realtime:
        groups.setdefault((f.entity, f.stream), []).append(f)
    covisit_key: tuple[Entity, str] | None = ("user", roles.covisit_stream) if roles.covisit_stream else None
    if covisit_key is not None and covisit_key not in groups:
        groups[covisit_key] = []  # a stream of its own for co-visitation's earlier items
    out: list[Stream] = []
    for (entity, sid), feats in groups.items():
        behaviors = feats[0].behaviors if feats else roles.covisit_behaviors
        covisit = (entity, sid) == covisit_key
        # An event id is unique per user: an item's members carry the user too,
        # so two users' events with the same id stay two members.
        other_id = covisit or entity == "item" or any(f.aggregate == "last_n" for f in feats)
        attrs = tuple(dict.fromkeys(f.by for f in feats if f.by is not None))
        values = tuple(dict.fromkeys(f.field for f in feats if f.field is not None))
        windows = sorted({f.window_ms or 0 for f in feats}, reverse=True)
        # A stream keeps its events for the longest TTL of its features (at least
        # every window), behind its newest event, and expires that long after its
        # last write: state as old as the TTL can still be read as of the past.
        covisit_s = -(-roles.covisit_window_ms // 1000) if covisit else 0
        ttl = max([f.ttl_s for f in feats] + ([DEFAULT_TTL_S, covisit_s] if covisit else []))
        retention = max([*windows, roles.covisit_window_ms if covisit else 0, ttl * 1000])
        only_last_n = bool(feats) and all(f.aggregate == "last_n" for f in feats)
        read: Literal["count", "latest", "range"]
        if entity == "item" and all(f.aggregate == "count" for f in feats):
            read = "count"
        elif only_last_n and entity == "user":
            read = "latest"
        else:
            read = "range"
        scan = max([f.scan for f in feats if f.aggregate == "last_n"], default=0)
        out.append(
            Stream(sid, entity, behaviors, tuple(feats), other_id, attrs, values, retention, ttl, read,
                   tuple(windows), scan)
        )  # fmt: skip
    return tuple(out)


# --- loading ----------------------------------------------------------------------


def _line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """Best effort: the line of the key `loc` names in a TOML text (its table's
    header, then the key inside it), for error messages."""
    lines = text.splitlines()
    parts = [str(p) for p in loc if not isinstance(p, int)]
    best: int | None = None
    # the longest table header that is a prefix of loc
    for depth in range(len(parts), 0, -1):
        header = ".".join(parts[:depth])
        for n, line in enumerate(lines):
            stripped = line.strip().replace(" ", "")
            if stripped in (f"[{header}]", f"[[{header}]]"):
                best = n + 1
                rest = parts[depth:]
                if rest:
                    key = rest[0]
                    for m in range(n + 1, len(lines)):
                        s = lines[m].strip()
                        if s.startswith("["):
                            break
                        if re.match(rf"^{re.escape(key)}\s*=", s):
                            return m + 1
                return best
    if parts:
        key = parts[-1]
        for n, line in enumerate(lines):
            if re.match(rf"^\s*{re.escape(key)}\s*=", line):
                return n + 1
    return best


def key_location(fs: FeatureSet, key: str) -> str:
    """ "path:line" of a dotted repository key (the file's name alone when the
    line cannot be found), for messages about the team's file."""
    if fs.path is None:
        return "(repository)"
    try:
        text = fs.path.read_text()
    except OSError:
        return str(fs.path)
    line = _line_of(text, tuple(key.split(".")))
    return f"{fs.path}{f':{line}' if line else ''}"


def _describe(err: ValidationError, path: Path, text: str) -> str:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ("function-after[_shape(), RealtimeDecl]",))
        key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")
        line = _line_of(text, loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/features.md)"
        out.append(f"{path}{f':{line}' if line else ''}: {key or '(top level)'}: {msg}")
    return "\n".join(out)


def parse_repository(text: str, path: Path) -> FeatureSet:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise RepositoryError(f"{path}: not valid TOML: {err}") from None
    try:
        decl = RepositoryDecl.model_validate(raw)
    except ValidationError as err:
        raise RepositoryError(_describe(err, path, text)) from None
    try:
        return compile_repository(decl, path.resolve())
    except ValueError as err:
        key = str(err).split(":", 1)[0]
        line = _line_of(text, tuple(re.split(r"[.\[\]]+", key)))
        raise RepositoryError(f"{path}{f':{line}' if line else ''}: {err}") from None


def load_repository(path: Path) -> FeatureSet:
    """Read, validate and compile a repository file (a directory means its recmesh.toml)."""
    if path.is_dir():
        path = path / "recmesh.toml"
    try:
        text = path.read_text()
    except OSError as err:
        raise RepositoryError(f"{path}: cannot read the repository file: {err.strerror or err}") from None
    return parse_repository(text, path)


# The demo repository, next to the source tree (a checkout or an editable
# install); an installed package has none, and services there must be told
# where the team's repository is (RECMESH_REPOSITORY).
DEMO_REPOSITORY = Path(__file__).resolve().parents[2] / "examples" / "demo" / "recmesh.toml"


def resolve_repository(path: Path | None) -> FeatureSet:
    """The repository a process serves: `path` (RECMESH_REPOSITORY), else the demo one."""
    if path is not None:
        return load_repository(path)
    if DEMO_REPOSITORY.exists():
        return load_repository(DEMO_REPOSITORY)
    raise RepositoryError(
        "RECMESH_REPOSITORY is not set and there is no demo repository next to this installation: "
        "point RECMESH_REPOSITORY at your recmesh.toml (docs/features.md)"
    )


def serving_repository(path: Path | None, service: str) -> FeatureSet:
    """The repository a service serves, announced in its log (a warning when it is the demo's)."""
    import structlog

    fs = resolve_repository(path)
    log = structlog.get_logger(f"recmesh.{service}")
    log.info("repository", name=fs.name, feature_set_version=fs.version, path=str(fs.path),
             features=len(fs.features), streams=len(fs.streams))  # fmt: skip
    if fs.demo:
        log.warning(
            "serving_demo_repository",
            detail="the demo's feature repository is served: set RECMESH_REPOSITORY to your recmesh.toml "
            "(docs/features.md)",
        )
    return fs
