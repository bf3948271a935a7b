"""The ranking pipeline: the declared graph (graph.py) run per request.

Every node starts as soon as its inputs are done, so independent nodes (the
user look-up and popularity; then the personal recall sources) run
concurrently. Each skippable node runs under its own deadline, its budget
share of the class budget (capped by what is left of the request's); a
required node may use all that is left. Before a node starts,
the ladder (policy.choose_level, from the remaining budget, the time spent so
far and the inference service's suggestion) is re-evaluated; the level only
rises within a request. A skippable node is skipped once the level reaches its
`skip_at_level` (`skipped:<node>`), and a skippable node that fails or runs
late gives its neutral answer with the reason in `degraded`; a required node
that fails fails the request. What the default graph's kinds fall back to:

- user look-up fails -> the personal recall sources recall nothing
  (`user_features_unavailable`);
- a recall source fails or is late -> it contributes nothing
  (`recall:<node>_unavailable` / `_timeout`); popularity serves its last list
  (`candidates_stale`); no candidates at all is the only error;
- item features fail -> every feature takes its declared default
  (`features_unavailable`);
- scoring fails -> the recall order stands (`scoring_unavailable`, model
  `recall`); a caller that presumes inference cold skips it (`inference_cold`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.errors import DeadlineExceeded, RecmeshError
from recmesh.evaluation.impression import CONTROL
from recmesh.features.repository import FeatureSet
from recmesh.resilience import current_slo_class, remaining_s
from recmesh.settings import RankerSettings
from recmesh.slo import with_budgets
from recmesh.telemetry import FALLBACKS, LATENCY_BUCKETS, child_span, children, observe
from services.ranker import graph as graphs
from services.ranker.fusion import contributions
from services.ranker.graph import Graph, NodeSpec, PipelineGraphError
from services.ranker.learnt import LearntSource, RecallHolder, RevisitSource, VectorSource
from services.ranker.policy import LEVEL_NAMES, choose_level
from services.ranker.recall import (
    CategorySource,
    CovisitSource,
    PopularSource,
    RecallSource,
    SemanticSource,
)
from services.ranker.semantic import IndexHolder
from services.ranker.stages import (
    FINAL_TYPES,
    KIND_SPECS,
    KINDS,
    LEARNT_SOURCES,
    Candidates,
    Env,
    Ordered,
    RequestState,
    Shadowed,
    SourceOut,
    is_inference_skip,
)

_log = structlog.get_logger("recmesh.ranker")

DEGRADATIONS = Counter(
    "recmesh_ranker_degradations_total", "Requests ranked at a degradation level > 0.", ("level", "slo_class")
)
IN_FLIGHT = Gauge(
    "recmesh_ranker_in_flight", "Rank calls in flight (over RECMESH_RANKER_CAPACITY: the ladder's load)."
)
STAGE_LATENCY = Histogram(
    "recmesh_ranker_stage_seconds",
    "Latency of one node of the ranking graph, by node, kind, resource, SLO class and outcome "
    "(ok, fallback, skipped).",
    ("stage", "kind", "resource", "slo_class", "outcome"),
    buckets=LATENCY_BUCKETS,
)
RECALL_LATENCY = Histogram(
    "recmesh_ranker_recall_seconds",
    "Latency of one recall source, by source, SLO class and outcome (ok, empty, timeout, error, skipped).",
    ("source", "slo_class", "outcome"),
    buckets=LATENCY_BUCKETS,
)
RECALL_CANDIDATES = Histogram(
    "recmesh_ranker_recall_candidates",
    "Candidates one recall source returned, by source and SLO class.",
    ("source", "slo_class"),
    buckets=(0, 1, 5, 10, 25, 50, 100, 200, 500, 1000),
)
SEMANTIC_SIGMA = Histogram(
    "recmesh_ranker_semantic_sigma",
    "Confidence sigma of the semantic source that shifted the fusion weights.",
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)
# their children by label values, looked up once (every request observes ~18)
_stage_latency = children(STAGE_LATENCY)
_recall_latency = children(RECALL_LATENCY)
_recall_candidates = children(RECALL_CANDIDATES)
_tracer = trace.get_tracer("recmesh.ranker")

# How much longer than its calls' deadline a node may run before it is cut off
# (gRPC surfaces an expired deadline a few ms late on a loaded machine).
NODE_GRACE_FACTOR = 1.25
NODE_GRACE_S = 0.005


@dataclass
class Ranked:
    items: list[tuple[str, float]]
    model_version: str
    feature_version: str
    degraded: list[str] = field(default_factory=list)
    recall_counts: dict[str, int] = field(default_factory=dict)
    sigma: float = 0.0
    arm: str = CONTROL
    shadow: Shadowed | None = None


def load_graph(settings: RankerSettings) -> Graph:
    """The configured graph (RECMESH_RANKER_PIPELINE, else the shipped one), validated."""
    graph = graphs.load(settings.pipeline_graph, KIND_SPECS)
    for node in graph.nodes.values():
        if node.kind.startswith("recall.") and settings.fusion_weights.get(node.name, 0.0) <= 0.0:
            raise PipelineGraphError(
                f"recall node '{node.name}' has no positive weight in RECMESH_RANKER_FUSION_WEIGHTS "
                f"({settings.fusion_weights}); it would never contribute"
            )
    final = graph.nodes[graph.output]
    if KIND_SPECS[final.kind].produces not in FINAL_TYPES:
        raise PipelineGraphError(
            f"the final node '{final.name}' ({final.kind}) must produce a ranked list "
            f"({' or '.join(FINAL_TYPES)}), not '{KIND_SPECS[final.kind].produces}'"
        )
    return graph


def build_pipeline(
    settings: RankerSettings, features: FeatureClient, inference: InferenceClient, feature_set: FeatureSet
) -> RankPipeline:
    """The graph from the settings, and the recall sources its kinds use: popularity,
    co-visitation, category affinity and, when item vectors exist under
    MODEL_DIR, embedding similarity; what they read of the user comes from the
    repository's recall roles. Raises PipelineGraphError for a bad graph."""
    graph = load_graph(settings)
    holder = IndexHolder(settings.model_dir)
    holder.refresh()
    learnt = RecallHolder(settings.model_dir, feature_set.version)
    learnt.refresh()
    roles = feature_set.roles
    sources: dict[str, RecallSource] = {
        "popular": PopularSource(features, settings.recall_cache_s),
        "covisit": CovisitSource(features, roles),
        "category": CategorySource(features, settings.affinity_categories, roles, settings.recall_cache_s),
        "semantic": SemanticSource(holder, roles, inference),
        **{
            name: LearntSource(name, learnt, roles)
            for name in LEARNT_SOURCES
            if name not in ("vectors", "revisit")
        },
        "vectors": VectorSource(learnt, roles),
        "revisit": RevisitSource(roles),
    }
    kinds = {n.kind for n in graph.nodes.values()}
    # The user look-up brings the co-visitation recall along when a covisit
    # source will read it (its seeds are the user's recent items), and the
    # user's history when a learnt source will.
    prefetch = roles.recent_items is not None and "recall.covisit" in kinds
    history = roles.history_cap if any(f"recall.{n}" in kinds for n in LEARNT_SOURCES) else 0
    env = Env(
        features,
        inference,
        settings,
        feature_set,
        sources,
        prefetch,
        history,
        learnt.fusion,
        learnt.blend,
        learnt.fusion_depth,
        learnt.serves,
    )
    return RankPipeline(env, graph, holder, learnt)


