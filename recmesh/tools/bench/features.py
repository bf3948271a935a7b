"""`recmesh bench features`: ingest throughput, look-up latency and freshness.

All figures come from one run on this machine, against real processes:
- ingest: N events pre-produced to the broker, then consumed by one in-process
  Ingestor (the same code as `python -m services.feature.ingest`); nothing
  lost is checked by counting the state in Redis afterwards;
- look-up: GetFeatures for 1 user + 200 items over gRPC against the feature
  service running as its own process; the baseline is the same look-up's raw
  Redis round trip (the identical pipeline, undecoded), so the service's
  overhead reads as a ratio;
- freshness: event time -> written to Redis, while events stream at a steady rate;
- memory: MEMORY USAGE of the state of active users and items.

`--redis-persistence compare` runs each round three times, the embedded Redis
without persistence, with snapshots (rdb, `recmesh up`'s default) and with an
append-only file (aof, fsync every second), in RECMESH_STATE_DIR and in rotating
order, and prints what each costs as the median and range over the rounds of
each figure's ratio to none (rdb / off, aof / off).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from recmesh.clients.base import ResiliencePolicy
from recmesh.clients.feature import FeatureClient
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.repository import DEMO_REPOSITORY, FeatureSet, load_feature_set
from recmesh.producer import make_producer
from recmesh.redis_client import AnyRedis, connect
from recmesh.settings import IngestSettings
from recmesh.stats import percentile
from recmesh.tools.bench.common import Infra, emit, free_port, infrastructure, plaintext_unless_set
from recmesh.tools.bench.repeat import Spread, round_order, spread, spreads
from recmesh.tools.demo.generate import make_catalog, offline_rows
from services.feature.catalog import load_catalog
from services.feature.ingest import running
from services.feature.store import FeatureStore

# The look-up figures measure the service, not the client's hedging: with no
# retry budget beyond the initial two tokens, no request is sent twice.
NO_HEDGING = ResiliencePolicy(retry_ratio=0.0)
TOPIC, DLQ, SERVED = "bench.user_behavior", "bench.user_behavior.dlq", "bench.served_features"
BLOCK = 50  # look-ups per block when alternating between the two feature services


def _synthetic(n: int, rng: random.Random, now_ms: int, spread_ms: int) -> list[dict[str, Any]]:
    return [
        {"event_id": f"b{now_ms}-{i}", "user_id": f"u{rng.randrange(2000)}",
         "item_id": f"i{rng.randrange(3000)}",
         "behavior": "click" if rng.random() < 0.2 else "view",
         "event_time": now_ms - rng.randrange(spread_ms)}
        for i in range(n)
    ]  # fmt: skip


async def _produce(bootstrap: str, events: list[dict[str, Any]]) -> float:
    producer = make_producer(bootstrap, max_batch_size=262_144)
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [
            await producer.send(TOPIC, key=e["user_id"].encode(), value=orjson.dumps(e)) for e in events
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(events) / (time.perf_counter() - started)


class _Ingest:
    def __init__(self, infra: Infra, store: FeatureStore) -> None:
        self.settings = IngestSettings(kafka_bootstrap=infra.kafka_bootstrap, redis_url=infra.redis_url,
                                       events_topic=TOPIC, dlq_topic=DLQ, consumer_group="bench")  # fmt: skip
        self.store = store
        self.applied = 0
        self.first: float | None = None
        self.first_batch = 0
        self.last = 0.0
        self.freshness: list[float] | None = None

    def on_applied(self, events: list[Event], applied_at: float) -> None:
        if self.first is None:
            self.first, self.first_batch = time.perf_counter(), len(events)
        self.last = time.perf_counter()
        self.applied += len(events)
        if self.freshness is not None:
            self.freshness.extend(applied_at - e.event_time / 1000 for e in events)

    async def wait_for(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.applied < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.applied}/{n} events applied")
            await asyncio.sleep(0.01)


async def _memory(
    store_client: Any, feature_set: FeatureSet, users: list[str], items: list[str]
) -> dict[str, float]:
    """Bytes (MEMORY USAGE) of every key an active user or item holds, and the
    events its streams hold."""

    async def usage(keys_: list[str]) -> int:
        total = 0
        for k in keys_:
            total += int(await store_client.memory_usage(k) or 0)
        return total

    async def events_in(streams: list[str]) -> int:
        return sum([int(await store_client.zcard(k)) for k in streams])

    def streams(entity: str, entity_id: str) -> list[str]:
        return [keys.stream(entity, entity_id, s.id) for s in feature_set.streams_of(entity)]  # type: ignore[arg-type]

    user_bytes = [await usage([*streams("user", u), keys.user_ids(u), keys.user_profile(u)]) for u in users]
    user_events = [await events_in(streams("user", u)) for u in users]
    item_bytes = [
        await usage([*streams("item", i), keys.newest("item", i), keys.item_static(i)]) for i in items
    ]
    item_events = [await events_in(streams("item", i)) for i in items]
    return {
        "bytes_per_user": round(sum(user_bytes) / len(users)),
        "events_per_user": round(sum(user_events) / len(users), 1),
        "bytes_per_item": round(sum(item_bytes) / len(items)),
        "events_per_item": round(sum(item_events) / len(items), 1),
    }


@dataclass
class _Ingested:
    """What the ingest phase measured: rates (events/s), events lost, memory and freshness (s)."""

    produce_rate: float
    ingest_rate: float
    lost: int
    memory: dict[str, float]
    fresh: list[float]


@dataclass
class _LookedUp:
    """What the look-up phase measured: latencies (s) of the service, of the raw Redis round
    trip and of the service that logs served features; look-ups that fell back, the service's
    throughput (req/s) and the served-log records written."""

    svc_lat: list[float] = field(default_factory=list)
    raw_lat: list[float] = field(default_factory=list)
    logged_lat: list[float] = field(default_factory=list)
    degraded: int = 0
    throughput: float = 0.0
    served_records: int = 0


async def run(
    events: int, lookups: int, n_items: int, concurrency: int, rate: int, seconds: float, served_rate: float,
    persistence: str = "off",
) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(7)
    async with infrastructure({TOPIC: 3, DLQ: 1, SERVED: 1}, redis_persistence=persistence) as infra:
        client, feature_set, store = await _prepare(infra)
        ingested = await _ingest_phase(infra, client, feature_set, store, rng, events, rate, seconds)
        looked_up = await _lookup_phase(infra, store, rng, lookups, n_items, concurrency, served_rate)
        await client.aclose()
    return _figures(events, n_items, concurrency, rate, served_rate, ingested, looked_up)


async def _prepare(infra: Infra) -> tuple[AnyRedis, FeatureSet, FeatureStore]:
    """The Redis client, the demo repository and its store, with the demo catalog loaded."""
    client = connect(infra.redis_url, 32)
    feature_set = load_feature_set(DEMO_REPOSITORY)
    store = FeatureStore(client, feature_set)
    await store.prepare()
    users, items = offline_rows(make_catalog())
    await load_catalog(client, feature_set, users, items)
    return client, feature_set, store


async def _ingest_phase(
    infra: Infra,
    client: AnyRedis,
    feature_set: FeatureSet,
    store: FeatureStore,
    rng: random.Random,
    events: int,
    rate: int,
    seconds: float,
) -> _Ingested:
    # 1. ingest throughput, nothing lost
    now = int(time.time() * 1000)
    batch = _synthetic(events, rng, now, 9 * 60_000)
    produce_rate = await _produce(infra.kafka_bootstrap, batch)
    ingest = _Ingest(infra, store)
    async with running(ingest.settings, store, on_applied=ingest.on_applied):
        await ingest.wait_for(events, 300)
        assert ingest.first is not None
        ingest_rate = (events - ingest.first_batch) / max(1e-9, ingest.last - ingest.first)
        lost = events - await _stored(client)
        memory = await _memory(
            client, feature_set, [f"u{i}" for i in range(0, 2000, 40)], [f"i{i}" for i in range(0, 3000, 60)]
        )
        fresh = await _freshness(infra, ingest, rng, rate, seconds)
    return _Ingested(produce_rate, ingest_rate, lost, memory, fresh)


async def _stored(client: AnyRedis) -> int:
    # Every event written is in its user's event-id set exactly once.
    pipe = client.pipeline(transaction=False)
    for u in range(2000):
        pipe.zcard(keys.user_ids(f"u{u}"))
    return sum(await pipe.execute())


async def _freshness(
    infra: Infra, ingest: _Ingest, rng: random.Random, rate: int, seconds: float
) -> list[float]:
    # 2. freshness while events stream at `rate`/s
    ingest.freshness = []
    before = ingest.applied
    streamed = await _stream(infra.kafka_bootstrap, rng, rate, seconds)
    await ingest.wait_for(before + streamed, 60)
    return ingest.freshness


async def _lookup_phase(
    infra: Infra, store: FeatureStore, rng: random.Random, lookups: int, n_items: int, concurrency: int,
    served_rate: float,
) -> _LookedUp:  # fmt: skip
    # 3. look-ups over gRPC against the feature service process, and the raw baseline;
    # a second service process logs served features at `served_rate`, measured in
    # alternating blocks against the first (served log off) in the same conditions.
    service = await _start_feature_service(infra, served_rate=0.0)
    logging_service = await _start_feature_service(infra, served_rate=served_rate)
    try:
        feature = FeatureClient(f"127.0.0.1:{service[1]}", "bench", policy=NO_HEDGING)
        logging = FeatureClient(f"127.0.0.1:{logging_service[1]}", "bench", policy=NO_HEDGING)
        plans = [(f"u{rng.randrange(2000)}", [f"i{rng.randrange(3000)}" for _ in range(n_items)])
                 for _ in range(lookups)]  # fmt: skip
        as_of = int(time.time() * 1000)
        for user, item_ids in plans[:100]:
            await feature.get_features(user, item_ids, as_of, cap_s=5.0)
            await logging.get_features(user, item_ids, as_of, cap_s=5.0)
            await store.read_raw(user, item_ids, as_of)
        looked_up = await _alternating_blocks(feature, logging, store, plans, as_of)
        looked_up.throughput = await _throughput(feature, plans, as_of, concurrency, 3.0)
        await feature.close()
        await logging.close()
    finally:
        for proc, _ in (service, logging_service):
            proc.terminate()
        for proc, _ in (service, logging_service):
            proc.wait(10)
    looked_up.served_records = await _topic_records(infra.kafka_bootstrap, SERVED)
    return looked_up


async def _alternating_blocks(
    feature: FeatureClient, logging: FeatureClient, store: FeatureStore, plans: list[tuple[str, list[str]]],
    as_of: int,
) -> _LookedUp:  # fmt: skip
    looked_up = _LookedUp()
    # Both blocks have the same shape (a service call, then the raw read), so
    # the logging service's background work gets the same room in both.
    for start in range(0, len(plans), BLOCK):
        block = plans[start : start + BLOCK]
        for client_, samples in ((feature, looked_up.svc_lat), (logging, looked_up.logged_lat)):
            for user, item_ids in block:
                t = time.perf_counter()
                resp = await client_.get_features(user, item_ids, as_of, cap_s=5.0)
                samples.append(time.perf_counter() - t)
                # A look-up that fell back (Redis past the timeout on a busy
                # box) keeps its time in the sample and is counted, not hidden.
                looked_up.degraded += bool(resp.degraded)
                t = time.perf_counter()
                await store.read_raw(user, item_ids, as_of)
                looked_up.raw_lat.append(time.perf_counter() - t)
    return looked_up


def _figures(
    events: int, n_items: int, concurrency: int, rate: int, served_rate: float, ingested: _Ingested,
    looked_up: _LookedUp,
) -> dict[str, Any]:  # fmt: skip
    svc_lat, raw_lat, logged_lat = looked_up.svc_lat, looked_up.raw_lat, looked_up.logged_lat
    fresh = ingested.fresh
    ms = 1000.0
    return {
        "ingest_events": events,
        "ingest_events_per_s": round(ingested.ingest_rate),
        "produce_events_per_s": round(ingested.produce_rate),
        "ingest_lost": ingested.lost,
        "lookup_items": n_items,
        "lookup_p50_ms": round(percentile(svc_lat, 50) * ms, 3),
        "lookup_p99_ms": round(percentile(svc_lat, 99) * ms, 3),
        "lookup_rps": round(looked_up.throughput, 1),
        "lookup_degraded": looked_up.degraded,
        "lookup_concurrency": concurrency,
        "raw_redis_p50_ms": round(percentile(raw_lat, 50) * ms, 3),
        "raw_redis_p99_ms": round(percentile(raw_lat, 99) * ms, 3),
        "ratio_p50": round(percentile(svc_lat, 50) / percentile(raw_lat, 50), 2),
        "ratio_p99": round(percentile(svc_lat, 99) / percentile(raw_lat, 99), 2),
        "served_log_rate": served_rate,
        "served_log_lookups": len(logged_lat) + 100,
        "served_log_records": looked_up.served_records,
        "logged_p50_ms": round(percentile(logged_lat, 50) * ms, 3),
        "logged_p99_ms": round(percentile(logged_lat, 99) * ms, 3),
        "served_log_overhead_p50_pct": round(
            (percentile(logged_lat, 50) / percentile(svc_lat, 50) - 1) * 100, 1
        ),
        "served_log_overhead_p99_pct": round(
            (percentile(logged_lat, 99) / percentile(svc_lat, 99) - 1) * 100, 1
        ),
        "freshness_rate_per_s": rate,
        "freshness_p50_ms": round(percentile(fresh, 50) * ms, 1),
        "freshness_p99_ms": round(percentile(fresh, 99) * ms, 1),
        **ingested.memory,
    }


async def _stream(bootstrap: str, rng: random.Random, rate: int, seconds: float) -> int:
    producer = make_producer(bootstrap, linger_ms=2)
    await producer.start()
    sent = 0
    started = time.perf_counter()
    futures = []
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                for e in _synthetic(due, rng, int(time.time() * 1000), 1):
                    e["event_id"] = f"s{sent}-{e['event_id']}"
                    futures.append(
                        await producer.send(TOPIC, key=e["user_id"].encode(), value=orjson.dumps(e))
                    )
                    sent += 1
            await asyncio.sleep(0.005)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return sent


async def _topic_records(bootstrap: str, topic: str) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum((await consumer.end_offsets(parts)).values()) if parts else 0
    finally:
        await consumer.stop()


async def _start_feature_service(infra: Infra, served_rate: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = dict(os.environ, REDIS_URL=infra.redis_url, FEATURE_PORT=str(port),
               RECMESH_REPOSITORY=str(DEMO_REPOSITORY), FEATURE_METRICS_PORT=str(free_port()),
               RECMESH_LOG_LEVEL="WARNING",
               KAFKA_BOOTSTRAP=infra.kafka_bootstrap, RECMESH_SERVED_TOPIC=SERVED,
               RECMESH_SERVED_LOG_RATE=str(served_rate))  # fmt: skip
    log = (infra.workdir / "feature.log").open("ab")
    proc = subprocess.Popen(  # noqa: ASYNC220 (starts and returns at once)
        [sys.executable, "-m", "services.feature"], env=env, stdout=log, stderr=log
    )
    probe = FeatureClient(f"127.0.0.1:{port}", "bench")
    try:
        deadline = time.monotonic() + 30
        while not await probe.health(0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"feature service did not start: {(infra.workdir / 'feature.log').read_text()}"
                )
            await asyncio.sleep(0.1)
    finally:
        await probe.close()
    return proc, port


async def _throughput(
    feature: FeatureClient, plans: list[tuple[str, list[str]]], as_of: int, concurrency: int, seconds: float
) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < deadline:
            user, item_ids = plans[i % len(plans)]
            await feature.get_features(user, item_ids, as_of, cap_s=5.0)
            done += 1
            i += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done / (time.perf_counter() - started)


def table(f: dict[str, Any]) -> str:
    return f"""recmesh bench features (this machine; the last round)
  ingest        {f["ingest_events_per_s"]:>10,} events/s per consumer process ({f["ingest_events"]:,} events, lost {f["ingest_lost"]})
                (producer side: {f["produce_events_per_s"]:,} events/s)
  GetFeatures   1 user + {f["lookup_items"]} items over gRPC: p50 {f["lookup_p50_ms"]} ms, p99 {f["lookup_p99_ms"]} ms, {f["lookup_rps"]} req/s at concurrency {f["lookup_concurrency"]}; {f["lookup_degraded"]} fell back
  raw Redis     the same look-up's round trip:   p50 {f["raw_redis_p50_ms"]} ms, p99 {f["raw_redis_p99_ms"]} ms
  overhead      service / raw Redis: p50 x{f["ratio_p50"]}, p99 x{f["ratio_p99"]}
  served log    at rate {f["served_log_rate"]}: p50 {f["logged_p50_ms"]} ms, p99 {f["logged_p99_ms"]} ms, vs off: p50 {f["served_log_overhead_p50_pct"]:+}%, p99 {f["served_log_overhead_p99_pct"]:+}% ({f["served_log_records"]:,} records for {f["served_log_lookups"]:,} look-ups)
  freshness     event time -> in Redis at {f["freshness_rate_per_s"]:,} events/s: p50 {f["freshness_p50_ms"]} ms, p99 {f["freshness_p99_ms"]} ms
  memory        {f["bytes_per_user"]:,} B per active user ({f["events_per_user"]} events held), {f["bytes_per_item"]:,} B per item ({f["events_per_item"]} events held)"""  # noqa: E501


# The figures the mesh's cost targets are about (issue 18), summarised over --repeat rounds.
TARGETS = {
    "ratio_p50": ("GetFeatures p50 / raw Redis", "x", "<= 1.3x"),
    "ratio_p99": ("GetFeatures p99 / raw Redis", "x", ""),
    "freshness_p99_ms": ("freshness p99", " ms", "<= 250 ms"),
    "ingest_events_per_s": ("ingest, one consumer", " ev/s", ">= 30,000 ev/s"),
}


def repeated(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The last round's figures, plus each target figure's median and range over all rounds."""
    figures = dict(rounds[-1])
    figures["rounds"] = len(rounds)
    figures["spread"] = {
        k: v.as_dict() for k, v in spreads([{k: r[k] for k in TARGETS} for r in rounds]).items()
    }
    return figures


