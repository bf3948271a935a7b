"""What each kind of node in the ranking graph does, and its neutral fallback.

A kind has a `run` (the work, under the node's deadline) and a `neutral`
answer used when the node is skipped by the ladder or fails while skippable
(e.g. a recall source recalls nothing, features take their defaults, scoring
keeps the recall order). The graph (graph.py) says which nodes exist and how
they connect; `KIND_SPECS` tells the validator what each kind consumes and
produces. Values between nodes are the small dataclasses below.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry import trace

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import UNSCORED_MODEL, InferenceClient
from recmesh.errors import RecmeshError, Unavailable
from recmesh.evaluation.impression import CONTROL
from recmesh.features.block import first_values
from recmesh.features.repository import FeatureSet, FeatureValue
from recmesh.features.wire import row_values
from recmesh.retrieval.build import FUSION_HEAD
from recmesh.settings import RankerSettings
from recmesh.v1 import features_pb2 as fpb
from services.ranker.fusion import (
    Fused,
    Role,
    cap_per_category,
    drop_items,
    fuse,
    role_weights,
)
from services.ranker.graph import KindSpec, NodeSpec
from services.ranker.policy import SKIP_FINE_RANKING, blend_orders, sample_candidates
from services.ranker.recall import RecallContext, Recalled, RecallSource, seen_items


class InferenceSkipped(Unavailable):
    """Scoring not attempted because the caller said inference may be cold."""


@dataclass
class RequestState:
    user_id: str
    count: int
    as_of_ms: int
    context: Mapping[str, str]
    skip: frozenset[str]  # downstreams the caller presumes cold (x-recmesh-skip): not called
    degraded: list[str] = field(default_factory=list)
    level: int = 0
    sigma: float = 0.0
    # the candidates as recall left them (fused, then filtered): their sources are counted once, at the end
    recall_pool: Sequence[Fused] = ()
    suggested_level: int | None = None  # what inference said in this request


@dataclass(frozen=True)
class UserOut:
    values: dict[str, FeatureValue]
    # Freshness score 2^(-age/tau) per real-time feature, as the feature service served it.
    freshness: dict[str, float] = field(default_factory=dict)
    # The user's co-visitation recall, read by the feature service in the same
    # call (None: not asked, or its read failed there).
    related: list[tuple[str, float]] | None = None
    # The values are what the store holds (no fallback to defaults): the
    # candidate look-up need not read the user again.
    complete: bool = False
    # The row as served, passed on to scoring as it is.
    row: fpb.FeatureRow | None = None
    # The user's newest distinct items (None: not asked, or its read failed).
    history: list[str] | None = None


@dataclass(frozen=True)
class SourceOut:
    name: str  # the node's name: the key of its fusion weight
    role: Role
    recalled: Recalled


@dataclass(frozen=True)
class Candidates:
    items: list[Fused]


@dataclass(frozen=True)
class ItemFeatures:
    user: fpb.FeatureRow
    pool: list[tuple[str, float]]  # to be scored, in recall order
    rest: list[tuple[str, float]]  # not scored (sampled out), in recall order
    # the pool's features as served, in pool order: a packed block (forwarded to
    # inference as it is) or the message form (no columns: every feature's default)
    items: fpb.FeatureTable | fpb.ItemBlock
    categories: dict[str, str]  # item -> its recall category (diversity), where known
    feature_version: str


@dataclass(frozen=True)
class Shadowed:
    """A shadow experiment's candidate model: its version and its score of each item it scored."""

    model_version: str
    scores: dict[str, float]


@dataclass(frozen=True)
class Ordered:
    items: list[tuple[str, float]]
    model_version: str
    feature_version: str
    categories: dict[str, str]
    arm: str = CONTROL  # the experiment arm it was scored in
    shadow: Shadowed | None = None  # a shadow experiment's candidate scores, per item


@dataclass
class Env:
    """What the stages may use: the clients, the settings, the feature set, the recall sources."""

    features: FeatureClient
    inference: InferenceClient
    settings: RankerSettings
    feature_set: FeatureSet
    sources: dict[
        str, RecallSource
    ]  # by kind suffix: popular, covisit, category, semantic, knn, ease, similar
    # Ask the user look-up for the co-visitation recall too (the graph has a
    # covisit source): one feature call instead of two in a row.
    prefetch_related: bool = False
    # The user's history to ask the user look-up for (learnt sources' seeds; 0: none).
    history_limit: int = 0
    # The learnt recall version's fusion weights and model/recall blend (services/ranker/learnt.py).
    learnt_fusion: Callable[[], dict[str, float]] = dict
    learnt_blend: Callable[[], float] = float
    learnt_fusion_depth: Callable[[], dict[str, float]] = dict
    # Does the current learnt version serve this source ("": any)? Nothing is read
    # or run for a learnt source it does not.
    learnt_serves: Callable[[str], bool] = lambda _: False


