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
- `[training]`: which events are training examples and how they are labelled;
- `[evaluation]`: which behaviours credit a shown item online, within what window, and
  `[evaluation.guard]`: when a running experiment's candidate is promoted or rolled back.

`load_repository` validates the file with pydantic and compiles it into a
`FeatureSet`: the features in declaration order, the event *streams* their
state lives in (one sorted set per entity and behaviour filter, see
`Stream`), and a version that is a content hash of the declarations. The
streaming ingest, the online look-up, the offline replay, vectorisation and
the served-feature log all read the `FeatureSet`; nothing is written per
feature. A bad file is an error naming the file, the key (and its line where
it can be found) and what is wrong.

The package keeps one concern per module, imported one way
(separators, terms <- declarations <- feature_set <- compiler <- load):
`separators` (FIELD_SEP, VALUE_SEP, `clean`: how values sit in a stored event
member), `terms` (entities, dtypes, aggregates, defaults, names, durations),
`declarations` (the pydantic models of the file), `feature_set` (the compiled
FeatureSet, Stream, FeatureDef, RecallRoles), `compiler` (declarations ->
FeatureSet, and its version hash) and `load` (reading the file, errors with
file:line, the loaders and DEMO_REPOSITORY). Every name is re-exported here:
import from `recmesh.features.repository`.
"""

from __future__ import annotations

from recmesh.features.repository.compiler import compile_repository
from recmesh.features.repository.declarations import (
    EMBEDDING_L2_DEFAULT,
    LEARNT_METHODS,
    Condition,
    ConstantBehavior,
    CovisitDecl,
    Derive,
    EntityDecl,
    EvaluationDecl,
    EventsDecl,
    GuardDecl,
    GuardMetric,
    LabelDecl,
    LearntDecl,
    OfflineDecl,
    PopularityFromEvents,
    RealtimeDecl,
    RecallDecl,
    RepositoryDecl,
    RepositoryMeta,
    StateDecl,
    TextsDecl,
    TrainingDecl,
)
from recmesh.features.repository.feature_set import (
    Evaluation,
    FeatureDef,
    FeatureSet,
    Guard,
    RecallRoles,
    Stream,
)
from recmesh.features.repository.load import (
    DEMO_REPOSITORY,
    RepositoryError,
    configured_feature_set,
    key_location,
    load_feature_set,
    parse_feature_set,
    served_feature_set,
)
from recmesh.features.repository.separators import FIELD_SEP, VALUE_SEP, clean
from recmesh.features.repository.terms import (
    AGGREGATES,
    DEFAULT_FRESHNESS_TAU_S,
    DEFAULT_OF,
    DEFAULT_SCAN,
    DEFAULT_TTL_S,
    DTYPE_OF_AGGREGATE,
    DTYPE_OF_OFFLINE,
    ENTITIES,
    NAME,
    Aggregate,
    DType,
    Duration,
    Entity,
    FeatureValue,
    Kind,
    OfflineType,
    TimeUnit,
    default_slide_ms,
    parse_duration_ms,
)

__all__ = [
    "AGGREGATES",
    "DEFAULT_FRESHNESS_TAU_S",
    "DEFAULT_OF",
    "DEFAULT_SCAN",
    "DEFAULT_TTL_S",
    "DEMO_REPOSITORY",
    "DTYPE_OF_AGGREGATE",
    "DTYPE_OF_OFFLINE",
    "EMBEDDING_L2_DEFAULT",
    "ENTITIES",
    "FIELD_SEP",
    "LEARNT_METHODS",
    "NAME",
    "VALUE_SEP",
    "Aggregate",
    "Condition",
    "ConstantBehavior",
    "CovisitDecl",
    "DType",
    "Derive",
    "Duration",
    "Entity",
    "EntityDecl",
    "Evaluation",
    "EvaluationDecl",
    "EventsDecl",
    "FeatureDef",
    "FeatureSet",
    "FeatureValue",
    "Guard",
    "GuardDecl",
    "GuardMetric",
    "Kind",
    "LabelDecl",
    "LearntDecl",
    "OfflineDecl",
    "OfflineType",
    "PopularityFromEvents",
    "RealtimeDecl",
    "RecallDecl",
    "RecallRoles",
    "RepositoryDecl",
    "RepositoryError",
    "RepositoryMeta",
    "StateDecl",
    "Stream",
    "TextsDecl",
    "TimeUnit",
    "TrainingDecl",
    "clean",
    "compile_repository",
    "configured_feature_set",
    "default_slide_ms",
    "key_location",
    "load_feature_set",
    "parse_duration_ms",
    "parse_feature_set",
    "served_feature_set",
]
