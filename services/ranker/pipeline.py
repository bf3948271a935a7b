"""The ranking stages and what each falls back to.

- candidates: popular items from the feature service, cached for 5 s and served
  stale when the feature service is down (nothing to rank only if never fetched);
- features: one batch look-up as of the request's logical timestamp; on failure
  every feature takes its declared default (`features_unavailable`);
- scoring: the inference service; on failure the popularity order stands
  (`scoring_unavailable`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog
from opentelemetry import trace
from prometheus_client import Counter

from recmesh.cache import TtlCache
from recmesh.clients import FeatureClient, InferenceClient
from recmesh.errors import RecmeshError, Unavailable
from recmesh.features.definitions import FEATURE_SET_VERSION, FeatureValue
from recmesh.features.vectorize import COLUMNS, build_matrix
from recmesh.features.wire import row_values, table_rows
from recmesh.resilience import current_slo_class, remaining_s
from recmesh.slo import DEFAULT_CLASSES
from recmesh.telemetry import FALLBACKS
from services.ranker.policy import (
    LEVEL_NAMES,
    SKIP_FINE_RANKING,
    choose_level,
    drop_seen,
    sample_candidates,
    top_n,
)

_log = structlog.get_logger("recmesh.ranker")

DEGRADATIONS = Counter(
    "recmesh_ranker_degradations_total", "Requests ranked at a degradation level > 0.", ("level", "slo_class")
)
_tracer = trace.get_tracer("recmesh.ranker")

FALLBACK_MODEL = "popularity"
# Upper bounds per stage for requests that arrive without a deadline.
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


class RankPipeline:
    def __init__(self, features: FeatureClient, inference: InferenceClient, candidates: int) -> None:
        self._features = features
        self._inference = inference
        self._n_candidates = candidates
        # The inference service's latest degradation hint (for the ladder).
        self.inference_suggested_level = 0
        self._candidate_cache: TtlCache[list[tuple[str, float]]] = TtlCache(5.0, 4)

    async def _candidates(self, degraded: list[str]) -> list[tuple[str, float]]:
        fresh = self._candidate_cache.get_fresh("popular")
        if fresh is not None:
            return fresh
        try:
            popular = await self._features.popular(self._n_candidates, cap_s=0.2)
        except RecmeshError as err:
            stale = self._candidate_cache.get_stale("popular")
            if stale is None:
                raise Unavailable(f"no candidates: {err}") from err
            self._fallback(degraded, "candidates_stale", err)
            return stale
        self._candidate_cache.put("popular", popular)
        return popular

    def _fallback(self, degraded: list[str], reason: str, err: Exception) -> None:
        degraded.append(reason)
        FALLBACKS.labels("ranker", reason, current_slo_class()).inc()
        trace.get_current_span().add_event("fallback", {"reason": reason, "error": str(err)})
        _log.warning("fallback", reason=reason, error=str(err))

    async def rank(self, user_id: str, count: int, as_of_ms: int, skip_scoring: bool = False) -> Ranked:
        """`skip_scoring`: the caller presumes inference cold (scaled to zero) and
        this request may not wait for it: the popularity order stands (`inference_cold`)."""
        degraded: list[str] = []
        as_of_ms = as_of_ms or int(time.time() * 1000)
        recall_started = time.perf_counter()
        with _tracer.start_as_current_span("recall"):
            candidates = await self._candidates(degraded)
        recall_ms = (time.perf_counter() - recall_started) * 1000
        slo = current_slo_class()
        budget_ms = (
            DEFAULT_CLASSES[slo].budget_ms if slo in DEFAULT_CLASSES else DEFAULT_CLASSES["C"].budget_ms
        )
        left = remaining_s()
        level = choose_level(None if left is None else left * 1000, budget_ms, recall_ms,
                             self.inference_suggested_level)  # fmt: skip
        span = trace.get_current_span()
        span.set_attribute("recmesh.degradation_level", level)
        if level:
            degraded.append(f"ladder:{LEVEL_NAMES[level]}")
            DEGRADATIONS.labels(str(level), slo).inc()
        if level == SKIP_FINE_RANKING:
            return Ranked(candidates[:count], FALLBACK_MODEL, FEATURE_SET_VERSION, degraded)
        scored_pool = sample_candidates(candidates, level)

        user: dict[str, FeatureValue] = {}
        item_rows: dict[str, dict[str, FeatureValue]] = {}
        feature_version = FEATURE_SET_VERSION
        try:
            resp = await self._features.get_features(
                user_id, [c[0] for c in scored_pool], as_of_ms, cap_s=FEATURES_CAP_S
            )
            user = row_values(resp.user)
            item_rows = table_rows(resp.items)
            feature_version = resp.feature_version
            degraded.extend(f"feature:{d}" for d in resp.degraded)
        except RecmeshError as err:
            self._fallback(degraded, "features_unavailable", err)

        seen = user.get("last_viewed_3", [])
        seen_ids = seen if isinstance(seen, list) else []
        pool = drop_seen(scored_pool, seen_ids)
        rest = drop_seen(candidates[len(scored_pool) :], seen_ids)
        ids = [c[0] for c in pool]
        matrix = build_matrix(user, [(i, item_rows.get(i, {})) for i in ids])
        try:
            if skip_scoring:
                raise InferenceSkipped("the caller presumes inference cold")
            scored = await self._inference.score(
                feature_version, list(COLUMNS), matrix.ravel().tolist(), level=level, cap_s=SCORING_CAP_S
            )
            items = top_n(ids, scored.scores, count)
            items += [(i, 0.0) for i, _ in rest[: count - len(items)]]
            model_version = scored.model_version
            self.inference_suggested_level = scored.suggested_level
            trace.get_current_span().set_attribute(
                "recmesh.inference_suggested_level", scored.suggested_level
            )
            trace.get_current_span().set_attribute("recmesh.inference_served_level", scored.level)
        except RecmeshError as err:
            reason = "inference_cold" if isinstance(err, InferenceSkipped) else "scoring_unavailable"
            self._fallback(degraded, reason, err)
            items = (pool + rest)[:count]
            model_version = FALLBACK_MODEL
        span.set_attribute("recmesh.candidates", len(candidates))
        span.set_attribute("recmesh.degraded", ",".join(degraded))
        return Ranked(items, model_version, feature_version, degraded)
