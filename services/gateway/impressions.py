"""The impression log: what every answered recommendation showed, to the `impressions` topic.

Online evaluation starts here: a click can only be credited to a model, a
degradation level or an SLO class if what was shown, by which, is on record.
Each answered recommendation (REST and gRPC, the popular fallback included) is
one record, keyed by user, in the form recmesh/evaluation/impression.py
defines (`record`). The app gets the request id in the answer
(`request_id`, and the `x-request-id` header / metadata) and may send it back
on the events that follow (`POST /v1/events`, `request_id`), which lets
attribution join exactly; without it, by user, item and time.

Logging never slows or fails a request (recmesh.topiclog: a bounded queue,
`RECMESH_IMPRESSION_LOG_QUEUE`, drops counted in
`recmesh_impressions_total{outcome}`). The rate defaults to 1
(`RECMESH_IMPRESSION_LOG_RATE`): a sampled log would drop the clicks that
follow unlogged answers, and the cost is an in-memory reference per request,
encoded and sent off the request path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaProducer
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from prometheus_client import Counter

from recmesh.evaluation import impression
from recmesh.producer import make_producer
from recmesh.settings import GatewaySettings
from recmesh.topiclog import Record, TopicLog
from services.gateway.recommend import Recommendation

IMPRESSIONS = Counter(
    "recmesh_impressions_total", "Answered recommendations offered to the impression log, by outcome.",
    ("outcome",),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Impression:
    user_id: str
    rec: Recommendation
    as_of_ms: int
    served_at_ms: int
    context: Context  # the request's trace context: the send's span joins it


def impression_record(imp: Impression) -> dict[str, object]:
    rec = imp.rec
    return impression.record(
        request_id=rec.request_id, user_id=imp.user_id, items=rec.items, model_version=rec.model_version,
        feature_version=rec.feature_version, degraded=rec.degraded, slo_class=rec.slo_class,
        arm=rec.arm, as_of_ms=imp.as_of_ms, served_at_ms=imp.served_at_ms, trace_id=rec.trace_id,
        shadow=rec.shadow,
    )  # fmt: skip


class ImpressionLog(TopicLog[Impression]):
    def __init__(
        self,
        make_producer: Callable[[], AIOKafkaProducer],
        topic: str,
        rate: float,
        queue_max: int = 10_000,
        linger_s: float = 0.0,
    ) -> None:
        super().__init__(make_producer, topic, rate, self._record, IMPRESSIONS, queue_max, linger_s=linger_s)

    def offer(self, user_id: str, rec: Recommendation, as_of_ms: int) -> None:
        """Log an answered recommendation, if sampled; never blocks."""
        if self.sampled():
            self.put(Impression(user_id, rec, as_of_ms, int(time.time() * 1000), otel_context.get_current()))

    @staticmethod
    def _record(imp: Impression) -> Record:
        return Record(
            imp.user_id.encode(), orjson.dumps(impression_record(imp)), imp.context, imp.rec.slo_class
        )


def impression_log_from(settings: GatewaySettings) -> ImpressionLog | None:
    """The gateway's impression log, or None when RECMESH_IMPRESSION_LOG_RATE is 0."""
    if settings.impression_log_rate <= 0:
        return None
    return ImpressionLog(
        lambda: make_producer(settings.kafka_bootstrap, acks=1, linger_ms=20),
        settings.impressions_topic,
        settings.impression_log_rate,
        settings.impression_log_queue,
        settings.impression_log_linger_ms / 1000,
    )
