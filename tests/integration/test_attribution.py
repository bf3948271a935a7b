"""Attribution against a real Redis and a real Tansu broker: the figures it adds up
equal a reference computed from the same records, whatever the order the two
topics are read in, and stay equal when everything is read again (a second
group: every record redelivered) or when the process is SIGKILLed mid-stream."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as redis

from recmesh.evaluation import impression
from recmesh.evaluation.impression import Shadow
from recmesh.evaluation.outcome import Positive, Touch, credited, outcome
from recmesh.evaluation.sums import add, increments, rows
from recmesh.features import keys
from recmesh.features.repository import DEMO_REPOSITORY, Evaluation, FeatureSet
from recmesh.redis_client import connect
from recmesh.settings import AttributionSettings
from recmesh.topics import ensure_topics
from services.attribution.consumer import running
from services.attribution.store import AttributionStore, read_sums
from tests.helpers import free_port, poll_until, produce_events

ROOT = Path(__file__).resolve().parents[2]
EVALUATION = Evaluation(frozenset({"click"}), window_ms=2_000, lateness_ms=300, k=4)
POOL = [f"i{n}" for n in range(12)]


def world(users: int, seed: int, base: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Answers (two or three per user, overlapping in time) and the events that follow:
    clicks on shown items in and out of the window, some naming their answer, clicks
    on items never shown, views, and duplicates (the same event id twice)."""
    rng = random.Random(seed)
    answers: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for u in range(users):
        user, t = f"u{u}", base + rng.randrange(0, 3_000)
        for a in range(rng.choice((2, 3))):
            as_of, items = t + a * rng.randrange(200, 1_500), rng.sample(POOL, 5)
            rid = f"{user}-r{a}"
            answers.append(impression.record(
                request_id=rid, user_id=user, items=[(i, rng.random()) for i in items],
                model_version=rng.choice(("m1", "m2")), feature_version="f",
                degraded=rng.choice(([], ["ladder:no_crosses"])), slo_class=rng.choice("AB"), arm="control",
                as_of_ms=as_of, served_at_ms=as_of, trace_id="t",
                shadow=Shadow("cand", tuple(rng.random() for _ in items)),
            ))  # fmt: skip
            for i in [*items, rng.choice(POOL)]:
                if rng.random() < 0.35:
                    ev = {"event_id": f"e{len(events)}", "user_id": user, "item_id": i, "behavior": "click",
                          "event_time": as_of + rng.randrange(0, 2_600)}  # fmt: skip
                    if rng.random() < 0.3:
                        ev["request_id"] = rid
                    events.append(ev)
                    if rng.random() < 0.2:
                        events.append(dict(ev))  # delivered twice
            events.append({"event_id": f"v{len(events)}", "user_id": user, "item_id": items[0],
                           "behavior": "view", "event_time": as_of + 100})  # fmt: skip
    answers.sort(key=lambda r: int(r["as_of_ms"]))
    events.sort(key=lambda e: int(e["event_time"]))
    return answers, events


def reference(answers: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, float]:
    """The sums, computed straight from the records with the pure code."""
    shown = [impression.parse(orjson.dumps(a)) for a in answers]
    positives: dict[str, dict[str, Positive]] = {}
    for e in events:
        if e["behavior"] == "click":
            p = Positive(e["item_id"], e["event_time"], e["event_id"], e.get("request_id"))
            positives.setdefault(e["user_id"], {})[p.event_id] = p
    out: dict[str, float] = {}
    for s in shown:
        others = [Touch(o.request_id, o.as_of_ms, frozenset(o.items)) for o in shown
                  if o.user_id == s.user_id and o is not s]  # fmt: skip
        clicked = credited(s, positives.get(s.user_id, {}).values(), others, EVALUATION.window_ms)
        assert s.shadow is not None
        served = outcome(s, clicked, EVALUATION.k)
        add(out, dict(increments(s, served, outcome(s, clicked, EVALUATION.k, s.shadow.scores))))
    return out


def assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name


