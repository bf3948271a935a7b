"""`recmesh bench windows`: what a hot item costs against a cold one, tiled and exact.

Writes, through the ingest's write path (services/feature/writer.py) into a real
redis-server, one item with `--hot-events` events (views with a rating) spread
over a 7-day window and 200 items with 10 events each; copies the hot item's
keys (DUMP/RESTORE: the state the write left, byte for byte) to `--items` hot
items; then times the feature look-up (FeatureStore.lookup: one user and the
items, as the feature service answers GetFeatures) of the hot items against the
cold ones and against the look-up's raw Redis round trip, in alternating
blocks. It prints the state one hot item holds and the ratios, for the
repository's windows kept as tiles (the default slide of a 7-day window: 3 h)
and kept exactly (`slide = "exact"`: every event a sorted-set member; its hot
items are `--exact-items`, fewer, as each holds its events).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.repository import FeatureSet, parse_feature_set
from recmesh.stats import percentile
from recmesh.tools.bench.common import emit, infrastructure

DAY = 86_400_000
REPOSITORY = """
[repository]
name = "windows-bench"

[events]
behaviors = ["view"]
values = ["rating"]

[realtime.views_7d]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "7d"{slide}

[realtime.mean_rating_7d]
entity = "item"
aggregate = "mean"
field = "rating"
behaviors = ["view"]
window = "7d"{slide}
default = 3.5

[recall.learnt]
enabled = false
"""


def feature_set(mode: str) -> FeatureSet:
    slide = '\nslide = "exact"' if mode == "exact" else ""
    return parse_feature_set(REPOSITORY.replace("{slide}", slide), Path(f"windows-{mode}/recmesh.toml"))


def _events(item: str, n: int, now_ms: int, rng: random.Random) -> list[Event]:
    out = [
        Event(event_id=f"{item}-{k}", user_id=f"u{rng.randrange(10_000)}", item_id=item, behavior="view",
              event_time=now_ms - rng.randrange(7 * DAY - 60_000),
              values={"rating": float(rng.randint(1, 5))})
        for k in range(n)
    ]  # fmt: skip
    out.sort(key=lambda e: e.event_time)
    return out


async def _item_keys(client: Any, fs: FeatureSet, item: str) -> list[str]:
    names = []
    for s in fs.streams_of("item"):
        names.append(keys.stream("item", item, s.id))
    names.append(keys.newest("item", item))
    return [k for k in names if await client.exists(k)]


async def _mode(
    client: Any, mode: str, hot_events: int, items: int, lookups: int, rng: random.Random
) -> dict[str, Any]:
    from services.feature.store import FeatureStore
    from services.feature.writer import EventWriter

    await client.flushdb()
    fs = feature_set(mode)
    store = FeatureStore(client, fs)
    writer = EventWriter(client, fs, store.offline.attributes)
    now = int(time.time() * 1000)
    hot = _events("hot0", hot_events, now, rng)
    t = time.perf_counter()
    for start in range(0, len(hot), 1000):
        await writer.apply(hot[start : start + 1000])
    write_s = time.perf_counter() - t
    held = await _item_keys(client, fs, "hot0")
    state_bytes = sum([int(await client.memory_usage(k) or 0) for k in held])
    for i in range(1, items):  # the same state under other item ids
        for k in held:
            dumped = await client.dump(k)
            await client.restore(
                k.replace(keys.entity_tag("item", "hot0"), keys.entity_tag("item", f"hot{i}")),
                0,
                dumped,
                replace=True,
            )
    cold = [e for i in range(items) for e in _events(f"cold{i}", 10, now, rng)]
    cold.sort(key=lambda e: e.event_time)
    for start in range(0, len(cold), 1000):
        await writer.apply(cold[start : start + 1000])
    await store.prepare()
    hot_ids, cold_ids = [f"hot{i}" for i in range(items)], [f"cold{i}" for i in range(items)]
    timings: dict[str, list[float]] = {"hot": [], "cold": [], "raw": []}
    # what a hot item's 7-day count reads (exact: the key's cap, [state] max_events_per_key, bounds it)
    served = (await store.lookup("u1", hot_ids[:1], now, timeout_s=60.0)).items[0]["views_7d"][0]
    for block in range(max(1, lookups // 10)):
        order = ["hot", "cold", "raw"] if block % 2 == 0 else ["raw", "cold", "hot"]
        for name in order:
            for _ in range(10):
                t = time.perf_counter()
                if name == "raw":
                    await store.read_raw("u1", cold_ids, now)
                else:
                    await store.lookup("u1", hot_ids if name == "hot" else cold_ids, now, timeout_s=60.0)
                timings[name].append((time.perf_counter() - t) * 1000)
    p50 = {k: percentile(v, 50) for k, v in timings.items()}
    return {
        "mode": mode, "hot_events": hot_events, "items": items,
        "write_events_per_s": round(hot_events / write_s), "state_bytes_hot_item": state_bytes,
        "hot_count_served": served,
        "lookup_p50_ms_hot": round(p50["hot"], 3), "lookup_p50_ms_cold": round(p50["cold"], 3),
        "raw_p50_ms": round(p50["raw"], 3), "hot_over_cold": round(p50["hot"] / p50["cold"], 2),
        "cold_over_raw": round(p50["cold"] / p50["raw"], 2),
    }  # fmt: skip


async def run(hot_events: int, items: int, exact_items: int, lookups: int) -> list[dict[str, Any]]:
    from recmesh.redis_client import connect

    async with infrastructure({}) as infra:
        client = connect(infra.redis_url, 8)
        try:
            rng = random.Random(7)
            return [
                await _mode(client, "tiled", hot_events, items, lookups, rng),
                await _mode(client, "exact", hot_events, exact_items, max(10, lookups // 10), rng),
            ]
        finally:
            await client.aclose()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "recmesh bench windows (one run): items with a 7-day count and mean; one user a look-up",
        f"{'windows':<8} {'hot items':>9} {'events each':>11} {'counted':>8} {'state/hot item':>15} "
        f"{'p50 hot ms':>10} "
        f"{'p50 cold ms':>11} {'hot/cold':>8} {'raw ms':>7} {'cold/raw':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r['mode']:<8} {r['items']:>9} {r['hot_events']:>11,} {r['hot_count_served']:>8,} "
            f"{r['state_bytes_hot_item']:>13,} B "
            f"{r['lookup_p50_ms_hot']:>10} {r['lookup_p50_ms_cold']:>11} {r['hot_over_cold']:>8} "
            f"{r['raw_p50_ms']:>7} {r['cold_over_raw']:>8}"
        )
    return "\n".join(lines)


def main(args: Any) -> int:
    rows = asyncio.run(run(args.hot_events, args.items, args.exact_items, args.lookups))
    emit({"modes": rows}, args.json, table(rows))
    return 0