class RankPipeline:
    def __init__(
        self, env: Env, graph: Graph, index: IndexHolder | None = None, learnt: RecallHolder | None = None
    ) -> None:
        self._env = env
        self.graph = graph
        self._nodes = graph.nodes
        self._index = index
        self._learnt = learnt
        self._classes = with_budgets(env.settings.slo_budgets_ms)
        # The inference service's latest degradation hint and the Rank calls
        # now in flight (the ladder's load signals).
        self.inference_suggested_level = 0
        self.in_flight = 0

    def _fallback(self, req: RequestState, reason: str, err: Exception) -> None:
        req.degraded.append(reason)
        FALLBACKS.labels("ranker", reason, current_slo_class()).inc()
        span = trace.get_current_span()  # the node's stage span
        span.set_attribute("recmesh.fallback_reason", reason)
        span.add_event("fallback", {"reason": reason, "error": str(err)})
        _log.warning("fallback", reason=reason, error=str(err))

    def _climb_ladder(self, req: RequestState, started: float, budget_ms: float) -> None:
        left = remaining_s()
        elapsed_ms = (time.perf_counter() - started) * 1000
        load = self.in_flight / self._env.settings.capacity
        level = choose_level(None if left is None else left * 1000, budget_ms, elapsed_ms,
                             self.inference_suggested_level, load)  # fmt: skip
        req.level = max(req.level, level)

    async def _run_node(
        self,
        node: NodeSpec,
        req: RequestState,
        upstream: list[asyncio.Future[object]],
        started: float,
        budget_ms: float,
    ) -> object:
        # Await the inputs one by one: a done future returns at once, where a
        # gather would cost a future and a loop turn per node.
        inputs = {name: await fut for name, fut in zip(node.inputs, upstream, strict=True)}
        kind = KINDS[node.kind]
        slo = current_slo_class()
        self._climb_ladder(req, started, budget_ms)
        t0 = time.perf_counter()
        outcome = "ok"
        with child_span(_tracer, f"stage.{node.name}") as span:
            if span.is_recording():
                span.set_attributes({"recmesh.stage": node.name, "recmesh.kind": node.kind,
                                     "recmesh.resource": node.resource,
                                     "recmesh.degradation_level": req.level})  # fmt: skip
            if node.skippable and req.level >= node.skip_at_level:
                outcome = "skipped"
                req.degraded.append(f"skipped:{node.name}")
                out = kind.neutral(self._env, req, node, inputs)
            else:
                # A skippable node gets its share of the class budget; a required one
                # (no fallback) may use all that is left, or giving up would only
                # fail the request sooner.
                share_s = (node.budget_share if node.skippable else 1.0) * budget_ms / 1000
                left = remaining_s()
                cap_s = share_s if left is None else max(0.0, min(share_s, left))
                try:
                    # The stage passes cap_s on as its calls' gRPC deadline; the local
                    # bound is a little later so a slow downstream fails as
                    # DEADLINE_EXCEEDED (which its circuit breaker counts), not as
                    # a cancellation (which it cannot).
                    async with asyncio.timeout(cap_s * NODE_GRACE_FACTOR + NODE_GRACE_S):
                        out = await kind.run(self._env, req, node, inputs, cap_s)
                except (TimeoutError, RecmeshError) as err:
                    if not node.skippable:
                        if isinstance(err, TimeoutError):
                            raise DeadlineExceeded(f"node '{node.name}' ran past its budget") from err
                        raise
                    outcome = "fallback"
                    late = isinstance(err, TimeoutError | DeadlineExceeded)
                    reason = kind.fallback.format(node=node.name)
                    if is_inference_skip(err):
                        reason = "inference_cold"
                    elif late and reason.startswith("recall:"):
                        reason = reason.replace("_unavailable", "_timeout")
                    self._fallback(req, reason, err)
                    out = kind.neutral(self._env, req, node, inputs)
            span.set_attribute("recmesh.outcome", outcome)
            if isinstance(out, SourceOut):
                self._observe_source(span, out, slo, outcome, time.perf_counter() - t0)
            elif isinstance(out, Candidates):
                span.set_attribute("recmesh.candidates", len(out.items))
        observe(_stage_latency(node.name, node.kind, node.resource, slo, outcome), time.perf_counter() - t0)
        return out

    def _observe_source(
        self, span: trace.Span, out: SourceOut, slo: str, outcome: str, seconds: float
    ) -> None:
        got = out.recalled
        if outcome == "ok" and not got.items:
            outcome = "empty"
        elif outcome == "fallback":
            outcome = "error"
        if span.is_recording():
            span.set_attribute("recmesh.source", out.name)
            span.set_attribute("recmesh.candidates", len(got.items))
            if out.role == "semantic":
                span.set_attribute("recmesh.sigma", got.sigma)
            for k, v in got.attributes.items():
                span.set_attribute(f"recmesh.{k}", v)
        observe(_recall_latency(out.name, slo, outcome), seconds)
        observe(_recall_candidates(out.name, slo), len(got.items))

    async def rank(
        self,
        user_id: str,
        count: int,
        as_of_ms: int,
        context: Mapping[str, str] | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> Ranked:
        """`skip`: downstreams the caller presumes cold (scaled to zero) that this
        request may not wait for. With "inference" in it nothing calls inference:
        no query embedding for semantic recall, no scoring; the recall order
        stands (`inference_cold`)."""
        self.in_flight += 1
        IN_FLIGHT.set(self.in_flight)
        try:
            return await self._rank(user_id, count, as_of_ms, context, skip)
        finally:
            self.in_flight -= 1
            IN_FLIGHT.set(self.in_flight)

    async def _rank(
        self,
        user_id: str,
        count: int,
        as_of_ms: int,
        context: Mapping[str, str] | None,
        skip: frozenset[str],
    ) -> Ranked:
        req = RequestState(user_id, count, as_of_ms or int(time.time() * 1000), context or {}, skip)
        slo = current_slo_class()
        budget_ms = (self._classes[slo] if slo in self._classes else self._classes["C"]).budget_ms
        if self._index is not None:
            self._index.refresh_in_background()
        if self._learnt is not None:
            self._learnt.refresh_in_background()
        started = time.perf_counter()
        tasks: dict[str, asyncio.Future[object]] = {}
        loop = asyncio.get_running_loop()
        for name in self.graph.order:
            node = self._nodes[name]
            kind = KINDS[node.kind]
            if kind.idle is not None and kind.idle(self._env):
                # Nothing to do (a learnt source with no table): its neutral answer
                # now, with no task, inputs to wait for, span or deadline.
                done: asyncio.Future[object] = loop.create_future()
                done.set_result(kind.neutral(self._env, req, node, {}))
                tasks[name] = done
                continue
            upstream = [tasks[i] for i in node.inputs]
            tasks[name] = asyncio.ensure_future(self._run_node(node, req, upstream, started, budget_ms))
        try:
            out = await tasks[self.graph.output]
        finally:
            # Usually every node has finished by now: wait only for the rest.
            pending = []
            for task in tasks.values():
                if not task.done():
                    task.cancel()
                    pending.append(task)
                elif not task.cancelled():
                    task.exception()  # retrieved: a node's failure is handled by its consumers
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        assert isinstance(out, Ordered)  # load_graph checked the final node's type
        if req.suggested_level is not None:
            self.inference_suggested_level = req.suggested_level
        span = trace.get_current_span()
        if req.level:
            req.degraded.insert(0, f"ladder:{LEVEL_NAMES[req.level]}")
            DEGRADATIONS.labels(str(req.level), slo).inc()
        SEMANTIC_SIGMA.observe(req.sigma)
        span.set_attributes({"recmesh.degradation_level": req.level, "recmesh.sigma": req.sigma,
                             "recmesh.degraded": ",".join(req.degraded)})  # fmt: skip
        recall_counts = contributions(req.recall_pool)
        for name, n in recall_counts.items():
            span.set_attribute(f"recmesh.candidates.{name}", n)
        version = out.feature_version or self._env.feature_set.version
        items = out.items[:count]
        return Ranked(
            items, out.model_version, version, req.degraded, recall_counts, req.sigma, out.arm, out.shadow
        )