async def _produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    await produce_events(bootstrap, topic, records)


@pytest.fixture
async def attribution_topics(kafka_bootstrap: str, topics: dict[str, str]) -> dict[str, str]:
    names = {"events": topics["events"], "impressions": f"imp-{topics['events']}"}
    await ensure_topics(kafka_bootstrap, {names["impressions"]: 3})
    return names


def _settings(bootstrap: str, url: str, names: dict[str, str], group: str) -> AttributionSettings:
    return AttributionSettings(
        kafka_bootstrap=bootstrap, redis_url=url, events_topic=names["events"],
        impressions_topic=names["impressions"], consumer_group=group, idle_ms=300, max_batch=50,
    )  # fmt: skip


async def test_figures_equal_the_reference_in_any_order_and_redelivery_adds_nothing(
    kafka_bootstrap: str, attribution_topics: dict[str, str], redis_client: redis.Redis,
    scratch_redis_url: str, demo_feature_set: FeatureSet,
) -> None:  # fmt: skip
    answers, events = world(40, seed=7, base=int(time.time() * 1000) - 20_000)
    # the events go first: many clicks are read before the answer they credit
    await _produce(kafka_bootstrap, attribution_topics["events"], events)
    await _produce(kafka_bootstrap, attribution_topics["impressions"], answers)
    want = reference(answers, events)
    client = connect(scratch_redis_url, 8)
    store = AttributionStore(client, EVALUATION, grace_ms=60_000, retention_ms=3_600_000)
    schema = demo_feature_set.event_schema
    try:
        for group in ("g1", "g2"):  # g2 reads every record a second time
            settings = _settings(
                kafka_bootstrap, scratch_redis_url, attribution_topics, f"{group}-{time.time()}"
            )
            async with running(settings, store, schema) as attributor:

                async def all_final(a: Any = attributor) -> bool:
                    return await store.pending() == 0 and a.finalised + a.already >= len(answers)

                await poll_until(all_final, f"{group}: every answer final", 30)
                if group == "g1":
                    assert attributor.finalised == len(answers)
                else:
                    assert attributor.finalised == 0 and attributor.already == len(answers)
            got, _ = await read_sums(client, None)
            assert_same(got, want)
        by_model = {r.key[0]: r for r in rows(want, by=["model_version"])}
        assert by_model["m1"].answers + by_model["m2"].answers == len(answers)
        assert by_model["cand"].key[3] == "shadow" and sum(want[k] for k in want if k.endswith("clicks")) > 20
        window, newest = await read_sums(client, 60_000)
        assert (
            newest is not None
            and 0 < sum(v for k, v in window.items() if k.endswith("\x1fn")) <= len(answers) * 2
        )
        assert await redis_client.exists(keys.impression("u0", "u0-r0")) == 0, "a final answer is forgotten"
    finally:
        await client.aclose()


def _process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "services.attribution"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip


async def test_a_process_killed_mid_stream_ends_exact(
    kafka_bootstrap: str, attribution_topics: dict[str, str], redis_client: redis.Redis,
    scratch_redis_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    repository = tmp_path / "recmesh.toml"
    demo = DEMO_REPOSITORY.read_text()
    repository.write_text(  # the demo's, with the test's evaluation section
        demo[: demo.index("[evaluation]")]
        + '[evaluation]\npositive = ["click"]\nwindow = "2s"\nlateness = "300ms"\nk = 4\n'
    )
    answers, events = world(300, seed=11, base=int(time.time() * 1000) - 60_000)
    await _produce(kafka_bootstrap, attribution_topics["events"], events)
    await _produce(kafka_bootstrap, attribution_topics["impressions"], answers)
    want = reference(answers, events)
    env = dict(
        os.environ, REDIS_URL=scratch_redis_url, KAFKA_BOOTSTRAP=kafka_bootstrap,
        RECMESH_EVENTS_TOPIC=attribution_topics["events"],
        RECMESH_IMPRESSIONS_TOPIC=attribution_topics["impressions"],
        RECMESH_ATTRIBUTION_GROUP=f"kill-{time.time()}", ATTRIBUTION_METRICS_PORT=str(free_port()),
        RECMESH_ATTRIBUTION_MAX_BATCH="40", RECMESH_ATTRIBUTION_IDLE_MS="300",
        RECMESH_REPOSITORY=str(repository),
    )  # fmt: skip
    proc = _process(env, tmp_path / "attribution.log")
    try:

        async def under_way() -> bool:
            total = await redis_client.hget(keys.EVAL_TOTAL, "\x1f".join(("m1", "full", "A", "control", "n")))
            return await redis_client.exists(keys.EVAL_PENDING) == 1 or bool(total)

        await poll_until(under_way, "attribution under way", 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        env["ATTRIBUTION_METRICS_PORT"] = str(free_port())
        proc = _process(env, tmp_path / "attribution.log")

        async def done() -> bool:
            got, _ = await read_sums(redis_client, None)
            n = sum(v for k, v in got.items() if k.endswith("\x1fn") and "\x1fshadow\x1f" not in k)
            return n >= len(answers) and await redis_client.zcard(keys.EVAL_PENDING) == 0

        await poll_until(done, "every answer final after the restart", 60)
        got, _ = await read_sums(redis_client, None)
        assert_same(got, want)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert "stopped" in (tmp_path / "attribution.log").read_text()


def test_eval_online_prints_each_group_with_intervals(
    scratch_redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import redis as sync_redis

    from recmesh.tools.cli.main import main as cli_main

    answers, events = world(60, seed=3, base=1_767_225_600_000)
    want = reference(answers, events)
    client = sync_redis.Redis.from_url(scratch_redis_url)
    client.flushdb()
    client.hset(keys.EVAL_TOTAL, mapping={k: str(v) for k, v in want.items()})
    minute = 1_767_225_600_000 // 60_000
    client.hset(keys.eval_sums(minute), mapping={k: str(v) for k, v in want.items()})
    client.zadd(keys.EVAL_BUCKETS, {str(minute): minute})
    monkeypatch.setenv("REDIS_URL", scratch_redis_url)
    assert cli_main(["eval", "online", "--window", "all", "--json", "--by", "model_version"]) == 0
    out = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    served = {r["model_version"]: r for r in out["rows"] if r["arm"] != "shadow"}
    assert set(served) == {"m1", "m2"} and sum(r["answers"] for r in served.values()) == len(answers)
    m1 = next(r for r in rows(want, by=["model_version"]) if r.key[0] == "m1")
    ctr = m1.figure("ctr")
    assert ctr is not None and served["m1"]["ctr"]["mean"] == pytest.approx(ctr.mean)
    assert served["m1"]["auc"]["ci95"] > 0 and len(served["m1"]["ctr_by_position"]) == out["k"]
    assert cli_main(["eval", "online", "--window", "15m", "--by", "model_version,slo_class"]) == 0
    table = capsys.readouterr().out
    assert "model_version" in table and "m1" in table and "±" in table and "shadow" in table
    client.flushdb()
    assert cli_main(["eval", "online"]) == 0
    assert "no answer is final yet" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["eval", "online", "--by", "colour"])
    assert "choose from model_version" in capsys.readouterr().err


async def test_an_answer_is_due_once_the_clock_passes_its_window_and_lateness(scratch_redis_url: str) -> None:
    client = connect(scratch_redis_url, 2)
    store = AttributionStore(client, EVALUATION, grace_ms=60_000, retention_ms=3_600_000)
    try:
        await client.flushdb()
        answer = impression.parse(orjson.dumps(world(1, seed=1, base=1_767_225_600_000)[0][0]))
        await store.write([answer], {})
        final_at = answer.as_of_ms + EVALUATION.window_ms + EVALUATION.lateness_ms
        assert await store.due(final_at - 1, 10) == []
        (due,) = await store.due(final_at, 10)
        assert due.shown == answer
    finally:
        await client.aclose()