Inputs = Mapping[str, object]
Pairs = list[tuple[str, float]]
Run = Callable[[Env, RequestState, NodeSpec, Inputs, float], Awaitable[object]]
Neutral = Callable[[Env, RequestState, NodeSpec, Inputs], object]


@dataclass(frozen=True)
class Kind:
    spec: KindSpec
    run: Run
    neutral: Neutral
    fallback: str  # the reason recorded when a skippable node fails ({node} is replaced)
    # True when the node has nothing to do (a learnt source with no table): its
    # neutral answer at once, with no span, metrics or deadline of its own.
    idle: Callable[[Env], bool] | None = None


def _one(inputs: Inputs, typ: type[object]) -> object | None:
    return next((v for v in inputs.values() if isinstance(v, typ)), None)


def _user(inputs: Inputs) -> dict[str, FeatureValue]:
    u = _one(inputs, UserOut)
    return u.values if isinstance(u, UserOut) else {}


def _user_freshness(inputs: Inputs) -> dict[str, float]:
    u = _one(inputs, UserOut)
    return u.freshness if isinstance(u, UserOut) else {}


def _user_related(inputs: Inputs) -> list[tuple[str, float]] | None:
    u = _one(inputs, UserOut)
    return u.related if isinstance(u, UserOut) else None


def _user_history(inputs: Inputs) -> list[str] | None:
    u = _one(inputs, UserOut)
    return u.history if isinstance(u, UserOut) else None


def _candidates(inputs: Inputs) -> list[Fused]:
    c = _one(inputs, Candidates)
    return c.items if isinstance(c, Candidates) else []


# --- user_features --------------------------------------------------------------


