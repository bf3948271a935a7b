"""Served-feature logging end to end: the feature service over real gRPC logs what it
served to a real Tansu topic; the dump is recomputed by the offline replay, and a
deliberate skew (a click written to Redis that is not in the event log) is reported
on exactly the feature and rows it touched."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import redis.asyncio as redis
from aiokafka import AIOKafkaProducer

from recmesh.clients.feature import FeatureClient
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.eventlog import sorted_events, write_events
from recmesh.features.offline import write_csv
from recmesh.features.repository import FeatureSet
from recmesh.features.served import compare, dump_topic, read_served
from recmesh.redis_client import connect
from recmesh.settings import FeatureSettings
from recmesh.tools.cli.main import main as cli_main
from recmesh.tools.demo.generate import generate_events, make_catalog, offline_rows
from recmesh.topics import ensure_topics
from services.feature.catalog import load_catalog
from services.feature.served_log import ServedLog
from services.feature.server import build_server
from services.feature.store import FeatureStore
from tests.helpers import free_port
from tests.helpers import write_events as write_to_store

MIN = 60_000
T0 = 1_767_225_600_000


async def test_served_rows_match_the_replay_and_an_injected_skew_is_reported(
    kafka_bootstrap: str,
    scratch_redis_url: str,
    redis_client: redis.Redis,
    topics: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    demo_fs: FeatureSet,
) -> None:
    catalog = make_catalog()
    users, items = offline_rows(catalog)
    events = list(generate_events(catalog, T0, 20 * MIN, 120, seed=5))
    write_events(tmp_path / "events.jsonl", events)
    users_csv = write_csv(demo_fs, tmp_path / "offline", "user", users)
    items_csv = write_csv(demo_fs, tmp_path / "offline", "item", items)
    client = connect(scratch_redis_url, 8)
    store = FeatureStore(client, demo_fs)
    await load_catalog(client, demo_fs, users, items)
    await write_to_store(store, [Event.model_validate(e) for e in events])

    served_topic = f"served-{topics['events']}"
    await ensure_topics(kafka_bootstrap, {served_topic: 1})
    settings = FeatureSettings(feature_port=free_port(), kafka_bootstrap=kafka_bootstrap)
    served_log = ServedLog(
        lambda: AIOKafkaProducer(bootstrap_servers=kafka_bootstrap),
        served_topic,
        rate=1.0,
        feature_version=demo_fs.version,
    )
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(served_log.run(stop_log))
    server = build_server(settings, store, served_log)
    await server.start()
    await server.set_serving()
    features = FeatureClient(server.address, "test")

    rng = random.Random(3)
    people = sorted({e["user_id"] for e in events})[:5]
    candidates = list(dict.fromkeys(e["item_id"] for e in events))
    skewed = candidates[0]
    try:
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
        await features.close()
        await server.stop(0.5)
        stop_log.set()
        await asyncio.wait_for(log_task, 15)
        await client.aclose()
    assert served_log.sent == 10 and served_log.dropped == 0

    dumped = tmp_path / "served.jsonl"
    assert (await dump_topic(kafka_bootstrap, served_topic, dumped, timeout_s=20)).written == 10
    rows = read_served(dumped)
    assert {r["feature_version"] for r in rows} == {demo_fs.version}
    assert all(len(r["item_ids"]) == 31 and r["request_id"] for r in rows)

    report = compare(
        demo_fs,
        rows,
        sorted_events(tmp_path / "events.jsonl", demo_fs.event_schema),
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
