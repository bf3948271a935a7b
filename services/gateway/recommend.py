"""The recommendation path shared by REST and gRPC.

A request arrives admitted by the edge (services/gateway/edge.py): in its
class, with its logical timestamp (as-of time) and the deadline every hop
inherits (the SLO class budget, or a tighter caller deadline). When the
ranker cannot answer in time, the popular items the gateway holds in memory
(refreshed from the feature service every few seconds) are served instead,
flagged `ranker_unavailable` (or `ranker_timeout` when the budget ran out
first): the fallback needs no network call, so it still fits in a budget the
ranker used up.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from opentelemetry import trace

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import UNSCORED_MODEL
from recmesh.clients.ranker import RankerClient
from recmesh.errors import DeadlineExceeded, InvalidArgument, RecmeshError, Unavailable
from recmesh.evaluation.impression import CONTROL, Shadow
from recmesh.telemetry import FALLBACKS, current_trace_id
from recmesh.v1 import ranker_pb2
from services.gateway.cold import ColdGuard
from services.gateway.edge import Admitted

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
    # The answer's id: in the response, on its impression, and on the events an app sends back.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    arm: str = CONTROL  # the experiment arm it was scored in
    shadow: Shadow | None = None  # a shadow experiment's candidate scores of `items`, never served


# Called with every answered recommendation (user, answer, as-of time): the impression log.
OnAnswer = Callable[[str, Recommendation, int], None]


class Recommender:
    def __init__(
        self,
        ranker: RankerClient,
        features: FeatureClient,
        max_count: int,
        cold: ColdGuard | None = None,
        feature_version: str = "",
        on_answer: OnAnswer | None = None,
    ) -> None:
        self._ranker = ranker
        self._features = features
        self._max_count = max_count
        # Named in a popularity fallback's answer (the repository's version).
        self._feature_version = feature_version
        self._cold = cold
        self._on_answer = on_answer
        self._popular: list[tuple[str, float]] = []
        self._popular_at: float | None = None  # monotonic time of the last list received

    async def refresh_popular(self) -> bool:
        try:
            popular = await self._features.popular(POPULAR_HELD, cap_s=1.0)
        except RecmeshError as err:
            _log.warning("popular_refresh_failed", error=str(err))
            return False
        if popular:  # an empty answer (no catalog yet) never replaces a list held
            self._popular, self._popular_at = popular, time.monotonic()
        return True

    def fallback_held(self) -> tuple[int, float | None]:
        """How many popular items the fallback holds, and their age in seconds (None: none yet)."""
        age = None if self._popular_at is None else time.monotonic() - self._popular_at
        return len(self._popular), age

    async def keep_popular_fresh(self, interval_s: float = 5.0) -> None:
        while True:
            await self.refresh_popular()
            await asyncio.sleep(interval_s)

    def check(self, user_id: str, count: int) -> None:
        """Refuse a request this path cannot serve, before it is admitted."""
        if not user_id:
            raise InvalidArgument("user_id is required")
        if not 0 < count <= self._max_count:
            raise InvalidArgument(f"count must be in 1..{self._max_count}")

    async def recommend(
        self, user_id: str, count: int, context: dict[str, str], admitted: Admitted
    ) -> Recommendation:
        """The recommendation of a request `check` passed, admitted by the edge:
        in its budget scope and admission slot (services/gateway/edge.py); every
        answer goes to `on_answer` (the impression log)."""
        rec = await self._recommend(user_id, count, context, admitted)
        if self._on_answer is not None:
            self._on_answer(user_id, rec, admitted.as_of_ms)
        return rec

    async def _recommend(
        self, user_id: str, count: int, context: dict[str, str], admitted: Admitted
    ) -> Recommendation:
        slo, notes, as_of_ms = admitted.slo, admitted.notes, admitted.as_of_ms
        span = trace.get_current_span()
        span.set_attribute("recmesh.as_of_ms", as_of_ms)
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
                arm=ranked.arm or CONTROL,
                shadow=Shadow(ranked.shadow_model_version, tuple(ranked.shadow_scores))
                if ranked.shadow_model_version
                else None,
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