async def _run_user(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    limit = env.settings.recall_per_source if env.prefetch_related else 0
    resp = await env.features.get_features(
        req.user_id, [], req.as_of_ms, cap_s=cap_s, related_limit=limit, related_per_item=limit,
        history_limit=env.history_limit if env.learnt_serves("") else 0,
    )  # fmt: skip
    fresh = {name: fv.freshness for name, fv in resp.user.features.items()}
    related = [(i.item_id, i.score) for i in resp.related] if resp.related_included else None
    # A related read that failed is made up for by GetRelated; a user read that
    # fell back to defaults is retried by the candidate look-up.
    complete = all(d.startswith(("related_", "history_")) for d in resp.degraded)
    history = list(resp.history) if resp.history_included else None
    return UserOut(row_values(resp.user), fresh, related, complete, resp.user, history)


def _neutral_user(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    return UserOut({})


# --- recall.<source> --------------------------------------------------------------


def _recall_kind(source: str) -> tuple[Run, Neutral]:
    async def run(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
        src = env.sources[source]
        limit = env.settings.recall_per_source
        if source == "popular" or source in LEARNT_SOURCES:
            # popularity fills, and a learnt table alone can fill the candidates
            limit = max(limit, env.settings.candidates)
        ctx = RecallContext(
            req.user_id, _user(inputs), req.context, limit, cap_s, _user_freshness(inputs), req.skip,
            _user_related(inputs), _user_history(inputs),
        )  # fmt: skip
        got = await src.fetch(ctx)
        if got.stale:
            reason = "candidates_stale" if source == "popular" else f"recall:{node.name}_stale"
            req.degraded.append(reason)
            trace.get_current_span().set_attribute("recmesh.fallback_reason", reason)  # the stage's span
        return SourceOut(node.name, src.role, got)

    def neutral(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
        return SourceOut(node.name, env.sources[source].role, Recalled([]))

    return run, neutral


# --- fuse, filter_seen --------------------------------------------------------------


async def _run_fuse(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    outs = [v for v in inputs.values() if isinstance(v, SourceOut)]
    sigma = max((o.recalled.sigma for o in outs), default=0.0)
    lists = {o.name: o.recalled.items for o in outs}

    def weights(learnt: dict[str, float]) -> dict[str, float]:
        base = effective_weights(env, learnt)
        return role_weights(
            {o.name: base.get(o.name, 0.0) for o in outs}, {o.name: o.role for o in outs}, sigma
        )

    head = env.learnt_fusion()
    fused = fuse(lists, weights(head))
    depth = env.learnt_fusion_depth()
    if depth and depth != head:  # past the head, the weights learnt for reaching the model (rrf_head_tail)
        top = fused[:FUSION_HEAD]
        chosen = {f.item_id for f in top}
        fused = top + [f for f in fuse(lists, weights(depth)) if f.item_id not in chosen]
    req.sigma = sigma
    if not fused:
        raise Unavailable("no candidates from any recall source")
    req.recall_pool = fused[: env.settings.candidates]
    return Candidates(fused)


# With learnt weights in force, the sources they were not learnt for (co-visits
# of the last day, category popularity, embedding similarity) fill in for what
# the tables do not know (items and pairs newer than the build) rather than
# compete with them: their configured weights are scaled by this. Measured on
# MovieLens-100k (docs/models.md): at full weight they cut recall alone's HR@10
# from 0.225 to 0.207.
UNLEARNT_SCALE = 0.15
# Popularity keeps at least this weight, so a user with no history (nothing
# for the tables to start from) still gets candidates.
PRIOR_FLOOR = 0.01


def effective_weights(env: Env, learnt: dict[str, float] | None = None) -> dict[str, float]:
    """The configured fusion weights, with the learnt recall version's (`learnt`,
    default its head's) for the sources it learnt them for, unless
    RECMESH_RANKER_FUSION_WEIGHTS names them."""
    base = dict(env.settings.fusion_weights)
    learnt = env.learnt_fusion() if learnt is None else learnt
    if not learnt:
        return base
    explicit = base if "fusion_weights" in env.settings.model_fields_set else {}
    for name in base:
        if name not in explicit and name not in learnt and name not in LEARNT_SOURCES:
            base[name] *= UNLEARNT_SCALE
    for name, w in learnt.items():
        if name not in explicit:
            base[name] = max(w, PRIOR_FLOOR) if name == "popular" else w
    return base


async def _run_filter(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    kept = drop_items(_candidates(inputs), set(seen_items(env.feature_set.roles, _user(inputs))))[
        : env.settings.candidates
    ]
    if not kept:
        raise Unavailable("every candidate was filtered out")
    req.recall_pool = kept
    return Candidates(kept)


def _passthrough(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    return Candidates(_candidates(inputs)[: env.settings.candidates])


# --- item_features, score, diversify ------------------------------------------------


def _pool(env: Env, req: RequestState, inputs: Inputs) -> tuple[Pairs, Pairs]:
    """The candidates to score (fewer from ladder level 1) and the rest, in recall order."""
    candidates = [(f.item_id, f.score) for f in _candidates(inputs)[: env.settings.candidates]]
    pool = sample_candidates(candidates, req.level)
    return pool, candidates[len(pool) :]


async def _run_features(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    pool, rest = _pool(env, req, inputs)
    # The user look-up ran at the same as_of: when it read the store without
    # falling back, read the items only.
    u = _one(inputs, UserOut)
    complete = isinstance(u, UserOut) and u.complete
    block = env.settings.item_block
    resp = await env.features.get_features(
        req.user_id, [i for i, _ in pool], req.as_of_ms, cap_s=cap_s, items_only=complete, item_block=block
    )
    req.degraded.extend(f"feature:{d}" for d in resp.degraded)
    user = resp.user if resp.user.features else _user_row(req, inputs)
    items = resp.item_block if block else resp.items
    categories = _categories(env, items)
    return ItemFeatures(user, pool, rest, items, categories, resp.feature_version)


def _user_row(req: RequestState, inputs: Inputs) -> fpb.FeatureRow:
    u = _one(inputs, UserOut)
    if isinstance(u, UserOut) and u.row is not None:
        return u.row
    return fpb.FeatureRow(entity_id=req.user_id)


def _neutral_features(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    pool, rest = _pool(env, req, inputs)
    items = fpb.FeatureTable(entity_ids=[i for i, _ in pool])  # no columns: every feature's default
    return ItemFeatures(_user_row(req, inputs), pool, rest, items, {}, env.feature_set.version)


def _categories(env: Env, table: fpb.FeatureTable | fpb.ItemBlock) -> dict[str, str]:
    """Each item's recall category (its first value, for a multi-valued one): the diversity cap."""
    name = env.feature_set.roles.category
    if isinstance(table, fpb.ItemBlock):
        firsts = first_values(table, name) if name else None
        return {i: v for i, v in zip(table.entity_ids, firsts or (), strict=False) if v}
    col = next((c for c in table.columns if c.name == name), None) if name else None
    if col is None:
        return {}
    if col.texts:
        values = list(col.texts)
    elif col.string_lists:
        values = [s.values[0] if s.values else "" for s in col.string_lists]
    else:
        return {}
    return {i: v for i, v in zip(table.entity_ids, values, strict=True) if v}


async def _run_score(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    f = _one(inputs, ItemFeatures)
    assert isinstance(f, ItemFeatures)  # guaranteed by validation
    if "inference" in req.skip:
        raise InferenceSkipped("the caller presumes inference cold")
    ids = [i for i, _ in f.pool]
    # Levels 1-3 ask inference for its cheaper model variants (policy.py).
    variant = min(req.level, SKIP_FINE_RANKING - 1)
    scored = await env.inference.score_features(
        f.feature_version, f.user, f.items, level=variant, cap_s=cap_s
    )
    req.suggested_level = scored.suggested_level
    trace.get_current_span().set_attribute("recmesh.inference_served_level", scored.level)
    blend = env.settings.recall_blend
    items = blend_orders(ids, scored.scores, env.learnt_blend() if blend is None else blend)
    items += [(i, 0.0) for i, _ in f.rest]
    shadow = None
    if scored.shadow_scores is not None:
        shadow = Shadowed(scored.shadow_model_version, dict(zip(ids, scored.shadow_scores, strict=True)))
    return Ordered(items, scored.model_version, f.feature_version, f.categories, scored.arm, shadow)


def _neutral_score(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    f = _one(inputs, ItemFeatures)
    assert isinstance(f, ItemFeatures)
    return Ordered(f.pool + f.rest, UNSCORED_MODEL, f.feature_version, f.categories)


async def _run_diversify(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs, cap_s: float) -> object:
    o = _one(inputs, Ordered)
    assert isinstance(o, Ordered)
    items = cap_per_category(o.items, o.categories, env.settings.max_per_category, req.count)
    return replace(o, items=items)


def _neutral_diversify(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    o = _one(inputs, Ordered)
    assert isinstance(o, Ordered)
    return replace(o, items=o.items[: req.count])


def _learnt_idle(source: str) -> Callable[[Env], bool]:
    if source == "revisit":  # needs no table: the history and recall.seen
        return lambda env: env.feature_set.roles.seen is None or not env.history_limit
    return lambda env: not env.learnt_serves(source)


def _no_neutral(env: Env, req: RequestState, node: NodeSpec, inputs: Inputs) -> object:
    raise Unavailable(f"node '{node.name}' ({node.kind}) has no fallback")


def _kinds() -> dict[str, Kind]:
    kinds = {
        "user_features": Kind(KindSpec("user"), _run_user, _neutral_user, "user_features_unavailable"),
        "fuse": Kind(
            KindSpec("candidates", requires=("recall",), accepts=("recall",), many=("recall",)),
            _run_fuse, _no_neutral, "fuse_failed",
        ),
        "filter_seen": Kind(
            KindSpec("candidates", requires=("candidates",), accepts=("candidates", "user")),
            _run_filter, _passthrough, "filter_failed",
        ),
        "item_features": Kind(
            KindSpec("features", requires=("candidates",), accepts=("candidates", "user")),
            _run_features, _neutral_features, "features_unavailable",
        ),
        "score": Kind(
            KindSpec("scored", requires=("features",), accepts=("features",)),
            _run_score, _neutral_score, "scoring_unavailable",
        ),
        "diversify": Kind(
            KindSpec("final", requires=("scored",), accepts=("scored",)),
            _run_diversify, _neutral_diversify, "diversify_failed",
        ),
    }  # fmt: skip
    for source in (*LEARNT_SOURCES, "popular", "covisit", "category", "semantic"):
        run, neutral = _recall_kind(source)
        needs = () if source == "popular" else ("user",)
        kinds[f"recall.{source}"] = Kind(
            KindSpec("recall", requires=needs, accepts=("user",)),
            run,
            neutral,
            "recall:{node}_unavailable",
            _learnt_idle(source) if source in LEARNT_SOURCES else None,
        )
    return kinds


LEARNT_SOURCES = ("knn", "ease", "sequence", "similar", "vectors", "revisit")
KINDS: dict[str, Kind] = _kinds()
KIND_SPECS: dict[str, KindSpec] = {name: k.spec for name, k in KINDS.items()}
# What the final node may produce, and how the answer is read from it.
FINAL_TYPES = ("final", "scored")


def is_inference_skip(err: Exception) -> bool:
    return isinstance(err, InferenceSkipped)


__all__ = ["KINDS", "KIND_SPECS", "Env", "RecmeshError", "RequestState"]
