"""The declarations: the pydantic models a repository file (TOML) is validated into."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recmesh.features.repository.terms import (
    NAME,
    Aggregate,
    Duration,
    Entity,
    OfflineType,
    TimeUnit,
    _duration,
)


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
    # Tiles: the window is the tiles of this length that end within it (Flink's HOP);
    # "exact": every event kept and windows exact. Default: terms.default_slide_ms.
    slide: Duration | None = None
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
        if self.slide is not None and self.slide != "exact":
            slide = _duration(self.slide, "slide")
            if slide > window or window % slide:
                raise ValueError(
                    f"slide {self.slide!r} must divide the window {self.window!r} (a window is whole tiles)"
                )
        return self


class PopularityFromEvents(_Strict):
    """Popularity counted live by the ingest: +1 per event of these behaviours."""

    behaviors: list[str]


class CovisitDecl(_Strict):
    behaviors: list[str] | None = None  # default: the recent_items feature's behaviours
    window: Duration = "30m"
    previous: int = Field(5, ge=1, le=50)  # distinct earlier items paired with each event
    scan: int = Field(10, ge=1, le=1000)


LearntMethod = Literal["knn", "ease", "sequence"]
LEARNT_METHODS: tuple[LearntMethod, ...] = ("knn", "ease", "sequence")


class LearntDecl(_Strict):
    """Retrieval learnt from the event log (recmesh.retrieval): item-kNN and EASE
    tables and a next-item sequence model, built by `recmesh recall build` /
    `recmesh train --events`, seeded by each user's history (their newest
    distinct items, kept by the ingest)."""

    enabled: bool = True
    # behaviour -> strength in the tables and the history (a list: strength 1 each).
    # Default: what the training label calls a positive (its behaviours, or the
    # examples' with their training.weights when the label reads a value or is
    # implicit), else every behaviour.
    behaviors: dict[str, float] | list[str] | None = None
    methods: list[LearntMethod] = Field(default_factory=lambda: list(LEARNT_METHODS))
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
    # How long a user's event ids are remembered behind their newest event, at least
    # (an app re-sending an event within it counts once); exact streams keep them as
    # long as their state. A redelivered batch is recognised by its offsets instead.
    dedup: Duration = "1h"

    @model_validator(mode="after")
    def _dedup(self) -> StateDecl:
        _duration(self.dedup, "state.dedup")
        return self


GuardMetric = Literal["auc", "ctr", "hit", "ndcg"]


class GuardDecl(_Strict):
    """`[evaluation.guard]`: the guard that ends a running experiment by itself
    (docs/operations.md, *The guard*): it promotes the candidate once it is, at
    `confidence` (one-sided), not worse than control on `metric` by more than
    `max_drop`, and rolls it back once it is worse by more than that. Ranges are
    checked by the compiler (errors name the key)."""

    metric: GuardMetric = "auc"
    min_answers: int = 1000  # answers carrying the metric in each arm before any decision
    max_drop: float = 0.01  # how much worse (absolute) the candidate may be
    confidence: float = 0.95  # one-sided
    max_answers: int = 20_000  # candidate answers with the metric: still undecided -> roll back


class EvaluationDecl(_Strict):
    """Online evaluation (docs/operations.md, *Measuring models online*): an item
    shown in a recommendation is credited when the user does one of `positive`
    on it within `window` after the answer's as-of time; events up to `lateness`
    behind the stream still count before the figures of an answer are final."""

    positive: list[str] | None = None  # default: training.label.behaviors, else "click" when declared
    window: Duration = "30m"
    lateness: Duration = "2m"
    k: int = Field(10, ge=1, le=100)  # the position cut-off of CTR@k, hit rate@k, NDCG@k and AUC
    guard: GuardDecl | None = None  # absent: no experiment is ended automatically


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
    evaluation: EvaluationDecl = Field(default_factory=EvaluationDecl)
