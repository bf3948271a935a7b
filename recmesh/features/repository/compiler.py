"""The compiler: validated declarations -> FeatureSet (features, streams, roles, version hash)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from recmesh.features.repository.declarations import CovisitDecl, OfflineDecl, RecallDecl, RepositoryDecl
from recmesh.features.repository.feature_set import FeatureDef, FeatureSet, RecallRoles, Stream
from recmesh.features.repository.terms import (
    DEFAULT_OF,
    DEFAULT_SCAN,
    DEFAULT_TTL_S,
    DTYPE_OF_AGGREGATE,
    DTYPE_OF_OFFLINE,
    ENTITIES,
    NAME,
    Entity,
    FeatureValue,
    _duration,
    default_slide_ms,
    parse_duration_ms,
)


def _stream_id(behaviors: Iterable[str], slide_ms: int = 0, distinct: bool = False) -> str:
    """The stream's id (its key part): the behaviours, then '@<slide>' for tiles or
    '@last' for a capped distinct list."""
    base = "+".join(sorted(behaviors))
    if distinct:
        return f"{base}@last"
    return f"{base}@{_duration_text(slide_ms)}" if slide_ms else base


def _duration_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def resolved_slide_ms(window: str | int, slide: str | int | None) -> int:
    """A real-time feature's slide in ms (0: exact): as declared, or the default for its window."""
    if slide == "exact":
        return 0
    if slide is None:
        return default_slide_ms(parse_duration_ms(window))
    return parse_duration_ms(slide)


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
        # the slides in force (a default's rule may change; the values decide the features)
        "slides": {k: resolved_slide_ms(v.window, v.slide) for k, v in decl.realtime.items()},
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
        slide = resolved_slide_ms(rd.window, rd.slide)
        realtime.append(
            FeatureDef(
                name, rd.entity, "realtime", dtype, default, rd.description,
                window_ms=window, freshness_tau_s=parse_duration_ms(rd.freshness_tau) / 1000,
                ttl_s=-(-ttl_ms // 1000), aggregate=rd.aggregate, behaviors=behaviors, by=rd.by,
                field=rd.field, n=n, scan=rd.scan or (max(n, DEFAULT_SCAN) if n else 0),
                stream=_stream_id(behaviors, slide if rd.aggregate != "last_n" else 0,
                                  distinct=bool(slide) and rd.aggregate == "last_n"),
                slide_ms=slide if rd.aggregate != "last_n" else 0,
            )
        )  # fmt: skip
    _check_training(decl)
    _check_evaluation(decl)
    roles = _roles(decl, offline, {f.name: f for f in realtime})
    streams = _streams(realtime, roles, decl)
    # Declaration order within kind: offline first, then real-time (the served order).
    features = tuple(defs + realtime)
    name = decl.repository.name
    return FeatureSet(
        name=name, path=path, version=_version(decl), decl=decl, features=features, streams=streams,
        roles=roles, max_events_per_key=decl.state.max_events_per_key, demo=decl.repository.demo,
    )  # fmt: skip


def _check_evaluation(decl: RepositoryDecl) -> None:
    e = decl.evaluation
    unknown = sorted(set(e.positive or ()) - set(decl.events.behaviors))
    if unknown:
        raise ValueError(f"evaluation.positive: {unknown} not in events.behaviors {decl.events.behaviors}")
    for key in ("window", "lateness"):
        if _duration(getattr(e, key), f"evaluation.{key}") <= 0:
            raise ValueError(f"evaluation.{key}: must be longer than 0")
    g = e.guard
    if g is None:
        return
    if g.min_answers < 2:
        raise ValueError(f"evaluation.guard.min_answers: {g.min_answers} must be at least 2 (a variance)")
    if g.max_answers < g.min_answers:
        raise ValueError(
            f"evaluation.guard.max_answers: {g.max_answers} must be at least min_answers ({g.min_answers})"
        )
    if not 0.0 <= g.max_drop < 1.0:
        raise ValueError(f"evaluation.guard.max_drop: {g.max_drop} must be in [0, 1) (figures are in [0, 1])")
    if not 0.5 <= g.confidence < 1.0:
        raise ValueError(f"evaluation.guard.confidence: {g.confidence} must be in [0.5, 1)")


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


def _check_grouping_roles(
    r: RecallDecl,
    offline: Mapping[Entity, Mapping[str, OfflineDecl]],
    realtime: Mapping[str, FeatureDef],
) -> None:
    """recall.category, .affinity and .interests name features of the right kinds."""
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


def _last_n_behaviors(
    realtime: Mapping[str, FeatureDef], role: str, name: str | None
) -> frozenset[str] | None:
    """The behaviours of recall.<role>, a user last_n feature; None when the role is unset."""
    if name is None:
        return None
    f = realtime.get(name)
    if f is None or f.entity != "user" or f.aggregate != "last_n":
        raise ValueError(f"recall.{role}: {name!r} must be a user last_n real-time feature")
    return f.behaviors


def _popularity_role(
    decl: RepositoryDecl, offline: Mapping[Entity, Mapping[str, OfflineDecl]], vocab: set[str]
) -> tuple[str | None, frozenset[str]]:
    """(item feature, behaviours counted live) of recall.popularity: one of them is set."""
    popularity = decl.recall.popularity
    if isinstance(popularity, str):
        od = offline["item"].get(popularity)
        if od is None or od.type not in ("numeric", "integer"):
            raise ValueError(f"recall.popularity: {popularity!r} must be a numeric item feature")
        return popularity, frozenset()
    if popularity is not None:
        pop_behaviors = frozenset(popularity.behaviors)
        if not pop_behaviors or pop_behaviors - vocab:
            raise ValueError(
                f"recall.popularity.behaviors: {sorted(pop_behaviors - vocab)} not in events.behaviors"
            )
        return None, pop_behaviors
    # undeclared: counted live from what learnt retrieval counts (the label's positives), else all
    return None, frozenset(_learnt_behaviors(decl) or vocab)


def _covisit_role(
    cv: CovisitDecl | None, vocab: set[str], recent_behaviors: frozenset[str]
) -> tuple[frozenset[str], int, int, int]:
    """(behaviours, window ms, previous, scan) of recall.covisit; empty and zeros when off."""
    if cv is None:
        return frozenset(), 0, 0, 0
    cv_behaviors = frozenset(cv.behaviors) if cv.behaviors is not None else recent_behaviors
    if cv.behaviors is not None and (not cv_behaviors or cv_behaviors - vocab):
        raise ValueError(f"recall.covisit.behaviors: {sorted(cv_behaviors - vocab)} not in events.behaviors")
    return cv_behaviors, parse_duration_ms(cv.window), cv.previous, max(cv.scan, cv.previous)


def _roles(
    decl: RepositoryDecl,
    offline: Mapping[Entity, Mapping[str, OfflineDecl]],
    realtime: Mapping[str, FeatureDef],
) -> RecallRoles:
    r = decl.recall
    vocab = set(decl.events.behaviors)
    _check_grouping_roles(r, offline, realtime)
    recent_behaviors = _last_n_behaviors(realtime, "recent_items", r.recent_items) or frozenset()
    seen_behaviors = _last_n_behaviors(realtime, "seen", r.seen)
    pop_feature, pop_behaviors = _popularity_role(decl, offline, vocab)
    cv_behaviors, cv_window, cv_prev, cv_scan = _covisit_role(r.covisit, vocab, recent_behaviors)
    return RecallRoles(
        category=r.category, affinity=r.affinity, interests=r.interests, recent_items=r.recent_items,
        popularity_feature=pop_feature, popularity_behaviors=pop_behaviors,
        covisit_behaviors=cv_behaviors,
        covisit_stream=_stream_id(cv_behaviors, distinct=True) if cv_behaviors else None,
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
        slide = feats[0].slide_ms if feats else 0
        read: Literal["count", "latest", "range", "tiles", "distinct"]
        if sid.endswith("@last"):
            read = "distinct"
        elif slide:
            read = "tiles"
        elif entity == "item" and all(f.aggregate == "count" for f in feats):
            read = "count"
        elif only_last_n and entity == "user":
            read = "latest"
        else:
            read = "range"
        scan = max([f.scan for f in feats if f.aggregate == "last_n"], default=0)
        if read == "distinct":
            # its last_n features' n; co-visitation's earlier items (and the item itself)
            scan = max(
                [f.n for f in feats] + ([roles.covisit_scan, roles.covisit_previous + 1] if covisit else [])
            )
            # Tiles and distinct lists hold no event members: only what their features read.
        out.append(
            Stream(sid, entity, behaviors, tuple(feats), other_id, attrs, values, retention, ttl, read,
                   tuple(windows), scan, slide)
        )  # fmt: skip
    return tuple(out)
