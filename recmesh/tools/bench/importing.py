"""`recmesh bench import`: a team-sized catalog and event log through the import path.

Writes a catalog of `--items` items and `--users` users and an event log of
`--events` events as a team's own files (CSV, its own column names, times in
epoch seconds, its own behaviour names mapped by aliases) with a repository
file describing them, then, against real Redis and Tansu processes, times the
three steps a team runs: `catalog load` (with the Redis memory per user and
per item it leaves), `events import --to topic` (read, checked, mapped,
produced with acks=all), and one ingest consumer writing them to Redis (with
the memory per active user and item of the real-time state it leaves).
"""

from __future__ import annotations

import asyncio
import csv
import random
import time
from pathlib import Path
from typing import Any

from recmesh.features import keys
from recmesh.features.repository import load_feature_set
from recmesh.tools.bench.common import emit, infrastructure

TOPIC, DLQ = "bench-import.user_behavior", "bench-import.user_behavior.dlq"
CATEGORIES = ("news", "sports", "music", "movies", "tech", "food", "travel", "fashion", "gaming", "science")

REPOSITORY = """
[repository]
name = "import-bench"

[events]
event_id = "event"
user_id = "visitorid"
item_id = "itemid"
behavior = "action"
event_time = "ts"
time_unit = "s"
behaviors = ["view", "click", "add_to_cart", "purchase"]
values = { price = "price" }
aliases = { addtocart = "add_to_cart", transaction = "purchase" }

[users]
source = "users.csv"
id = "visitorid"
[users.features]
segment = { type = "categorical" }
interests = { type = "multi", separator = "|" }

[items]
source = "items.csv"
id = "itemid"
[items.features]
category = { type = "categorical" }
price = { type = "numeric" }
brand_tier = { type = "integer" }

[state]
dedup = "{dedup}"

[realtime.clicks_5m]
entity = "user"
aggregate = "count"
behaviors = ["click"]
window = "5m"

[realtime.category_clicks_10m]
entity = "user"
aggregate = "count_by"
by = "category"
behaviors = ["click"]
window = "10m"

[realtime.recent_items]
entity = "user"
aggregate = "last_n"
n = 5
behaviors = ["view", "click"]
window = "1h"

[realtime.spend_1h]
entity = "user"
aggregate = "sum"
field = "price"
behaviors = ["purchase"]
window = "1h"

[realtime.views_10m]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "10m"

[realtime.carts_1h]
entity = "item"
aggregate = "count"
behaviors = ["add_to_cart"]
window = "1h"

[recall]
category = "category"
affinity = "category_clicks_10m"
interests = "interests"
recent_items = "recent_items"
popularity = { behaviors = ["view"] }
"""


# How the repository keeps its windows: 'tiled' (30 s tiles for the 5 and 10 minute
# windows, the default 1 minute tiles for the hour ones, a capped list for recent_items,
# event ids remembered a minute) or 'exact' (every event kept as long as its window).
WINDOWS: dict[str, dict[str, str | None]] = {
    "tiled": {"short": '"30s"', "long": None, "dedup": "1m"},
    "exact": {"short": '"exact"', "long": '"exact"', "dedup": "1h"},
}


def repository(windows: str) -> str:
    """The bench's repository file, its windows kept as WINDOWS[windows] says."""
    w = WINDOWS[windows]
    text = REPOSITORY.replace("{dedup}", str(w["dedup"]))
    for window in ('"5m"', '"10m"'):
        text = text.replace(f"window = {window}\n", f"window = {window}\nslide = {w['short']}\n")
    if w["long"] is not None:
        text = text.replace('window = "1h"\n', f'window = "1h"\nslide = {w["long"]}\n')
    return text


