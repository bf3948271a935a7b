"""Sampled log of served feature vectors to Kafka, off the request path
(recmesh.topiclog: a bounded queue, a background producer, drops counted).

A look-up only decides whether it is sampled and, if so, puts a reference to
what it served on the queue; the background task builds the JSON record
(recmesh/features/served.py) and produces it.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
import structlog
from aiokafka import AIOKafkaProducer
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from prometheus_client import Counter

from recmesh.features.served import Applied, served_record
from recmesh.producer import make_producer
from recmesh.resilience import current_slo_class
from recmesh.settings import FeatureSettings
from recmesh.topiclog import Record, TopicLog
from services.feature.store import Lookup

_log = structlog.get_logger("recmesh.feature.served_log")

SERVED = Counter(
    "recmesh_served_features_total",
    "Served feature vectors offered to the served-feature log, by outcome.",
    ("outcome",),
)


@dataclass(frozen=True, slots=True)
class _Served:
    request_id: str
    trace_id: str
    served_at_ms: int
    as_of_ms: int
    user_id: str
    item_ids: Sequence[str]
    lookup: Lookup
    context: Context  # the look-up's trace context: the send's span is its child
    slo_class: str
    applied: Applied | None  # keys.applied read before and after the look-up


class ServedLog(TopicLog[_Served]):
    """The served-feature log (module docstring), on recmesh.topiclog.TopicLog."""

    def __init__(
        self,
        make_producer: Callable[[], AIOKafkaProducer],
        topic: str,
        rate: float,
        queue_max: int = 1000,
        rand: Callable[[], float] = random.random,
        *,
        feature_version: str,
    ) -> None:
        super().__init__(make_producer, topic, rate, self._record, SERVED, queue_max, rand)
        self.feature_version = feature_version

    def offer(
        self,
        *,
        request_id: str,
        trace_id: str,
        as_of_ms: int,
        user_id: str,
        item_ids: Sequence[str],
        lookup: Lookup,
        applied: Applied | None = None,
    ) -> None:
        """Queue a served look-up (call only when `sampled()`); never blocks."""
        self.put(_Served(
            request_id or uuid.uuid4().hex, trace_id, int(time.time() * 1000), as_of_ms, user_id, item_ids,
            lookup, otel_context.get_current(), current_slo_class(), applied,
        ))  # fmt: skip

    def _record(self, entry: _Served) -> Record:
        lk = entry.lookup
        record = served_record(
            feature_version=self.feature_version,
            request_id=entry.request_id,
            trace_id=entry.trace_id,
            served_at_ms=entry.served_at_ms,
            as_of_ms=entry.as_of_ms,
            user_id=entry.user_id,
            user=lk.user,
            item_ids=entry.item_ids,
            item_columns=lk.item_columns,
            degraded=lk.degraded,
            applied=entry.applied,
        )
        return Record(entry.user_id.encode(), orjson.dumps(record), entry.context, entry.slo_class)


def served_log_from(settings: FeatureSettings, feature_version: str) -> ServedLog | None:
    """The service's served-feature log, or None when RECMESH_SERVED_LOG_RATE is 0."""
    if settings.served_log_rate <= 0:
        return None
    return ServedLog(
        lambda: make_producer(settings.kafka_bootstrap, acks=1, linger_ms=50),
        settings.served_topic,
        settings.served_log_rate,
        settings.served_log_queue,
        feature_version=feature_version,
    )
