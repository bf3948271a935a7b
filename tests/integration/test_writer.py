"""The ingest write (one script on a single Redis) against the two-step write it replaces."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis

from recmesh.events import BEHAVIORS, Event
from recmesh.features import keys
from recmesh.features.definitions import STATE_TTL_S
from services.feature.recall_store import RecallStore
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter


@pytest.fixture
async def two_dbs(redis_url: str) -> AsyncIterator[tuple[redis.Redis, redis.Redis]]:
    base = redis_url.rsplit("/", 1)[0]
    a, b = redis.Redis.from_url(f"{base}/2", protocol=2), redis.Redis.from_url(f"{base}/3", protocol=2)
    for client in (a, b):
        await client.flushdb()
    yield a, b
    for client in (a, b):
        await client.flushdb()
        await client.aclose()


def _batches(seed: int) -> list[list[Event]]:
    """Batches as the consumer sees them: sorted by event time within a batch,
    out of order across batches, with redelivered events. Spread over 50 min:
    within the 1 h retention, as the consumer's `too_late` rule keeps it (past
    it, each path re-counts a redelivery once its mark is trimmed, and the two
    marks are trimmed at different moments)."""
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    events = [
        Event(event_id=f"e{n}", user_id=f"u{rng.randrange(40)}", item_id=f"i{rng.randrange(30)}",
              behavior=rng.choice(BEHAVIORS), event_time=now - rng.randrange(50 * 60_000))
        for n in range(3000)
    ]  # fmt: skip
    events.sort(key=lambda e: e.event_time + rng.randrange(-120_000, 120_000))
    events += rng.sample(events, 300)  # redeliveries, some in the same batch as the original
    batches = [events[i : i + 250] for i in range(0, len(events), 250)]
    return [sorted(b, key=lambda e: e.event_time) for b in batches]


async def _state(client: redis.Redis) -> dict[str, object]:
    out: dict[str, object] = {}
    async for raw in client.scan_iter(count=1000):
        key = raw.decode()
        if key.endswith(":covisit_marks"):
            continue
        kind = await client.type(key)
        if kind == b"string":  # indexes (item_newest) and the statics version: below
            continue
        if kind == b"zset":
            if not key.startswith("{catalog}"):  # offline popularity has no TTL
                assert await client.ttl(key) > 0, f"{key} has no TTL"
            out[key] = await client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = await client.hgetall(key)
    return out


async def test_the_one_script_write_equals_the_two_step_write(
    two_dbs: tuple[redis.Redis, redis.Redis],
) -> None:
    a, b = two_dbs
    statics = [(f"i{n}", {"category": f"c{n % 4}", "popularity": 1.0}) for n in range(30)]
    two_step = (FeatureStore(a), RecallStore(a))
    writer = EventWriter(FeatureStore(b), RecallStore(b))
    await two_step[0].load_offline([], statics)
    await FeatureStore(b).load_offline([], statics)
    counted_a = counted_b = 0
    batches = _batches(7)
    for batch in batches:
        await two_step[0].apply_events(batch)
        counted_a += await two_step[1].apply_covisitation(batch)
        counted_b += await writer.apply(batch)
    assert counted_a == counted_b > 1000
    state_a, state_b = await _state(a), await _state(b)
    assert sorted(state_a) == sorted(state_b)
    assert state_a == state_b
    assert any(k.endswith(":covisits") for k in state_b)
    assert not [k async for k in b.scan_iter(match="*:covisit_marks")]

    # The one-script write also keeps each item's newest event time for look-ups.
    for n in range(30):
        tops = [
            await b.zrange(key, -1, -1, withscores=True)
            for key in (keys.item_clicks(f"i{n}"), keys.item_views(f"i{n}"))
        ]
        newest = max((int(top[0][1]) for top in tops if top), default=None)
        held = await b.get(keys.item_newest(f"i{n}"))
        assert (int(held) if held is not None else None) == newest, f"i{n}"
        if held is not None:
            assert 0 < await b.ttl(keys.item_newest(f"i{n}")) <= STATE_TTL_S

    # Everything again, as after a crash before the commit: nothing changes.
    for batch in batches:
        assert await writer.apply(batch) == 0
    assert await _state(b) == state_b
