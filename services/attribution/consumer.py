"""The attribution consumer: impressions + behaviour events -> what each answer earned.

One consumer group reads both topics (`impressions`, `user_behavior`). Per
batch: the answers and the positive events are stored (services/attribution/
store.py, idempotent), the clock advances (the newest time read per partition:
an answer's as-of time, an event's event time), and only then are the batch's
offsets committed; a batch that fails to store is retried with backoff and
nothing is committed meanwhile. Malformed records are counted and skipped: the
ingest dead-letters malformed events (this is a second reader of their topic),
and impressions come from the gateway alone.

The clock is the oldest of the newest times read per partition (both
topics; one that brought nothing for `idle_ms` stops holding it back, and when
all are idle it runs on with the wall clock), and it does not move while a
partition of this consumer has records waiting and none read yet. An answer is
final once the clock has passed its as-of time + window + lateness: it is
then credited (recmesh/evaluation/outcome.py), its figures added once per
group (store.finalise) and to this process's Prometheus counters
(`recmesh_online_*`: the same sums, as rates per model version, degradation
level, SLO class and arm), and forgotten. Finalising runs every
FINALISE_EVERY_S (1 s), not per batch: answers wait minutes for their window
anyway, and per-batch passes cost more than the batches themselves (py-spy).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.errors import CommitFailedError, KafkaError
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from recmesh.consumer import consumer_lag, next_offsets
from recmesh.consumer import make_consumer as make_kafka_consumer
from recmesh.errors import InvalidArgument
from recmesh.evaluation import impression
from recmesh.evaluation.impression import Group, Shown
from recmesh.evaluation.outcome import Outcome, Positive, credited, outcome
from recmesh.evaluation.sums import increments
from recmesh.events import EventSchema, parse_event
from recmesh.features.repository import Evaluation
from recmesh.resilience import retry_until
from recmesh.settings import AttributionSettings
from recmesh.telemetry import kafka_consume_span
from services.attribution.store import AttributionStore, Due

_log = structlog.get_logger("recmesh.attribution")

FINALISE_EVERY_S = 1.0
START_ABANDON_S = 0.5  # how long a start-up given up waits for its half-started consumer to close
FINALISE_BATCH = 500

RECORDS = Counter(
    "recmesh_attribution_records_total", "Records read by attribution, by topic kind and outcome.",
    ("kind", "outcome"),
)  # fmt: skip
_RECORDS = {(k, o): RECORDS.labels(k, o) for k in ("impressions", "events") for o in ("read", "invalid")}
ANSWERS = Counter(
    "recmesh_attribution_answers_total",
    "Answers made final: added, already added (a redelivery), or expired before final.",
    ("outcome",),
)
PENDING = Gauge("recmesh_attribution_pending", "Answers stored and not yet final.")
CLOCK_BEHIND = Gauge(
    "recmesh_attribution_clock_behind_seconds", "Wall clock minus attribution's event-time clock."
)
STORE_RETRIES = Counter("recmesh_attribution_store_retries_total", "Batches retried because Redis failed.")
LAG = Gauge("recmesh_attribution_consumer_lag", "Records behind the high watermark.", ("topic", "partition"))

_ONLINE = ("model_version", "ladder", "slo_class", "arm")
ONLINE_ANSWERS = Counter("recmesh_online_answers_total", "Answers made final.", _ONLINE)
ONLINE_CREDITS = Counter("recmesh_online_credits_total", "Shown items credited within the first k.", _ONLINE)
ONLINE_HITS = Counter("recmesh_online_hits_total", "Answers with a credited item within k.", _ONLINE)
ONLINE_CTR = Counter("recmesh_online_ctr_sum", "Sum over answers of CTR@k.", _ONLINE)
ONLINE_NDCG = Counter("recmesh_online_ndcg_sum", "Sum over answers of NDCG@k.", _ONLINE)
ONLINE_AUC = Counter("recmesh_online_auc_sum", "Sum of per-answer AUC (grouped AUC).", _ONLINE)
ONLINE_AUC_ANSWERS = Counter(
    "recmesh_online_auc_answers_total", "Answers with an AUC (a credited and an uncredited item).", _ONLINE
)


class BoundedLabels:
    """Label values capped per dimension: past `limit` distinct values, "other"
    (model versions are a team's strings; Prometheus needs a bounded set)."""

    def __init__(self, limit: int = 16) -> None:
        self._limit = limit
        self._seen: dict[str, set[str]] = {d: set() for d in _ONLINE}

    def of(self, group: Group) -> tuple[str, ...]:
        out = []
        for dim, value in zip(
            _ONLINE, (group.model_version, group.ladder, group.slo_class, group.arm), strict=True
        ):
            seen = self._seen[dim]
            if value not in seen and len(seen) < self._limit:
                seen.add(value)
            out.append(value if value in seen else "other")
        return tuple(out)


def export(
    labels: tuple[str, ...], o: Outcome, shadow_labels: tuple[str, ...] | None, s: Outcome | None
) -> None:
    ONLINE_ANSWERS.labels(*labels).inc()
    ONLINE_CREDITS.labels(*labels).inc(len(o.positions))
    ONLINE_HITS.labels(*labels).inc(o.hit)
    ONLINE_CTR.labels(*labels).inc(o.ctr)
    ONLINE_NDCG.labels(*labels).inc(o.ndcg)
    for lab, out in ((labels, o), (shadow_labels, s)):
        if lab is not None and out is not None and out.auc is not None:
            ONLINE_AUC.labels(*lab).inc(out.auc)
            ONLINE_AUC_ANSWERS.labels(*lab).inc()
    if shadow_labels is not None:
        ONLINE_ANSWERS.labels(*shadow_labels).inc()


class Attributor:
    def __init__(
        self, settings: AttributionSettings, store: AttributionStore, consumer: AIOKafkaConsumer,
        schema: EventSchema,
    ) -> None:  # fmt: skip
        self._settings = settings
        self._store = store
        self._consumer = consumer
        self._schema = schema
        self._evaluation: Evaluation = store.evaluation
        self._marks: dict[str, int] = {}
        self._labels = BoundedLabels()
        self.finalised = 0  # answers this process added
        self.already = 0  # answers made final again and found already added (redeliveries)
        self.task: asyncio.Task[None] | None = None  # set by `running`

    async def run(self, stop: asyncio.Event) -> None:
        last_final = 0.0
        while not stop.is_set():
            batches = await self._consumer.getmany(timeout_ms=200, max_records=self._settings.max_batch)
            records = [r for recs in batches.values() for r in recs]
            if records:
                await self.apply(records)
            if time.monotonic() - last_final >= FINALISE_EVERY_S:
                await self._finalise_with_retry()
                last_final = time.monotonic()
                await self._export_lag()

    async def apply(self, records: list[ConsumerRecord]) -> None:
        """Store one batch, advance the clock, then commit its offsets."""
        with kafka_consume_span(records, self._consumer):
            shown, positives, marks = self._read(records)
            offsets = next_offsets(records)

            async def write() -> None:
                await self._store.write(shown, positives)
                await self._store.advance(marks)

            try:
                await write()
            except (RedisError, OSError) as err:
                _log.warning("store_unavailable_retrying", error=repr(err))
                STORE_RETRIES.inc()
                await retry_until(write, "redis (attribution)", retry_on=(RedisError, OSError))
            try:
                await self._consumer.commit(offsets)
            except CommitFailedError as err:  # a rebalance: the new owner re-reads, harmlessly
                _log.warning("commit_failed", error=repr(err))

    def _read(
        self, records: list[ConsumerRecord]
    ) -> tuple[list[Shown], dict[str, list[Positive]], dict[str, int]]:
        shown: list[Shown] = []
        positives: dict[str, list[Positive]] = {}
        positive = self._evaluation.positive
        for rec in records:
            kind = "impressions" if rec.topic == self._settings.impressions_topic else "events"
            try:
                if kind == "impressions":
                    s = impression.parse(rec.value or b"")
                    shown.append(s)
                    at = s.as_of_ms
                else:
                    ev = parse_event(rec.value or b"", self._schema)
                    at = ev.event_time
                    if ev.behavior in positive:
                        p = Positive(ev.item_id, ev.event_time, ev.event_id, ev.request_id)
                        positives.setdefault(ev.user_id, []).append(p)
            except InvalidArgument as err:
                _RECORDS[kind, "invalid"].inc()
                _log.debug("record_skipped", topic=rec.topic, offset=rec.offset, reason=str(err))
                continue
            _RECORDS[kind, "read"].inc()
            mark = f"{rec.topic}:{rec.partition}"
            self._marks[mark] = max(self._marks.get(mark, at), at)
        touched = {f"{r.topic}:{r.partition}" for r in records}
        return shown, positives, {m: t for m, t in self._marks.items() if m in touched}

    async def _finalise_with_retry(self) -> None:
        try:
            await self.finalise_due()
        except (RedisError, OSError) as err:  # the next pass tries again; nothing is lost
            _log.warning("finalise_failed", error=repr(err))

    async def _held_back(self) -> bool:
        """True while a partition of this consumer has records waiting and none read
        yet: its time is unknown, so nothing may be made final."""
        for tp in self._consumer.assignment():
            if f"{tp.topic}:{tp.partition}" in self._marks:
                continue
            high = self._consumer.highwater(tp)
            try:
                if high is None or await self._consumer.position(tp) < high:
                    return True
            except KafkaError:
                return True
        return False

    async def finalise_due(self) -> int:
        """Make final every answer the clock has passed; how many were added."""
        if await self._held_back():
            return 0
        clock = await self._store.clock(self._settings.idle_ms)
        if clock is None:
            return 0
        CLOCK_BEHIND.set(max(0.0, time.time() - clock / 1000))
        added = 0
        while True:
            due = await self._store.due(clock, FINALISE_BATCH)
            if not due:
                break
            added += await self._finalise(due)
            if len(due) < FINALISE_BATCH:
                break
        PENDING.set(await self._store.pending())
        return added

    async def _finalise(self, due: list[Due]) -> int:
        k, window = self._evaluation.k, self._evaluation.window_ms
        work: list[tuple[Due, list[tuple[str, float]], Outcome | None, Outcome | None]] = []
        for d in due:
            if d.shown is None:
                work.append((d, [], None, None))
                continue
            clicked = credited(d.shown, d.positives, d.others, window)
            served_outcome = outcome(d.shown, clicked, k)
            shadow_outcome = outcome(d.shown, clicked, k, d.shown.shadow.scores) if d.shown.shadow else None
            fields = increments(d.shown, served_outcome, shadow_outcome)
            work.append((d, fields, served_outcome, shadow_outcome))
        added = await self._store.finalise([(d, fields) for d, fields, _, _ in work])
        for (d, _, served, shadow), new in zip(work, added, strict=True):
            if d.shown is None:
                ANSWERS.labels("expired").inc()
            elif not new:
                ANSWERS.labels("already_added").inc()
                self.already += 1
            else:
                assert served is not None
                ANSWERS.labels("added").inc()
                sh = d.shown.shadow
                shadow_group = None if sh is None else Group(sh.model_version, d.shown.group.ladder,
                                                              d.shown.group.slo_class, "shadow")  # fmt: skip
                export(
                    self._labels.of(d.shown.group), served,
                    None if shadow_group is None else self._labels.of(shadow_group), shadow,
                )  # fmt: skip
        n = sum(added)
        self.finalised += n
        return n

    async def _export_lag(self) -> None:
        for tp, lag in (await consumer_lag(self._consumer)).items():
            LAG.labels(tp.topic, str(tp.partition)).set(lag)


def make_consumer(settings: AttributionSettings, **overrides: Any) -> AIOKafkaConsumer:
    topics = (settings.impressions_topic, settings.events_topic)
    return make_kafka_consumer(
        topics, settings.kafka_bootstrap, settings.consumer_group, settings.max_batch,
        settings.fetch_max_wait_ms, **overrides,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def running(
    settings: AttributionSettings, store: AttributionStore, schema: EventSchema, **overrides: Any
) -> AsyncIterator[Attributor]:
    """An Attributor consuming in the background (`.task`) until the block exits; on
    exit it finishes the batch in hand and closes its consumer."""
    consumer = make_consumer(settings, **overrides)
    try:
        await retry_until(consumer.start, "kafka consumer (attribution)", retry_on=(KafkaError, OSError))
    except BaseException:  # given up (a shutdown signal): close it, for a moment at most
        await asyncio.wait({asyncio.ensure_future(consumer.stop())}, timeout=START_ABANDON_S)
        raise
    _log.info(
        "consuming", topics=[settings.impressions_topic, settings.events_topic],
        group=settings.consumer_group,
        positive=sorted(store.evaluation.positive), window_ms=store.evaluation.window_ms,
    )  # fmt: skip
    if not store.evaluation.positive:
        _log.warning("no_positive_behaviour", detail="[evaluation] positive names none: answers are counted, "
                     "nothing is credited")  # fmt: skip
    stop = asyncio.Event()
    attributor = Attributor(settings, store, consumer, schema)
    attributor.task = asyncio.create_task(attributor.run(stop))
    try:
        yield attributor
    finally:
        stop.set()
        try:
            await asyncio.wait_for(attributor.task, 30)
        finally:
            await consumer.stop()
