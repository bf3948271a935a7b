"""The ingest consumer: user_behavior events -> feature state in Redis.

At-least-once with exact effect: a batch is written to Redis (idempotently,
see writer.py) and only then are its offsets committed. The next batch is
fetched, parsed and prepared while one is written, but written only after it
and committed only after its commit. Malformed records go to the dead-letter
topic with their reason, and their offsets are committed only once the
dead-letter write is acknowledged. While Redis is down the consumer
pauses its partitions and retries; it commits nothing until the write succeeds.
Run as its own process (`python -m services.feature.ingest`) so it scales out
with the topic's partitions, separately from look-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from prometheus_client import Counter, Gauge, Histogram
from redis.exceptions import RedisError

from recmesh.consumer import FetchWait, consumer_lag, next_offsets
from recmesh.consumer import make_consumer as make_kafka_consumer
from recmesh.errors import InvalidArgument
from recmesh.events import Event, EventSchema, parse_event
from recmesh.producer import make_producer
from recmesh.resilience import retry_until
from recmesh.settings import IngestSettings
from recmesh.telemetry import LATENCY_BUCKETS, kafka_consume_span, observe_many
from services.feature.drift import StateSizer, observe_batch, observe_caught_up
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter, PreparedBatch, Source, WriteResult

_log = structlog.get_logger("recmesh.feature.ingest")

EVENTS = Counter("recmesh_ingest_events_total", "Records consumed, by outcome.", ("outcome",))
DLQ = Counter("recmesh_ingest_dlq_total", "Records sent to the dead-letter topic, by reason.", ("reason",))
FRESHNESS = Histogram(
    "recmesh_feature_freshness_seconds",
    "Event time -> feature visible in Redis.",
    buckets=(*LATENCY_BUCKETS, 10.0, 30.0, 60.0, 300.0),
)
STAGE = Histogram(
    "recmesh_ingest_stage_seconds",
    "Time spent between pipeline stages: produced -> consumed, consumed -> applied.",
    ("stage",),
    buckets=(*LATENCY_BUCKETS, 10.0, 30.0, 60.0),
)
LATE = Counter(
    "recmesh_ingest_late_events_total",
    "Events older than their partition's watermark minus the allowed lateness.",
    ("outcome",),
)
_APPLIED, _DEAD_LETTERED = EVENTS.labels("applied"), EVENTS.labels("dead_lettered")
_PRODUCED_TO_CONSUMED = STAGE.labels("produced_to_consumed")
_CONSUMED_TO_APPLIED = STAGE.labels("consumed_to_applied")
_LATE_APPLIED, _LATE_REFUSED = LATE.labels("applied"), LATE.labels("refused")
LAG = Gauge("recmesh_ingest_consumer_lag", "Records behind the high watermark.", ("partition",))
FETCH_WAIT = Gauge(
    "recmesh_ingest_fetch_wait_ms", "How long the consumer's fetches wait at the broker (longer while idle)."
)
STORE_RETRIES = Counter("recmesh_ingest_store_retries_total", "Batches retried because Redis failed.")
REDELIVERED = Counter(
    "recmesh_ingest_redelivered_events_total",
    "Events skipped because their partition offset was already applied (a batch delivered again).",
)
DUPLICATES = Counter(
    "recmesh_ingest_duplicate_events_total",
    "Events dropped because their event_id was already written for the user (redeliveries, reused ids).",
)

# An event this far ahead of the consumer's clock is rejected, not applied.
MAX_FUTURE_MS = 60 * 60 * 1000


class Watermarks:
    """Per-partition event-time watermarks and the lateness rule.

    The watermark of a partition is the newest event time seen on it. An event
    older than `watermark - allowed_lateness` is *late*. Because windows are
    computed at read time from events stored at their own event time, a late
    event is still applied exactly where it belongs (it changes the windows of
    as-of times after it) and is counted as `applied`. Only an event older than
    `watermark - STATE_RETENTION_MS` is refused (dead-lettered as `too_late`):
    state that old has been trimmed, so applying it could not be read back
    consistently. Watermarks live in memory; after a restart or rebalance they
    rebuild from the records read.
    """

    def __init__(self, allowed_lateness_ms: int, retention_ms: int) -> None:
        self.allowed_lateness_ms = allowed_lateness_ms
        self.retention_ms = retention_ms
        self._marks: dict[int, int] = {}

    def judge(self, partition: int, event_time_ms: int) -> str:
        """'on_time', 'late' (apply) or 'too_late' (refuse); advances the watermark."""
        mark = self._marks.get(partition, event_time_ms)
        mark = max(mark, event_time_ms)
        self._marks[partition] = mark
        if event_time_ms >= mark - self.allowed_lateness_ms:
            return "on_time"
        return "late" if event_time_ms >= mark - self.retention_ms else "too_late"


@dataclass(frozen=True)
class Rejected:
    record: ConsumerRecord
    reason: str
    detail: str


def classify(
    records: Sequence[ConsumerRecord], now_ms: int, marks: Watermarks, schema: EventSchema
) -> tuple[list[Event], list[Rejected], dict[int, int], list[tuple[int, int]]]:
    """Valid events sorted by event time, the rejected records with reasons, per
    partition the newest event time among the valid ones, and each valid event's
    (partition, offset) in the events' order."""
    good: list[tuple[Event, int, int]] = []
    bad: list[Rejected] = []
    newest: dict[int, int] = {}
    late = 0
    for rec in records:
        try:
            event = parse_event(rec.value or b"", schema)
        except InvalidArgument as err:
            reason = "not_json" if str(err).startswith("not JSON") else "invalid_event"
            bad.append(Rejected(rec, reason, str(err)))
            continue
        if event.event_time > now_ms + MAX_FUTURE_MS:
            bad.append(Rejected(rec, "event_time_in_future", f"event_time {event.event_time} > now + 1h"))
            continue
        verdict = marks.judge(rec.partition, event.event_time)
        if verdict == "too_late":
            _LATE_REFUSED.inc()
            bad.append(Rejected(rec, "too_late", "older than the partition watermark minus state retention"))
            continue
        if verdict == "late":
            late += 1
        good.append((event, rec.partition, rec.offset))
        newest[rec.partition] = max(newest.get(rec.partition, -1), event.event_time)
    _LATE_APPLIED.inc(late)
    good.sort(key=lambda g: g[0].event_time)
    return [g[0] for g in good], bad, newest, [(p, o) for _, p, o in good]