def write_files(
    out: Path, items: int, users: int, events: int, seed: int = 5, windows: str = "tiled"
) -> dict[str, Path]:
    rng = random.Random(seed)
    (out / "recmesh.toml").write_text(repository(windows))
    with (out / "items.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["itemid", "category", "price", "brand_tier"])
        for i in range(items):
            w.writerow([f"p{i}", rng.choice(CATEGORIES), round(rng.uniform(1, 300), 2), rng.randint(1, 5)])
    with (out / "users.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["visitorid", "segment", "interests"])
        for u in range(users):
            w.writerow(
                [f"v{u}", rng.choice(("new", "returning", "vip")), "|".join(rng.sample(CATEGORIES, 2))]
            )
    now_s = time.time()
    actions = (("view", 0.8), ("click", 0.15), ("addtocart", 0.04), ("transaction", 0.01))
    names, weights = [a for a, _ in actions], [w for _, w in actions]
    # Zipf-ish popularity over items, a milder skew over users (the busiest
    # holds about 0.5 % of the events at 50k users); the last hour of traffic.
    item_weights = [1.0 / (k + 1) ** 0.9 for k in range(items)]
    picks = rng.choices(range(items), weights=item_weights, k=events)
    who = rng.choices(range(users), weights=[1.0 / (k + 1) ** 0.6 for k in range(users)], k=events)
    with (out / "events.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["event", "visitorid", "itemid", "action", "ts", "price"])
        for n, item in enumerate(picks):
            action = rng.choices(names, weights)[0]
            price = round(rng.uniform(1, 300), 2) if action == "transaction" else ""
            w.writerow([f"e{n}", f"v{who[n]}", f"p{item}", action,
                        round(now_s - rng.uniform(0, 3600), 3), price])  # fmt: skip
    return {"repo": out / "recmesh.toml", "events": out / "events.csv"}


async def _families(client: Any, feature_set: Any, sample_keys: int = 20_000) -> dict[str, float]:
    """MB of Redis memory per real-time state family (keys.state_families), from MEMORY
    USAGE of a uniform sample of the keys (RANDOMKEY) scaled to the key count."""
    families = keys.state_families(feature_set)
    total_keys = int(await client.dbsize())
    pipe = client.pipeline(transaction=False)
    for _ in range(min(sample_keys, total_keys)):
        pipe.randomkey()
    drawn = {bytes(k).decode() for k in await pipe.execute() if k is not None}
    pipe = client.pipeline(transaction=False)
    for k in drawn:
        pipe.memory_usage(k)
    sizes = await pipe.execute()
    by: dict[str, int] = {}
    for k, size in zip(drawn, sizes, strict=True):
        name = keys.state_family(k, families) or "other (catalog, popularity)"
        by[name] = by.get(name, 0) + int(size or 0)
    scale = total_keys / max(1, len(drawn))
    return {name: round(b * scale / 2**20, 1) for name, b in sorted(by.items())}


async def _memory(client: Any, feature_set: Any, users: list[str], items: list[str]) -> dict[str, float]:
    async def usage(names: list[str]) -> int:
        pipe = client.pipeline(transaction=False)
        for k in names:
            pipe.memory_usage(k)
        return sum(int(x or 0) for x in await pipe.execute())

    def streams(entity: str, entity_id: str) -> list[str]:
        return [keys.stream(entity, entity_id, s.id) for s in feature_set.streams_of(entity)]

    user_rt = [await usage([*streams("user", u), keys.user_ids(u), keys.user_history(u)]) for u in users]
    item_rt = [await usage([*streams("item", i), keys.newest("item", i), keys.item_covisits(i)])
               for i in items]  # fmt: skip
    return {
        "realtime_bytes_per_active_user": round(sum(user_rt) / max(1, len(user_rt))),
        "realtime_bytes_per_active_item": round(sum(item_rt) / max(1, len(item_rt))),
    }


def _cli(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """A `recmesh` command as a team runs it; its --json figures."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "recmesh.tools.cli.main", *args, "--json"], env={**os.environ, **env},
        capture_output=True, text=True, check=False, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"recmesh {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


async def _ingest_processes(n: int, records: int, env: dict[str, str], client: Any, workdir: Path) -> float:
    """`n` ingest processes in one consumer group (`python -m services.feature.ingest`, as
    `recmesh up` and the Deployment run it) until the offsets they applied (keys.applied)
    reach `records`: seconds from the first batch applied to the last, scaled to every
    record (start-up and group joins left out)."""
    import os
    import subprocess
    import sys

    from recmesh.tools.localinfra import free_port

    procs = []
    for k in range(n):
        log = (workdir / f"ingest-{k}.log").open("ab")
        procs.append(subprocess.Popen(  # noqa: ASYNC220 (started once, stopped below)
            [sys.executable, "-m", "services.feature.ingest"], stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **env, "INGEST_METRICS_PORT": str(free_port())},
        ))  # fmt: skip
    try:
        first: tuple[float, int] | None = None
        while True:
            done = sum(o for o, _ in keys.parse_applied(await client.hgetall(keys.applied(TOPIC))).values())
            now = time.perf_counter()
            if first is None and done > 0:
                first = (now, done)
            if done >= records:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"an ingest process exited; its log is in {workdir}")
            await asyncio.sleep(0.05)
        assert first is not None
        return (now - first[0]) * records / max(1, records - first[1])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


async def run(
    items: int, users: int, events: int, windows: str = "tiled", consumers: int = 1
) -> dict[str, Any]:
    from recmesh.features.importer import EventMapper, good_events
    from recmesh.redis_client import connect
    from recmesh.settings import IngestSettings
    from services.feature.ingest import running
    from services.feature.store import FeatureStore

    async with infrastructure({TOPIC: 3, DLQ: 1}) as infra:
        t = time.perf_counter()
        files = await asyncio.to_thread(write_files, infra.workdir, items, users, events, 5, windows)
        write_s = time.perf_counter() - t
        feature_set = load_feature_set(files["repo"])
        env = {"RECMESH_REPOSITORY": str(files["repo"]), "REDIS_URL": infra.redis_url,
               "KAFKA_BOOTSTRAP": infra.kafka_bootstrap, "RECMESH_EVENTS_TOPIC": TOPIC}  # fmt: skip
        catalog = await asyncio.to_thread(_cli, ["catalog", "load"], env)
        imported = await asyncio.to_thread(
            _cli, ["events", "import", str(files["events"]), "--rate", "1e9"], env
        )

        client = connect(infra.redis_url, 8)
        catalog_bytes = int((await client.info("memory"))["used_memory"])
        cpu_before = await client.info("cpu")
        if consumers == 1:
            store = FeatureStore(client, feature_set)
            settings = IngestSettings(kafka_bootstrap=infra.kafka_bootstrap, redis_url=infra.redis_url,
                                      events_topic=TOPIC, dlq_topic=DLQ, consumer_group="bench-import",
                                      state_sample_s=0)  # fmt: skip
            t = time.perf_counter()
            async with running(settings, store) as ingestor:
                while ingestor.applied < imported["events"]:  # noqa: ASYNC110 (a counter the consumer bumps)
                    await asyncio.sleep(0.05)
            ingest_s = time.perf_counter() - t
        else:
            ingest_s = await _ingest_processes(consumers, int(imported["records"]), {
                **env, "RECMESH_DLQ_TOPIC": DLQ, "RECMESH_CONSUMER_GROUP": "bench-import",
                "RECMESH_STATE_SAMPLE_S": "0"}, client, infra.workdir)  # fmt: skip
        cpu_after = await client.info("cpu")
        redis_cpu_s = sum(
            float(cpu_after[k]) - float(cpu_before[k]) for k in ("used_cpu_user", "used_cpu_sys")
        )
        # Active users and items: a uniform sample of those the log names (a
        # sample of events would be one of the busiest).
        active_users, active_items = set(), set()
        for e in good_events(EventMapper(feature_set), files["events"]):
            active_users.add(e.user_id)
            active_items.add(e.item_id)
        draw = random.Random(1)
        memory = await _memory(
            client, feature_set, draw.sample(sorted(active_users), min(400, len(active_users))),
            draw.sample(sorted(active_items), min(400, len(active_items))),
        )  # fmt: skip
        memory["active_users"], memory["active_items"] = len(active_users), len(active_items)
        info = await client.info("memory")
        families = await _families(client, feature_set)
        redis_keys = int(await client.dbsize())
        await client.aclose()
    sent = int(imported["events"])
    realtime = int(info["used_memory"]) - catalog_bytes
    return {
        "items": catalog["items"], "users": catalog["users"], "events": sent, "records": imported["records"],
        "bad_records": imported["bad_records"], "write_files_s": round(write_s, 1),
        "catalog_load_s": catalog["seconds"], "catalog_bytes_per_user": catalog["bytes_per_user"],
        "catalog_bytes_per_item": catalog["bytes_per_item"],
        "import_total_s": imported["seconds"], "import_events_per_s": imported["events_per_s"],
        "ingest_consumers": consumers, "ingest_s": round(ingest_s, 1),
        "ingest_events_per_s": round(sent / ingest_s),
        "ingest_redis_us_per_event": round(redis_cpu_s / sent * 1e6, 1),
        "redis_used_memory_mb": round(int(info["used_memory"]) / 2**20, 1),
        "windows": windows, "catalog_memory_mb": round(catalog_bytes / 2**20, 1),
        "realtime_memory_mb": round(realtime / 2**20, 1),
        "realtime_bytes_per_event": round(realtime / sent, 1),
        "realtime_mb_by_family": families, "redis_keys": redis_keys,
        **memory,
    }  # fmt: skip


def table(f: dict[str, Any]) -> str:
    return f"""recmesh bench import (this machine, one run; a team's CSV files mapped by a repository file)
  catalog load   {f["users"]:,} users + {f["items"]:,} items in {f["catalog_load_s"]} s; Redis {f["catalog_bytes_per_user"]} B per user profile, {f["catalog_bytes_per_item"]} B per item (hash + popularity)
  events import  {f["events"]:,} events from {f["records"]:,} records in {f["import_total_s"]} s ({f["import_events_per_s"]:,} events/s; checked, mapped, sorted, produced with acks=all)
  ingest         {f["ingest_consumers"]} consumer process(es): {f["ingest_s"]} s ({f["ingest_events_per_s"]:,} events/s; redis-server {f["ingest_redis_us_per_event"]} us CPU per event)
  real-time      {f["realtime_bytes_per_active_user"]:,} B per active user ({f["active_users"]:,}), {f["realtime_bytes_per_active_item"]:,} B per active item ({f["active_items"]:,}) (streams, ids, history, newest, co-visits); Redis used {f["redis_used_memory_mb"]} MB in all
  state          windows {f["windows"]}: {f["realtime_memory_mb"]} MB after the ingest beyond the catalog's {f["catalog_memory_mb"]} MB, {f["realtime_bytes_per_event"]} B per event, {f["redis_keys"]:,} keys in all; by family (MB): {", ".join(f"{k} {v}" for k, v in f["realtime_mb_by_family"].items())}"""  # noqa: E501


def main(args: Any) -> int:
    figures = asyncio.run(run(args.items, args.users, args.events, args.windows, args.consumers))
    emit(figures, args.json, table(figures))
    return 0 if figures["bad_records"] == 0 else 1
