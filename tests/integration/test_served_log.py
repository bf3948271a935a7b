"""Served-feature logging end to end: the feature service over real gRPC logs what it
served to a real Tansu topic; the dump is recomputed by the offline replay, and a
deliberate skew (a click written to Redis that is not in the event log) is reported
on exactly the feature and rows it touched."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as redis
from aiokafka import AIOKafkaProducer

from recmesh.clients.feature import FeatureClient
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.eventlog import sorted_events, write_events
from recmesh.features.repository import FeatureSet
from recmesh.features.served import (
    CompareReport,
    compare,
    dump_topic,
    format_report,
    positions_path,
    read_positions,
    read_served,
)
from recmesh.features.tabular import write_csv
from recmesh.redis_client import connect
from recmesh.settings import FeatureSettings, IngestSettings
from recmesh.tools.cli.main import main as cli_main
from recmesh.tools.demo.generate import generate_events, make_catalog, offline_rows
from recmesh.topics import ensure_topics
from services.feature.catalog import load_catalog
from services.feature.ingest import running
from services.feature.served_log import ServedLog
from services.feature.server import build_server
from services.feature.store import FeatureStore
from tests.helpers import free_port, poll_until, produce_events
from tests.helpers import write_events as write_to_store

MIN = 60_000
T0 = 1_767_225_600_000


@asynccontextmanager
async def _logged_service(
    kafka_bootstrap: str, served_topic: str, settings: FeatureSettings, store: FeatureStore
) -> AsyncIterator[tuple[FeatureClient, ServedLog]]:
    """A feature service over real gRPC logging every look-up to `served_topic`, and a
    client of it; on the way out the client, the server and the log are stopped (the
    log flushed)."""
    await ensure_topics(kafka_bootstrap, {served_topic: 1})
    served_log = ServedLog(
        lambda: AIOKafkaProducer(bootstrap_servers=kafka_bootstrap),
        served_topic,
        rate=1.0,
        feature_version=store.feature_set.version,
    )
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(served_log.run(stop_log))
    server = build_server(settings, store, served_log)
    await server.start()
    await server.set_serving()
    features = FeatureClient(server.address, "test")
    try:
        yield features, served_log
    finally:
        await features.close()
        await server.stop(0.5)
        stop_log.set()
        await asyncio.wait_for(log_task, 15)


async def test_served_rows_match_the_replay_and_an_injected_skew_is_reported(
    kafka_bootstrap: str,
    scratch_redis_url: str,
    redis_client: redis.Redis,
    topics: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    demo_feature_set: FeatureSet,
) -> None:
    catalog = make_catalog()
    users, items = offline_rows(catalog)
    events = list(generate_events(catalog, T0, 20 * MIN, 120, seed=5))
    write_events(tmp_path / "events.jsonl", events)
    users_csv = write_csv(demo_feature_set, tmp_path / "offline", "user", users)
    items_csv = write_csv(demo_feature_set, tmp_path / "offline", "item", items)
    client = connect(scratch_redis_url, 8)
    store = FeatureStore(client, demo_feature_set)
    await load_catalog(client, demo_feature_set, users, items)
    await write_to_store(store, [Event.model_validate(e) for e in events])

    served_topic = f"served-{topics['events']}"
    settings = FeatureSettings(feature_port=free_port(), kafka_bootstrap=kafka_bootstrap)
    rng = random.Random(3)
    people = sorted({e["user_id"] for e in events})[:5]
    candidates = list(dict.fromkeys(e["item_id"] for e in events))
    skewed = candidates[0]
    try:
        async with _logged_service(kafka_bootstrap, served_topic, settings, store) as (features, served_log):
            # Round 1: state exactly as the event log built it.
            for user in people:
                picks = [skewed, *rng.sample(candidates[1:], 30)]
                await features.get_features(user, picks, T0 + 20 * MIN, cap_s=5.0)
            # The skew: a click that reached the online store but not the log.
            await client.zadd(keys.stream("item", skewed, "click"), {"not-in-the-log": T0 + 20 * MIN - 5000})
            for user in people:
                picks = [skewed, *rng.sample(candidates[1:], 30)]
                await features.get_features(user, picks, T0 + 20 * MIN + 1000, cap_s=5.0)
    finally:
        await client.aclose()
    assert served_log.sent == 10 and served_log.dropped == 0

    dumped = tmp_path / "served.jsonl"
    assert (await dump_topic(kafka_bootstrap, served_topic, dumped, timeout_s=20)).written == 10
    rows = read_served(dumped)
    assert {r["feature_version"] for r in rows} == {demo_feature_set.version}
    assert all(len(r["item_ids"]) == 31 and r["request_id"] for r in rows)

    report = compare(
        demo_feature_set,
        rows,
        sorted_events(tmp_path / "events.jsonl", demo_feature_set.event_schema),
        dict(users),
        dict(items),
    )
    assert report.rows == 10 and report.skipped_degraded == 0
    tally = report.features
    assert tally["clicks_10m"].mismatched == 5  # the skewed item, in each round-2 row
    assert {ex["item_id"] for ex in tally["clicks_10m"].examples} == {skewed}
    assert {ex["as_of_ms"] for ex in tally["clicks_10m"].examples} == {T0 + 20 * MIN + 1000}
    assert all(ex["served"] == ex["replay"] + 1 for ex in tally["clicks_10m"].examples)
    assert report.mismatches == 5  # nothing else differs
    for name in ("clicks_5m", "category_clicks_10m", "last_viewed_3", "views_10m", "category", "age_band"):
        assert tally[name].compared > 0 and tally[name].mismatched == 0, name

    # The same through the command line: exit 1 and the feature named.
    log = str(tmp_path / "events.jsonl")
    code = cli_main([
        "features", "compare", "--served", str(dumped), "--events", log,
        "--users", str(users_csv), "--items", str(items_csv),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert "5 mismatched values" in out and "clicks_10m" in out


async def test_a_store_behind_the_stream_is_told_apart_from_a_wrong_value(
    kafka_bootstrap: str,
    scratch_redis_url: str,
    redis_client: redis.Redis,
    topics: dict[str, str],
    tmp_path: Path,
    demo_feature_set: FeatureSet,
) -> None:
    """The real ingest applies the first 15 minutes of a log and stops; the last 5
    reach the topic only. Look-ups as of the end are served from a store behind the
    stream, and say how far it was (the ingest's applied marks); one item carries a
    click that is in no log. `compare` with the events' topic positions reports the
    lag apart and the wrong value alone as a mismatch; without them, both mismatch."""
    catalog = make_catalog()
    users, items = offline_rows(catalog)
    events = sorted(generate_events(catalog, T0, 20 * MIN, 120, seed=7), key=lambda e: int(e["event_time"]))
    applied = [e for e in events if int(e["event_time"]) < T0 + 15 * MIN]
    late = events[len(applied) :]
    client = connect(scratch_redis_url, 8)
    store = FeatureStore(client, demo_feature_set)
    await load_catalog(client, demo_feature_set, users, items)
    ingest = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}", state_sample_s=0,
    )  # fmt: skip
    await produce_events(kafka_bootstrap, topics["events"], applied)
    async with running(ingest, store) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == len(applied)), "first part applied", 30)
    marks = keys.parse_applied(await client.hgetall(keys.applied(topics["events"])))
    assert sum(offset for offset, _ in marks.values()) == len(applied), "next offsets, all partitions"
    assert max(newest for _, newest in marks.values()) == int(applied[-1]["event_time"])
    await produce_events(kafka_bootstrap, topics["events"], late)  # on the topic, never applied

    served_topic = f"served-{topics['events']}"
    settings = FeatureSettings(
        feature_port=free_port(), kafka_bootstrap=kafka_bootstrap, events_topic=topics["events"]
    )
    late_users = sorted({str(e["user_id"]) for e in late})[:6]
    late_items = list(dict.fromkeys(str(e["item_id"]) for e in late))[:20]
    quiet = [str(e["item_id"]) for e in applied if str(e["item_id"]) not in {str(x["item_id"]) for x in late}]
    skewed = quiet[0]  # no late event: only the injected click can make it differ
    try:
        async with _logged_service(kafka_bootstrap, served_topic, settings, store) as (features, _):
            await client.zadd(keys.stream("item", skewed, "click"), {"not-in-any-log": T0 + 15 * MIN - 5000})
            for user in late_users:
                await features.get_features(user, [skewed, *late_items], T0 + 20 * MIN, cap_s=5.0)
    finally:
        await client.aclose()

    dumped, log = tmp_path / "served.jsonl", tmp_path / "events.jsonl"
    assert (await dump_topic(kafka_bootstrap, served_topic, dumped, timeout_s=20)).written == len(late_users)
    places = positions_path(log)
    assert (await dump_topic(kafka_bootstrap, topics["events"], log, 20, positions=places)).written == len(
        events
    )
    rows = read_served(dumped)
    assert all(r["applied"]["before"] == r["applied"]["after"] == {str(p): list(m) for p, m in marks.items()}
               for r in rows), "nothing was applied meanwhile"  # fmt: skip

    def report(positions: bool) -> CompareReport:
        return compare(
            demo_feature_set,
            rows,
            sorted_events(log, demo_feature_set.event_schema),
            dict(users),
            dict(items),
            read_positions(places) if positions else None,
        )

    told = report(positions=True)
    assert told.features["clicks_10m"].mismatched == len(late_users), "the injected click, in every row"
    assert {ex["item_id"] for ex in told.features["clicks_10m"].examples} == {skewed}
    assert told.mismatches == len(late_users), "nothing else is wrong"
    assert told.behind > 0 and told.rows_behind == len(late_users)
    blind = report(positions=False)
    assert blind.mismatches == told.mismatches + told.behind and blind.behind == 0
    text = format_report(told)
    assert "behind the stream" in text and f"{len(late_users)} mismatched values" in text