def _source(
    offsets: dict[TopicPartition, int], newest: dict[int, int], positions: list[tuple[int, int]]
) -> Source | None:
    """The batch's Source for the write (its topic's applied offsets), None when it spans
    several topics (the ingest reads one)."""
    topics = {tp.topic for tp in offsets}
    if len(topics) != 1:
        return None
    marks = {tp.partition: (offset, newest.get(tp.partition, -1)) for tp, offset in offsets.items()}
    return Source(topics.pop(), positions, marks)


@dataclass
class _Batch:
    """A batch in hand: `written` is set once its Redis write is done (or has failed)."""

    written: asyncio.Event
    task: asyncio.Task[None] = field(init=False)


class Ingestor:
    def __init__(
        self,
        settings: IngestSettings,
        store: FeatureStore,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        on_applied: Callable[[list[Event], float], None] | None = None,
        writer: EventWriter | None = None,
    ) -> None:
        self._on_applied = on_applied
        self._settings = settings
        self._store = store
        feature_set = store.feature_set
        self._schema = feature_set.event_schema
        self._writer = writer or EventWriter(store.client, feature_set, store.offline.attributes)
        self._consumer = consumer
        self._fetch_wait = FetchWait(consumer, settings.fetch_max_wait_ms, settings.idle_fetch_max_wait_ms)
        self._producer = producer
        self._marks = Watermarks(settings.allowed_lateness_ms, feature_set.retention_ms)
        self.applied = 0
        self.duplicates = 0
        self.sizer: StateSizer | None = None  # set by `running` when the drift sampler is on

    @property
    def consumer(self) -> AIOKafkaConsumer:
        return self._consumer

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop`, then finish the batches in hand.

        Batch N+1 is fetched, parsed and prepared while batch N's write runs in
        Redis, so this process works on one core while Redis works on the other.
        Writes and commits still happen in batch order: a batch writes once the
        previous one is written and commits once the previous one is committed;
        at most two batches are in hand.
        """
        in_hand: list[_Batch] = []
        try:
            while not stop.is_set():
                batches = await self._consumer.getmany(timeout_ms=200, max_records=self._settings.max_batch)
                records = [r for recs in batches.values() for r in recs]
                FETCH_WAIT.set(self._fetch_wait.observe(bool(records)))
                if records:
                    previous = in_hand[-1] if in_hand else None
                    batch = _Batch(asyncio.Event())
                    batch.task = asyncio.create_task(self._process(records, previous, batch.written))
                    in_hand.append(batch)
                    if previous is not None:
                        await previous.task
                        in_hand.remove(previous)
                else:
                    while in_hand:
                        await in_hand[0].task
                        in_hand.pop(0)
                    observe_caught_up()
                await self._export_lag()
            while in_hand:
                await in_hand[0].task
                in_hand.pop(0)
        finally:
            for batch in in_hand:  # only after a failure: nothing else is left pending
                batch.task.cancel()
            await asyncio.gather(*(b.task for b in in_hand), return_exceptions=True)

    async def _process(
        self,
        records: list[ConsumerRecord],
        previous: _Batch | None,
        written: asyncio.Event,
    ) -> None:
        with kafka_consume_span(records, self._consumer):
            consumed_at = time.time()
            observe_many(_PRODUCED_TO_CONSUMED, [max(0.0, consumed_at - r.timestamp / 1000) for r in records])
            good, bad, newest, positions = classify(
                records, int(consumed_at * 1000), self._marks, self._schema
            )
            offsets = next_offsets(records)
            source = _source(offsets, newest, positions)
            plan: PreparedBatch | RedisError | OSError | None = None
            try:
                plan = await self._writer.prepare(good, source) if good else None
            except (RedisError, OSError) as err:
                plan = err  # prepared again once Redis is back
            if bad:
                await self._dead_letter(bad)
            try:
                if previous is not None:
                    await previous.written.wait()  # co-visits read what earlier batches wrote
                if good:
                    result = await self._write_with_retry(good, source, plan)
                    if result.duplicates:
                        DUPLICATES.inc(result.duplicates)
                        self.duplicates += result.duplicates
                    REDELIVERED.inc(result.redelivered)
            finally:
                written.set()
            if good:
                applied_at = time.time()
                observe_batch(good[-1].event_time, applied_at)  # `good` is sorted by event time
                _CONSUMED_TO_APPLIED.observe(applied_at - consumed_at)
                observe_many(FRESHNESS, [max(0.0, applied_at - ev.event_time / 1000) for ev in good])
                if self._on_applied is not None:
                    self._on_applied(good, applied_at)
            _APPLIED.inc(len(good))
            _DEAD_LETTERED.inc(len(bad))
            self.applied += len(good)
            if previous is not None:
                await previous.task  # its commit first (if it failed, this raises: no commit)
            if not (good and self._writer.marks_in_write):  # else the write recorded them
                await self._mark_applied(offsets, newest)
            try:
                await self._consumer.commit(offsets)
            except CommitFailedError as err:
                # Partitions moved during a rebalance; their new owner re-reads them
                # and the idempotent apply makes that harmless.
                _log.warning("commit_failed", error=repr(err))

    async def _mark_applied(self, offsets: dict[TopicPartition, int], newest: dict[int, int]) -> None:
        """How far the store holds each partition (keys.applied), for `features compare`;
        a failure is logged and leaves the commit alone (the mark is advice, not state)."""
        by_topic: dict[str, dict[int, tuple[int, int]]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = (offset, newest.get(tp.partition, -1))
        try:
            for topic, marks in by_topic.items():
                await self._writer.mark_applied(topic, marks)
        except (RedisError, OSError) as err:
            _log.warning("applied_mark_failed", error=repr(err))

    async def _write_with_retry(
        self,
        events: list[Event],
        source: Source | None,
        prepared: PreparedBatch | RedisError | OSError | None,
    ) -> WriteResult:
        """Write the batch (`prepared`: its plan, or why preparing it failed); while
        Redis fails, pause the partitions and retry with backoff."""
        plan = prepared if isinstance(prepared, PreparedBatch) else None
        if plan is not None:
            try:
                return await self._writer.write(plan)
            except (RedisError, OSError) as err:
                prepared = err
        _log.warning("store_unavailable_pausing", error=repr(prepared))
        self._consumer.pause(*self._consumer.assignment())

        result: WriteResult | None = None

        async def attempt() -> None:
            nonlocal plan, result
            STORE_RETRIES.inc()
            # A poll on paused partitions fetches nothing but keeps group membership
            # (partitions assigned meanwhile are paused first: what the poll returns is dropped).
            self._consumer.pause(*self._consumer.assignment())
            await self._consumer.getmany(timeout_ms=0)
            if plan is None:
                plan = await self._writer.prepare(events, source)
            result = await self._writer.write(plan)

        try:
            await retry_until(attempt, "redis write", retry_on=(RedisError, OSError))
        finally:
            self._consumer.resume(*self._consumer.assignment())
        _log.info("store_back_resumed", events=len(events))
        assert result is not None
        return result

    async def _dead_letter(self, rejected: list[Rejected]) -> None:
        futures = []
        for r in rejected:
            headers: list[tuple[str, bytes]] = [
                ("reason", r.reason.encode()),
                ("detail", r.detail[:500].encode()),
                ("source", f"{r.record.topic}/{r.record.partition}/{r.record.offset}".encode()),
            ]
            futures.append(
                await self._producer.send(
                    self._settings.dlq_topic,
                    value=r.record.value,
                    key=r.record.key,
                    headers=headers,
                )
            )
            DLQ.labels(r.reason).inc()
        await asyncio.gather(*futures)
        _log.info("dead_lettered", count=len(rejected), reasons=sorted({r.reason for r in rejected}))

    async def _export_lag(self) -> None:
        for tp, lag in (await consumer_lag(self._consumer)).items():
            LAG.labels(str(tp.partition)).set(lag)


# How long a start-up given up waits for its half-started Kafka clients to close.
START_ABANDON_S = 0.5


def make_consumer(settings: IngestSettings, **overrides: Any) -> AIOKafkaConsumer:
    return make_kafka_consumer(
        (settings.events_topic,), settings.kafka_bootstrap, settings.consumer_group, settings.max_batch,
        settings.fetch_max_wait_ms, **overrides,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def running(
    settings: IngestSettings,
    store: FeatureStore,
    on_applied: Callable[[list[Event], float], None] | None = None,
    writer: EventWriter | None = None,
    **consumer_overrides: Any,
) -> AsyncIterator[Ingestor]:
    """An Ingestor consuming in the background until the block exits, with the
    state-drift sampler beside it; on exit it finishes the batches in hand
    (up to two: one being written, the next prepared), commits them, and
    closes its Kafka clients."""
    consumer = make_consumer(settings, **consumer_overrides)
    producer = make_producer(settings.kafka_bootstrap)
    try:
        await retry_until(producer.start, "kafka producer", retry_on=(KafkaError, OSError))
        await retry_until(consumer.start, "kafka consumer", retry_on=(KafkaError, OSError))
    except BaseException:  # start-up given up (a shutdown signal) or failed: close what started,
        # for at most a moment (a consumer in the middle of joining its group would wait for the join)
        closing = asyncio.ensure_future(
            asyncio.gather(consumer.stop(), producer.stop(), return_exceptions=True)
        )
        await asyncio.wait({closing}, timeout=START_ABANDON_S)
        raise
    _log.info("consuming", topic=settings.events_topic, group=settings.consumer_group)
    stop = asyncio.Event()
    ingestor = Ingestor(settings, store, consumer, producer, on_applied=on_applied, writer=writer)
    tasks = [asyncio.create_task(ingestor.run(stop))]
    if settings.state_sample_s > 0:
        sizer = StateSizer(store.client, store.feature_set, settings.state_scan_keys_per_s)
        ingestor.sizer = sizer
        tasks.append(asyncio.create_task(sizer.run(stop, settings.state_sample_s)))
    try:
        yield ingestor
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await consumer.stop()
        await producer.stop()


async def main(settings: IngestSettings) -> None:
    from recmesh.features.repository import served_feature_set
    from recmesh.redis_client import connect
    from recmesh.service import until_stopped

    feature_set = served_feature_set(settings.repository, "feature-ingest")
    client = connect(settings.redis_url, settings.redis_max_connections)
    store = FeatureStore(client, feature_set)

    async def consume(stop: asyncio.Event, started: asyncio.Event) -> int:
        await retry_until(store.ping, "redis", retry_on=(RedisError, OSError))
        async with running(settings, store) as ingestor:
            started.set()
            await stop.wait()
        return ingestor.applied

    applied = await until_stopped(consume)
    if applied is not None:
        _log.info("stopped", applied=applied)
    await client.aclose()


if __name__ == "__main__":
    from prometheus_client import start_http_server

    from recmesh.telemetry import setup_logging, setup_tracing

    cfg = IngestSettings()
    setup_logging("feature-ingest", cfg.log_level, cfg.log_format)
    setup_tracing("feature-ingest", flush_s=cfg.telemetry_flush_s)
    start_http_server(cfg.metrics_port, addr=cfg.bind_host)
    asyncio.run(main(cfg))
