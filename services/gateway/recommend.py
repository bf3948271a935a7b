"""The recommendation path shared by REST and gRPC.

The gateway stamps the request's logical timestamp (as-of time) and turns the
SLO class budget, or a tighter caller deadline, into the deadline every hop
inherits. When the ranker cannot answer in time, the popular items the gateway
holds in memory (refreshed from the feature service every few seconds) are
served instead, flagged `ranker_unavailable` (or `ranker_timeout` when the
budget ran out first): the fallback needs no network call, so it still fits
in a budget the ranker used up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog
from opentelemetry import trace

from recmesh.admission import AdmissionGate
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import UNSCORED_MODEL
from recmesh.clients.ranker import RankerClient
from recmesh.errors import DeadlineExceeded, InvalidArgument, RecmeshError, Unauthenticated, Unavailable
from recmesh.metadata import API_KEY_HEADER, SLO_HEADER, TIER_HEADER, TOKEN_BUDGET_HEADER
from recmesh.resilience import remaining_s, request_scope
from recmesh.settings import GatewaySettings
from recmesh.slo import (
    DEFAULT_CLASSES,
    ClassDecision,
    Entitlement,
    SloClass,
    decide_class,
    parse_token_budget,
    with_budgets,
)
from recmesh.telemetry import FALLBACKS, current_trace_id
from recmesh.v1 import ranker_pb2
from services.gateway.cold import ColdGuard

_log = structlog.get_logger("recmesh.gateway")

POPULAR_HELD = 500


@dataclass
class Recommendation:
    items: list[tuple[str, float]]
    slo_class: str
    trace_id: str
    model_version: str
    feature_version: str
    degraded: list[str] = field(default_factory=list)


class ClassPolicy:
    """Turns a request's headers (or gRPC metadata) into its SLO class decision."""

    def __init__(
        self,
        default_class: str,
        api_keys: Mapping[str, Entitlement],
        anonymous: Entitlement,
        classes: dict[str, SloClass] = DEFAULT_CLASSES,
    ) -> None:
        self._default = default_class
        self._keys = dict(api_keys)
        self._anonymous = anonymous
        self._classes = classes

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ClassPolicy:
        keys = {
            k: Entitlement(v.tenant, v.max_class, v.trusted_context) for k, v in settings.api_keys.items()
        }
        anonymous = Entitlement("anonymous", settings.anonymous_max_class)
        return cls(settings.default_slo_class, keys, anonymous, with_budgets(settings.slo_budgets_ms))

    def entitlement(self, headers: Mapping[str, str]) -> Entitlement:
        key = headers.get(API_KEY_HEADER)
        if not key:
            return self._anonymous
        entitlement = self._keys.get(key)
        if entitlement is None:
            raise Unauthenticated(f"unknown {API_KEY_HEADER}")
        return entitlement

    def decide(self, headers: Mapping[str, str]) -> ClassDecision:
        entitlement = self.entitlement(headers)
        return decide_class(
            headers.get(SLO_HEADER),
            entitlement,
            self._default,
            user_tier=headers.get(TIER_HEADER),
            token_budget=parse_token_budget(headers.get(TOKEN_BUDGET_HEADER)),
            classes=self._classes,
        )


