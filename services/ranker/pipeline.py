"""The ranking stages and what each falls back to.

- user features: one look-up of the user alone (recent views, 10-minute
  category clicks, interests), which the personal recall sources need; on
  failure they recall nothing (`user_features_unavailable`);
- recall: the sources of recall.py, run concurrently, each under its own
  deadline; a failed or late source contributes nothing (`recall:<name>_<why>`),
  popularity falls back to its last list (`candidates_stale`); no candidates at
  all is the only error;
- fuse + filter: the hybrid rule of fusion.py, then items the user just saw go;
- features: one batch look-up as of the request's logical timestamp; on failure
  every feature takes its declared default (`features_unavailable`);
- scoring: the inference service; on failure the recall order stands
  (`scoring_unavailable`, model `recall`);
- re-rank: at most `max_per_category` items per category.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from recmesh.clients import FeatureClient, InferenceClient
from recmesh.errors import DeadlineExceeded, RecmeshError, Unavailable
from recmesh.features.definitions import FEATURE_SET_VERSION, FeatureValue
from recmesh.features.vectorize import COLUMNS, build_matrix
from recmesh.features.wire import row_values, table_rows
from recmesh.resilience import current_slo_class, remaining_s
from recmesh.settings import RankerSettings
from recmesh.slo import DEFAULT_CLASSES
from recmesh.telemetry import FALLBACKS, LATENCY_BUCKETS
from services.ranker.fusion import cap_per_category, contributions, drop_items, fuse, role_weights
from services.ranker.policy import LEVEL_NAMES, choose_level, sample_candidates, top_n
from services.ranker.recall import (
    CategorySource,
    CovisitSource,
    PopularSource,
    RecallContext,
    Recalled,
    RecallSource,
    SemanticSource,
    last_viewed,
)
from services.ranker.semantic import IndexHolder

_log = structlog.get_logger("recmesh.ranker")

DEGRADATIONS = Counter(
    "recmesh_ranker_degradations_total", "Requests ranked at a degradation level > 0.", ("level", "slo_class")
)
RECALL_LATENCY = Histogram(
    "recmesh_ranker_recall_seconds",
    "Latency of one recall source, by source, SLO class and outcome (ok, empty, timeout, error).",
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
_tracer = trace.get_tracer("recmesh.ranker")

FALLBACK_MODEL = "recall"
# Upper bounds per stage for requests that arrive without a deadline.
USER_FEATURES_CAP_S = 0.1
FEATURES_CAP_S = 0.5
SCORING_CAP_S = 0.5


class InferenceSkipped(Unavailable):
    """Scoring not attempted because the caller said inference may be cold."""


@dataclass
class Ranked:
    items: list[tuple[str, float]]
    model_version: str
    feature_version: str
    degraded: list[str] = field(default_factory=list)
    recall_counts: dict[str, int] = field(default_factory=dict)
    sigma: float = 0.0


def build_pipeline(
    settings: RankerSettings, features: FeatureClient, inference: InferenceClient
) -> RankPipeline:
    """The default sources: popularity, co-visitation, category affinity and,
    when item vectors exist under MODEL_DIR, embedding similarity."""
    holder = IndexHolder(settings.model_dir)
    holder.refresh()
    sources: list[RecallSource] = [
        PopularSource(features),
        CovisitSource(features),
        CategorySource(features, settings.affinity_categories),
        SemanticSource(holder),
    ]
    return RankPipeline(features, inference, settings, sources, holder)


class RankPipeline:
    def __init__(
        self,
        features: FeatureClient,
        inference: InferenceClient,
        settings: RankerSettings,
        sources: Sequence[RecallSource],
        index: IndexHolder | None = None,
    ) -> None:
        self._features = features
        self._inference = inference
        self._settings = settings
        self._sources = list(sources)
        self._roles = {s.name: s.role for s in sources}
        self._index = index
        # The inference service's latest degradation hint (for the ladder).
        self.inference_suggested_level = 0

    @property
    def sources(self) -> list[str]:
        return [s.name for s in self._sources]

    def _fallback(self, degraded: list[str], reason: str, err: Exception) -> None:
        degraded.append(reason)
        FALLBACKS.labels("ranker", reason, current_slo_class()).inc()
        trace.get_current_span().add_event("fallback", {"reason": reason, "error": str(err)})
        _log.warning("fallback", reason=reason, error=str(err))

    def _stage_cap(self, cap_s: float) -> float:
        left = remaining_s()
        return cap_s if left is None else max(0.0, min(cap_s, left))

    async def _user_features(
        self, user_id: str, as_of_ms: int, degraded: list[str]
    ) -> dict[str, FeatureValue]:
        with _tracer.start_as_current_span("user_features"):
            try:
                resp = await self._features.get_features(user_id, [], as_of_ms, cap_s=USER_FEATURES_CAP_S)
            except RecmeshError as err:
                self._fallback(degraded, "user_features_unavailable", err)
                return {}
            return row_values(resp.user)

    async def _run_source(self, source: RecallSource, ctx: RecallContext, degraded: list[str]) -> Recalled:
        slo = current_slo_class()
        started = time.perf_counter()
        outcome = "ok"
        with _tracer.start_as_current_span(f"recall.{source.name}") as span:
            span.set_attribute("recmesh.source", source.name)
            try:
                async with asyncio.timeout(ctx.cap_s):
                    got = await source.fetch(ctx)
            except (TimeoutError, DeadlineExceeded) as err:
                outcome = "timeout"
                self._fallback(degraded, f"recall:{source.name}_timeout", err)
                got = Recalled([])
            except RecmeshError as err:
                outcome = "error"
                self._fallback(degraded, f"recall:{source.name}_unavailable", err)
                got = Recalled([])
            if got.stale:
                degraded.append(
                    "candidates_stale" if source.name == "popular" else f"recall:{source.name}_stale"
                )
            if outcome == "ok" and not got.items:
                outcome = "empty"
            span.set_attribute("recmesh.candidates", len(got.items))
            span.set_attribute("recmesh.outcome", outcome)
            if source.role == "semantic":
                span.set_attribute("recmesh.sigma", got.sigma)
            for k, v in got.attributes.items():
                span.set_attribute(f"recmesh.{k}", v)
        RECALL_LATENCY.labels(source.name, slo, outcome).observe(time.perf_counter() - started)
        RECALL_CANDIDATES.labels(source.name, slo).observe(len(got.items))
        return got

    async def recall(
        self, user_id: str, as_of_ms: int, context: Mapping[str, str], degraded: list[str]
    ) -> tuple[dict[str, Recalled], dict[str, FeatureValue]]:
        """Every source's answer (popularity concurrently with the user look-up
        the personal sources need), and the user's features."""
        if self._index is not None:
            self._index.refresh()
        cap = self._stage_cap(self._settings.recall_timeout_ms / 1000)
        limit = self._settings.recall_per_source
        independent = [s for s in self._sources if s.name == "popular"]
        personal = [s for s in self._sources if s.name != "popular"]
        bare = RecallContext(user_id, {}, context, max(limit, self._settings.candidates), cap)
        early = [asyncio.ensure_future(self._run_source(s, bare, degraded)) for s in independent]
        try:
            user = await self._user_features(user_id, as_of_ms, degraded)
            ctx = RecallContext(user_id, user, context, limit, self._stage_cap(cap))
            late = await asyncio.gather(*(self._run_source(s, ctx, degraded) for s in personal))
            first = await asyncio.gather(*early)
        finally:
            for task in early:
                task.cancel()
        got = dict(zip([s.name for s in independent + personal], [*first, *late], strict=True))
        return got, user

    async def rank(
        self,
        user_id: str,
        count: int,
        as_of_ms: int,
        context: Mapping[str, str] | None = None,
        skip_scoring: bool = False,
    ) -> Ranked:
        """`skip_scoring`: the caller presumes inference cold (scaled to zero) and
        this request may not wait for it: the recall order stands (`inference_cold`)."""
        degraded: list[str] = []
        as_of_ms = as_of_ms or int(time.time() * 1000)
        span = trace.get_current_span()
        recall_started = time.perf_counter()
        with _tracer.start_as_current_span("recall") as recall_span:
            got, user = await self.recall(user_id, as_of_ms, context or {}, degraded)
            sigma = max((r.sigma for r in got.values()), default=0.0)
            weights = role_weights(self._settings.fusion_weights, self._roles, sigma)
            fused = fuse({name: r.items for name, r in got.items()}, weights)
            seen = set(last_viewed(user))
            fused = drop_items(fused, seen)[: self._settings.candidates]
            SEMANTIC_SIGMA.observe(sigma)
            recall_span.set_attribute("recmesh.sigma", sigma)
            recall_span.set_attribute("recmesh.candidates", len(fused))
            counts = contributions(fused)
            for name, n in counts.items():
                recall_span.set_attribute(f"recmesh.candidates.{name}", n)
        if not fused:
            raise Unavailable("no candidates from any recall source")
        candidates = [(f.item_id, f.score) for f in fused]
        recall_ms = (time.perf_counter() - recall_started) * 1000
        slo = current_slo_class()
        budget_ms = (
            DEFAULT_CLASSES[slo].budget_ms if slo in DEFAULT_CLASSES else DEFAULT_CLASSES["C"].budget_ms
        )
        left = remaining_s()
        level = choose_level(None if left is None else left * 1000, budget_ms, recall_ms,
                             self.inference_suggested_level)  # fmt: skip
        span.set_attribute("recmesh.degradation_level", level)
        span.set_attribute("recmesh.sigma", sigma)
        if level:
            degraded.append(f"ladder:{LEVEL_NAMES[level]}")
            DEGRADATIONS.labels(str(level), slo).inc()
        if level == 3:
            return Ranked(candidates[:count], FALLBACK_MODEL, FEATURE_SET_VERSION, degraded, counts, sigma)
        pool = sample_candidates(candidates, level)
        rest = candidates[len(pool) :]
        ranked, model_version, feature_version, categories = await self._score(
            user_id, user, pool, as_of_ms, degraded, skip_scoring
        )
        ranked += [(i, 0.0) for i, _ in rest]
        items = cap_per_category(ranked, categories, self._settings.max_per_category, count)
        span.set_attribute("recmesh.candidates", len(candidates))
        span.set_attribute("recmesh.degraded", ",".join(degraded))
        return Ranked(items, model_version, feature_version, degraded, counts, sigma)

    async def _score(
        self,
        user_id: str,
        user: dict[str, FeatureValue],
        pool: list[tuple[str, float]],
        as_of_ms: int,
        degraded: list[str],
        skip_scoring: bool = False,
    ) -> tuple[list[tuple[str, float]], str, str, dict[str, str]]:
        """Features and scores of the pool: (ordered items, model, feature version, categories)."""
        item_rows: dict[str, dict[str, FeatureValue]] = {}
        feature_version = FEATURE_SET_VERSION
        ids = [c[0] for c in pool]
        with _tracer.start_as_current_span("features"):
            try:
                resp = await self._features.get_features(user_id, ids, as_of_ms, cap_s=FEATURES_CAP_S)
                user = row_values(resp.user) or user
                item_rows = table_rows(resp.items)
                feature_version = resp.feature_version
                degraded.extend(f"feature:{d}" for d in resp.degraded)
            except RecmeshError as err:
                self._fallback(degraded, "features_unavailable", err)
        categories = {i: str(r.get("category", "unknown")) for i, r in item_rows.items()}
        matrix = build_matrix(user, [(i, item_rows.get(i, {})) for i in ids])
        with _tracer.start_as_current_span("scoring"):
            try:
                if skip_scoring:
                    raise InferenceSkipped("the caller presumes inference cold")
                scored = await self._inference.score(
                    feature_version, list(COLUMNS), matrix.ravel().tolist(), cap_s=SCORING_CAP_S
                )
            except RecmeshError as err:
                reason = "inference_cold" if isinstance(err, InferenceSkipped) else "scoring_unavailable"
                self._fallback(degraded, reason, err)
                return list(pool), FALLBACK_MODEL, feature_version, categories
        self.inference_suggested_level = scored.suggested_level
        trace.get_current_span().set_attribute("recmesh.inference_suggested_level", scored.suggested_level)
        return top_n(ids, scored.scores, len(ids)), scored.model_version, feature_version, categories