def spread_table(f: dict[str, Any]) -> str:
    lines = [f"over {f['rounds']} rounds (median, range):"]
    for key, (label, unit, target) in TARGETS.items():
        s = f["spread"][key]
        digits = 2 if unit == "x" else 0
        text = Spread.of(s).text(digits, unit)
        lines.append(f"  {label:<28} {text}" + (f"   target {target}" if target else ""))
    return "\n".join(lines)


# The figures Redis persistence could move (writes: ingest, freshness; reads beside the
# background writes: look-ups), compared with none per round.
PERSISTENCE_FIGURES = {
    "ingest_events_per_s": "ingest events/s",
    "freshness_p50_ms": "freshness p50",
    "freshness_p99_ms": "freshness p99",
    "lookup_p50_ms": "GetFeatures p50",
    "lookup_p99_ms": "GetFeatures p99",
    "raw_redis_p50_ms": "raw Redis p50",
}
PERSISTENCE_CONFIGS = ("off", "rdb", "aof")


def persistence_cost(rounds: list[dict[str, dict[str, Any]]], mode: str) -> dict[str, dict[str, float]]:
    """Per figure, the spread over rounds of `mode` / off (each round ran both)."""
    out = {}
    for key in PERSISTENCE_FIGURES:
        ratios = [r[mode][key] / r["off"][key] if r["off"][key] else float("nan") for r in rounds]
        out[key] = spread(ratios).as_dict()
    return out