class Recommender:
    def __init__(
        self,
        ranker: RankerClient,
        features: FeatureClient,
        max_count: int,
        gate: AdmissionGate | None = None,
        cold: ColdGuard | None = None,
        feature_version: str = "",
    ) -> None:
        self._ranker = ranker
        self._features = features
        self._max_count = max_count
        # Named in a popularity fallback's answer (the repository's version).
        self._feature_version = feature_version
        self.gate = gate  # per-class admission; None admits everything
        self._cold = cold
        self._popular: list[tuple[str, float]] = []

    async def refresh_popular(self) -> bool:
        try:
            self._popular = await self._features.popular(POPULAR_HELD, cap_s=1.0)
        except RecmeshError as err:
            _log.warning("popular_refresh_failed", error=str(err))
            return False
        return True

    async def keep_popular_fresh(self, interval_s: float = 5.0) -> None:
        while True:
            await self.refresh_popular()
            await asyncio.sleep(interval_s)

    async def recommend(
        self, user_id: str, count: int, context: dict[str, str], decision: ClassDecision
    ) -> Recommendation:
        if not user_id:
            raise InvalidArgument("user_id is required")
        if not 0 < count <= self._max_count:
            raise InvalidArgument(f"count must be in 1..{self._max_count}")
        slo = decision.slo
        notes = decision.notes
        as_of_ms = int(time.time() * 1000)
        budget_s = slo.budget_ms / 1000
        caller_left = remaining_s()
        if caller_left is not None:
            budget_s = min(budget_s, caller_left)
        span = trace.get_current_span()
        span.set_attribute("recmesh.slo_class", slo.name)
        if decision.downgraded_from:
            span.set_attribute("recmesh.slo_class_requested", decision.downgraded_from)
        span.set_attribute("recmesh.as_of_ms", as_of_ms)
        # The budget starts before admission: time spent queued is time spent.
        with request_scope(slo.name, budget_s):
            if self.gate is None:
                return await self._rank(user_id, count, context, as_of_ms, decision, notes)
            async with self.gate.slot(slo.name, budget_s):
                return await self._rank(user_id, count, context, as_of_ms, decision, notes)

    async def _rank(
        self,
        user_id: str,
        count: int,
        context: dict[str, str],
        as_of_ms: int,
        decision: ClassDecision,
        notes: list[str],
    ) -> Recommendation:
        slo = decision.slo
        span = trace.get_current_span()
        skip: frozenset[str] = frozenset()
        if self._cold is not None:
            cold = await self._cold.prepare(slo.name)
            skip, notes = cold.skip, [*notes, *cold.notes]
            if "ranker" in skip:
                return self._popular_fallback(count, slo.name, notes)
        try:
            ranked = await self._ranker.rank(user_id, count, context, as_of_ms, skip=skip)
            self._observe(ranked, skip)
            return Recommendation(
                [(i.item_id, i.score) for i in ranked.items],
                slo.name,
                current_trace_id(),
                ranked.model_version,
                ranked.feature_version,
                list(dict.fromkeys([*notes, *ranked.degraded])),
            )
        except RecmeshError as err:
            if isinstance(err, InvalidArgument):
                raise
            # Out of time (the request's budget, maybe a caller's tight deadline)
            # says nothing about whether the ranker is up; failing to reach it does.
            timed_out = isinstance(err, DeadlineExceeded)
            if self._cold is not None and not timed_out:
                self._cold.observed("ranker", False)
            if not self._popular:
                raise Unavailable(f"ranker failed and no fallback is held yet: {err}") from err
            reason = "ranker_timeout" if timed_out else "ranker_unavailable"
            FALLBACKS.labels("gateway", reason, slo.name).inc()
            span.add_event("fallback", {"reason": reason, "error": str(err)})
            span.set_attribute("recmesh.fallback_reason", reason)
            _log.warning("fallback", reason=reason, error=str(err))
            return self._popular_fallback(count, slo.name, [*notes, reason])

    def _popular_fallback(self, count: int, slo_class: str, degraded: list[str]) -> Recommendation:
        if not self._popular:
            raise Unavailable("ranker not called and no fallback is held yet")
        return Recommendation(
            self._popular[:count],
            slo_class,
            current_trace_id(),
            "popularity",
            self._feature_version,
            degraded,
        )

    def _observe(self, ranked: ranker_pb2.RankResponse, skipped: frozenset[str]) -> None:
        """What the ranker's answer shows about the may-be-cold dependencies."""
        if self._cold is None:
            return
        self._cold.observed("ranker", True)
        if "inference" in skipped:
            return
        if "scoring_unavailable" in ranked.degraded:
            self._cold.observed("inference", False)
        elif ranked.model_version != UNSCORED_MODEL:
            self._cold.observed("inference", True)  # a model scored it: inference is up
        # (else the ladder skipped scoring: nothing learnt about inference)