def persistence_table(costs: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["Redis persistence / none, same run (rdb: snapshots, `recmesh up`'s default; aof: "
             "append-only file, fsync every second):"]  # fmt: skip
    for key, label in PERSISTENCE_FIGURES.items():
        cells = "   ".join(f"{mode} {Spread.of(cost[key]).text(3, 'x')}" for mode, cost in costs.items())
        lines.append(f"  {label:<20} {cells}")
    return "\n".join(lines)


def main(args: Any) -> int:
    plaintext_unless_set()
    mode = getattr(args, "redis_persistence", "off")
    if mode == "compare" and os.environ.get("REDIS_URL"):
        print("recmesh bench features: --redis-persistence compare starts its own Redis; unset REDIS_URL",
              file=sys.stderr)  # fmt: skip
        return 2
    configs = PERSISTENCE_CONFIGS if mode == "compare" else (mode,)
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeat):
        one: dict[str, dict[str, Any]] = {}
        for config in round_order(configs, r):
            one[config] = asyncio.run(
                run(
                    args.events, args.lookups, args.items, args.concurrency, args.rate, args.seconds,
                    args.served_rate, persistence=config,
                )
            )  # fmt: skip
        rounds.append(one)
    lost = any(f["ingest_lost"] for one in rounds for f in one.values())
    if mode != "compare":
        figures = repeated([one[mode] for one in rounds])
        emit(figures, args.json, table(figures) + "\n" + spread_table(figures))
        return 1 if lost else 0
    each = {c: repeated([one[c] for one in rounds]) for c in configs}
    costs = {mode: persistence_cost(rounds, mode) for mode in configs if mode != "off"}
    text = "\n".join(f"[Redis persistence {c}]\n{table(each[c])}\n{spread_table(each[c])}" for c in configs)
    emit({**each, "persistence_cost": costs}, args.json, text + "\n" + persistence_table(costs))
    return 1 if lost else 0
